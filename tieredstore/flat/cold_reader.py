"""One cold reader of a queue: windows of checked records from a queue offset, and the windows after them
read ahead of their reader.

A window is up to ``window_count`` records from a queue offset, trimmed from the end to ``window_bytes``
bytes but never below one record, and never past the end of the storage object (an S3 chunk) holding
its first record, so a reader going through a queue reads each object once, whole, with one request
(``FileSegment.read_from``). A window that follows the last one read of its queue is one commit-log
read from where that one ended: a queue's cold commit log holds its records back to back in
queue-offset order, so they are split by TOTALSIZE, with no consume-queue read. So is a window at the
queue's oldest record, read from the commit log's start, where that record almost always is. Any other
window (a reader's first, or one after a jump) reads its consume-queue units first, then the commit log
they point at; so does a following window whose records do not check out (offsets lost in between,
damage), so that the consume queue has the last word. Every record is checked once, when its window is
read (``served.check_window``; for a reader that checks records itself, only located: ``served.located_window``).
A read never crosses offsets recorded as lost (``run_end``); ``windows`` reports them as a ``LostRange``
between the windows around them.

Callers: the fetcher reads through ``window`` (with its cache and a ``PrefetchPool``); a batch reader
(restore, the CLI's ``read``/``tail``, a Spark partition) through ``read`` or ``windows``, without either.
A batch reader that bounds its memory passes a ``ReadBudget``: each commit-log read waits until its bytes
fit in it, and holds them there until the caller gives them back.

**Prefetching.** Given a ``PrefetchPool`` (one per reading process: one byte budget over its queues),
the windows after one read for a reader going through the queue are read in the background,
``PREFETCH_DEPTH`` ahead of it, while the cache, with the windows in flight or held, stays under its
bypass threshold. Each window's read starts the next one's as soon as it has been split, before its
records are checked, so a reader keeps a request in flight instead of waiting for one check after each
read (a split whose window then fails its check cancels what it started). The reader who reaches a
window takes it (waiting if it is still in flight; its read error, if any, is raised to that reader);
a reader who goes elsewhere cancels them.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import structlog

from tieredstore.errors import NotFoundError, SegmentNotFoundError
from tieredstore.flat.gil_handoff import GilHandoff
from tieredstore.flat.message_file import FlatMessageFile
from tieredstore.flat.read_budget import UNBOUNDED, ReadBudget
from tieredstore.flat.served import ReadAheadBatch, check_window, located_window, parse_units
from tieredstore.formats.arrays import UNIT_DTYPE
from tieredstore.formats.consume_queue import UNIT_SIZE
from tieredstore.formats.message import MIN_RECORD_SIZE, split_back_to_back
from tieredstore.formats.naming import FileType

log = structlog.get_logger(__name__)

# Above this share of its bound, a cache takes no new windows, and nothing more is read ahead.
CACHE_BYPASS_RATIO = 0.8
# Windows of a queue read ahead of the one its reader is in: the next one's read starts as soon as the
# read before it has been split, so a reader going through a queue keeps one request in flight.
PREFETCH_DEPTH = 2
# While prefetches are in flight, a call served from the cache hands the GIL to worker threads at most this often.
_PREFETCH_YIELD_INTERVAL = 0.001


@dataclass(slots=True)
class FollowPoint:
    """Where the record at ``offset`` lies in the cold commit log, for a window that follows the one before."""

    offset: int
    commitlog_offset: int
    record_bytes: float  # the mean record size of the window before, to size the next read


def follow_after(batch: ReadAheadBatch) -> FollowPoint:
    """Where the record after a (non-empty) window lies in the cold commit log."""
    first, last = batch.starts[0], batch.ends[-1]
    return FollowPoint(batch.end_offset, batch.commitlog_start + last, (last - first) / len(batch))


# Told where the record after a window lies (and the window's size) once its read is split; whether it
# started a read there.
OnSplit = Callable[[FollowPoint, int], bool]
# Counts one range read sent to cold storage, by the file it read.
CountRead = Callable[[FileType], None]
# Told where the record after a window lies (and the window's size) once its read is split.
_SplitDone = Callable[[FollowPoint, int], Awaitable[None]]


def _no_count(_file_type: FileType) -> None:
    return None


@dataclass(frozen=True, slots=True)
class LostRange:
    """Queue offsets [start, end) the hot store lost before they were archived: no record holds them."""

    start: int
    end: int


@dataclass(frozen=True, slots=True)
class ColdReadOptions:
    """How large a window is, and how a reader's prefetches behave."""

    window_count: int  # records a window holds at most
    window_bytes: int  # bytes a window holds at most (never below one record)
    ttl: float = 15.0  # windows read ahead that nobody came for within this many seconds are dropped
    # False for a reader that checks every record in full itself: records are only located (``located_window``)
    check_records: bool = True


class WindowCache(Protocol):
    """What the cold reader needs of the cache its windows go into (``read.cache.ReadAheadCache``)."""

    max_bytes: int
    clock: Callable[[], float]

    @property
    def size_bytes(self) -> int: ...

    def over_threshold(self) -> bool: ...

    def put(self, batch: ReadAheadBatch) -> None: ...


@dataclass(slots=True)
class _Prefetch:
    """A window of one queue ahead of its reader, being read (or read) before the reader asks for it."""

    start: FollowPoint  # its first offset and where that record lies in the cold commit log
    reserved_bytes: int  # counted against the cache's budget until the reader takes it
    started: float
    run_end: int  # the end of the archived run it is in: no window is read ahead past it
    task: asyncio.Task[ReadAheadBatch | None] = field(init=False)
    # Where the window after it begins, known once its read is split (before its records are checked).
    after: FollowPoint | None = None

    @property
    def offset(self) -> int:
        return self.start.offset


class PrefetchPool:
    """The windows read ahead for every queue of one reading process, within one byte budget.

    The bytes of every window read ahead (each estimated by the window before it) and of windows being
    read now by readers that started one ahead, plus the cache's, stay within the cache's bypass
    threshold.
    """

    def __init__(self, cache: WindowCache) -> None:
        self.cache = cache
        self.ahead: dict[tuple[str, int], ColdQueueReader] = {}  # the queues with windows read ahead
        self.prefetch_bytes = 0
        self.pending_bytes = 0  # windows being read by their readers that have started one ahead, until cached
        self.in_flight = 0  # prefetches still reading
        self.unstarted: set[asyncio.Task[ReadAheadBatch | None]] = set()  # prefetches yet to send their read
        self.all_started = asyncio.Event()  # set while ``unstarted`` is empty
        self.all_started.set()
        self.last_yield = 0.0  # when a reader last handed the GIL over to them (time.monotonic)
        self.handoff = GilHandoff()
        self.closed = False

    def room_for(self, expected_bytes: int) -> bool:
        budget = CACHE_BYPASS_RATIO * self.cache.max_bytes
        return self.cache.size_bytes + self.prefetch_bytes + self.pending_bytes + expected_bytes <= budget

    def drop_stale(self, now: float, ttl: float) -> None:
        """Cancel the windows of each queue whose first one read ahead nobody came for within ``ttl``."""
        for reader in list(self.ahead.values()):
            if reader.prefetches and now - reader.prefetches[0].started > ttl:
                reader.forget_prefetches()

    def cancel(self, reader: ColdQueueReader, prefetches: list[_Prefetch]) -> None:
        """Cancel windows ``reader`` no longer holds ahead, giving back their budget."""
        for prefetch in prefetches:
            self.prefetch_bytes -= prefetch.reserved_bytes
            prefetch.task.cancel()
        self.settle(reader)

    def settle(self, reader: ColdQueueReader) -> None:
        """Forget ``reader``'s queue once it holds no window ahead."""
        if not reader.prefetches:
            self.ahead.pop(reader.key, None)

    async def yield_to_prefetches(self) -> None:
        """While prefetches are in flight, hand the GIL to their worker threads now and then (a call served
        from the cache never waits, so they would not progress otherwise: ``GilHandoff`` says why).

        Not on every call: a hand-off costs more than serving a few cached messages.
        """
        if not self.in_flight:
            return
        now = time.monotonic()
        if now - self.last_yield >= _PREFETCH_YIELD_INTERVAL:
            self.last_yield = now
            await self.handoff()

    async def until_started(self) -> None:
        """Until every prefetch started has run up to its first wait: its read, handed to storage (a prefetch
        whose read completes at once may start the next one in the same turn, which is waited for too)."""
        while self.unstarted:  # one that began may have started another before this waiter woke
            await self.all_started.wait()

    def begin(self, task: asyncio.Task[ReadAheadBatch | None]) -> None:
        self.unstarted.discard(task)
        if not self.unstarted:
            self.all_started.set()

    def done(self, task: asyncio.Task[ReadAheadBatch | None]) -> None:
        self.in_flight -= 1
        self.begin(task)  # for one cancelled before it ran
        if not task.cancelled() and task.exception() is not None:
            # Seen here so that it is never reported as lost: its reader gets it from the task, or reads again.
            log.debug("prefetch failed; its reader will get the error", error=str(task.exception()))

    @property
    def prefetching(self) -> int:
        """How many windows are being prefetched or held for their reader."""
        return sum(len(reader.prefetches) for reader in self.ahead.values())

    def tasks(self) -> list[asyncio.Task[ReadAheadBatch | None]]:
        return [prefetch.task for reader in self.ahead.values() for prefetch in reader.prefetches]

    async def wait(self) -> None:
        """Wait until every prefetch started has finished, the ones they started in turn too."""
        while tasks := [task for task in self.tasks() if not task.done()]:
            await asyncio.wait(tasks)

    async def close(self) -> None:
        """Cancel the prefetches in flight and wait for them; no prefetch starts afterwards."""
        self.closed = True
        tasks = self.tasks()
        for reader in list(self.ahead.values()):
            reader.forget_prefetches()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.handoff.close()


class ColdQueueReader:
    """Reads one queue's cold windows (see the module docstring) from ``flat_file``.

    The reader keeps where the queue's next record lies (``follow``), where its last window ended
    (``window_end``) and its windows read ahead, across replacements of ``flat_file`` (a recovered
    queue, a refreshed read-only view): the caller sets the current one. Without a ``pool`` nothing is
    read ahead and nothing is cached.
    """

    def __init__(
        self,
        flat_file: FlatMessageFile,
        options: ColdReadOptions,
        *,
        pool: PrefetchPool | None = None,
        count_read: CountRead = _no_count,
    ) -> None:
        self.flat_file = flat_file
        self.key = (flat_file.topic, flat_file.queue_id)
        self.options = options
        self.pool = pool
        self.count_read = count_read
        self.follow: FollowPoint | None = None
        self.window_end: int | None = None
        self.prefetches: list[_Prefetch] = []  # in offset order: each begins where the one before it ends

    # ---- what is archived -----------------------------------------------------------------------------

    def run_end(self, offset: int) -> int:
        """Where a read from ``offset`` stops: the end of the archived run holding it (lost offsets or the
        archived offset follow); ``offset`` itself when it is not archived."""
        try:
            return min(self.flat_file.archived_offset, self.flat_file.archived_run_end(offset))
        except NotFoundError:
            return offset

    def next_archived(self, offset: int) -> int:
        """``offset`` if it is archived (or at the end), else the first archived offset after the lost ones."""
        return self.flat_file.next_archived_offset(offset)

    # ---- windows --------------------------------------------------------------------------------------

    async def read(
        self, offset: int, count: int | None = None, *, budget: ReadBudget = UNBOUNDED
    ) -> ReadAheadBatch | None:
        """Up to ``count`` (``window_count``) checked records from ``offset``, not past its archived run:
        one window, read now; None if there is none (``offset`` lost or past the end).

        The window's commit-log bytes are held in ``budget`` (acquired before they are read) until the
        caller releases them; a read that yields no window gives back what it took.
        """
        count = min(self.options.window_count if count is None else count, self.run_end(offset) - offset)
        if count <= 0:
            return None
        return await self._read_records(self.flat_file, offset, count, budget=budget)

    async def windows(
        self, start: int, end: int, count: int | None = None, *, budget: ReadBudget = UNBOUNDED
    ) -> AsyncIterator[ReadAheadBatch | LostRange]:
        """The windows of up to ``count`` (``window_count``) records from ``start`` to ``end`` (or the archived
        offset) in order, with a ``LostRange`` where offsets were recorded as lost instead of archived.

        Its window is a caller's to keep: the reader holds on only to where the next record lies, so a
        caller going on from a window's end reads on without a consume-queue read. Each window's bytes are
        held in ``budget`` as ``read`` says; the next window is read only when the caller asks for it.
        """
        low = self.flat_file.min_offset
        if start < low:
            raise NotFoundError(f"offset {start} of {self.key[0]}/{self.key[1]} is below the cold min offset {low}")
        offset = start
        while offset < end:
            archived = self.next_archived(offset)
            if archived != offset:
                yield LostRange(offset, min(archived, end))
                offset = min(archived, end)
                continue
            wanted = min(self.options.window_count if count is None else count, end - offset)
            window = await self.read(offset, wanted, budget=budget)
            if window is None:
                return
            yield window
            offset = window.end_offset

    async def window(
        self, offset: int, end: int, needed: int, run_end: int, *, use_cache: bool
    ) -> ReadAheadBatch | None:
        """The window of records from ``offset`` (before ``end``): the one prefetched for it, else one read
        now; None if empty. ``needed`` records at least, a whole window when it goes into the cache.

        A window read for the cache is cached. For a reader going through the queue (this is its first
        window, or one following the last) the windows after it are read ahead, not for one jumping about,
        whose next window would be read for nothing.
        """
        pool = self.pool
        cache = None if pool is None else pool.cache
        bypass = not use_cache or cache is None or cache.over_threshold()
        count = min(needed if bypass else max(needed, self.options.window_count), end - offset)
        if count <= 0:
            return None
        flat_file = self.flat_file
        sequential = not bypass and (self.window_end is None or self.window_end == offset)
        batch = await self.take_prefetch(offset) if use_cache else None
        if batch is None:
            pending = 0

            def split(after: FollowPoint, size: int) -> bool:
                # The next window's read starts before this one is checked. Until this one is cached, its
                # bytes count against the read-ahead budget as a prefetched window's do.
                nonlocal pending
                assert pool is not None
                pool.pending_bytes += size - pending
                pending = size
                return self._read_ahead(flat_file, after, run_end, size)

            try:
                batch = await self._read_records(flat_file, offset, count, on_split=split if sequential else None)
                if batch is not None and cache is not None and not bypass:
                    cache.put(batch)
            finally:
                if pool is not None:
                    pool.pending_bytes -= pending
            if batch is None:
                return None
        elif cache is not None and not bypass:
            cache.put(batch)
        if sequential:
            # Keep the queue's windows ahead coming: the one after this, or after the last one read ahead
            # (once that one's read has been split; until then, that read starts the next itself).
            ahead = self.prefetches
            after, expected = (
                (ahead[-1].after, ahead[-1].reserved_bytes) if ahead else (follow_after(batch), len(batch.data))
            )
            if after is not None and self._read_ahead(flat_file, after, run_end, expected) and pool is not None:
                await pool.until_started()  # its read is sent now, not once the window in hand has been served
        if not bypass:
            self.window_end = batch.end_offset
        return batch

    async def _read_records(
        self,
        flat_file: FlatMessageFile,
        offset: int,
        count: int,
        *,
        follow: FollowPoint | None = None,
        on_split: OnSplit | None = None,
        budget: ReadBudget = UNBOUNDED,
    ) -> ReadAheadBatch | None:
        """Up to ``count`` checked records from ``offset``, trimmed from the end to ``window_bytes`` (never
        below one): following the last window (or ``follow``), or from the commit log's start at the
        queue's oldest record, else by its consume-queue units.

        ``on_split`` is told where the record after the window lies as soon as the read has been split,
        before its records are checked; when it has started a read there, that read is handed off.
        """
        if follow is None or follow.offset != offset:
            follow = self.follow
        if (follow is None or follow.offset != offset) and offset == flat_file.min_offset:
            # A reader starting at the oldest record: it most likely starts the commit log.
            guess = flat_file.first_record_guess()
            follow = None if guess is None else FollowPoint(offset, guess[0], guess[1])
        window_bytes = self.options.window_bytes
        check = check_window if self.options.check_records else located_window

        async def split_done(after: FollowPoint, size: int) -> None:
            if on_split is not None and on_split(after, size) and self.pool is not None:
                await self.pool.until_started()

        batch = None
        if follow is not None and follow.offset == offset:
            batch = await _read_following(
                flat_file, offset, count, follow, window_bytes, self.count_read, split_done, budget, check
            )
            if batch is None and on_split is not None:
                # Where the split put the next record did not check out: what it started reading goes too.
                self.drop_ahead(offset)
        if batch is None:
            batch = await _read_by_units(
                flat_file, offset, count, window_bytes, self.count_read, split_done, budget, check
            )
        if batch is not None and len(batch):
            self.follow = follow_after(batch)
        return batch

    # ---- prefetching the windows ahead ----------------------------------------------------------------

    def _read_ahead(self, flat_file: FlatMessageFile, after: FollowPoint, run_end: int, expected_bytes: int) -> bool:
        """Start reading the window at ``after`` in the background, if the queue's windows read ahead end
        there and are fewer than ``PREFETCH_DEPTH`` (whether it started).

        The window must exist and fit the pool's byte budget. A queue's windows read ahead that nobody
        came for within ``ttl`` are dropped when the next one starts.
        """
        pool, ahead = self.pool, self.prefetches
        if pool is None or len(ahead) >= PREFETCH_DEPTH or (ahead and ahead[-1].after != after):
            return False
        if after.offset >= run_end or pool.closed:
            return False
        now = pool.cache.clock()
        pool.drop_stale(now, self.options.ttl)
        if not pool.room_for(expected_bytes):
            return False
        prefetch = _Prefetch(after, expected_bytes, now, run_end)
        prefetch.task = asyncio.create_task(self._prefetch(flat_file, prefetch))
        pool.in_flight += 1
        pool.unstarted.add(prefetch.task)
        pool.all_started.clear()
        prefetch.task.add_done_callback(pool.done)
        self.prefetches.append(prefetch)
        pool.ahead[self.key] = self
        pool.prefetch_bytes += expected_bytes
        return True

    async def _prefetch(self, flat_file: FlatMessageFile, prefetch: _Prefetch) -> ReadAheadBatch | None:
        """A prefetched window's read; once it is split, the window after it is read ahead in turn."""
        assert self.pool is not None  # only a reader with a pool reads ahead
        self.pool.begin(prefetch.task)

        def split(after: FollowPoint, _size: int) -> bool:
            prefetch.after = after
            return self._read_ahead(flat_file, after, prefetch.run_end, prefetch.reserved_bytes)

        count = min(self.options.window_count, prefetch.run_end - prefetch.offset)
        return await self._read_records(flat_file, prefetch.offset, count, follow=prefetch.start, on_split=split)

    async def take_prefetch(self, offset: int) -> ReadAheadBatch | None:
        """The window prefetched for ``offset`` (waiting for it; its read error is raised here), else None.

        When the queue's first window read ahead is not at ``offset`` (the reader went elsewhere), they
        are all cancelled.
        """
        ahead = self.prefetches
        if not ahead:
            return None
        if ahead[0].offset != offset:
            self.forget_prefetches()
            return None
        prefetch = ahead.pop(0)
        pool = self.pool
        assert pool is not None  # only a reader with a pool has windows read ahead
        pool.prefetch_bytes -= prefetch.reserved_bytes
        pool.settle(self)
        return await prefetch.task

    def drop_ahead(self, offset: int) -> None:
        """Cancel the queue's windows read ahead that begin after ``offset``."""
        kept = [prefetch for prefetch in self.prefetches if prefetch.offset <= offset]
        dropped = self.prefetches[len(kept) :]
        self.prefetches[:] = kept
        if self.pool is not None:
            self.pool.cancel(self, dropped)

    def forget_prefetches(self) -> None:
        """Cancel all the queue's windows read ahead."""
        dropped, self.prefetches = self.prefetches, []
        if self.pool is not None:
            self.pool.cancel(self, dropped)


async def _read_following(
    flat_file: FlatMessageFile,
    offset: int,
    count: int,
    follow: FollowPoint,
    window_bytes: int,
    count_read: CountRead,
    split_done: _SplitDone,
    budget: ReadBudget,
    check: Callable[..., ReadAheadBatch],  # check_window or located_window
) -> ReadAheadBatch | None:
    """The window from ``offset`` split out of the commit log from where the last window ended.

    The window check proves each record split by its TOTALSIZE is the message at its queue offset.
    None when that does not hold (offsets lost in between, a segment gone, a damaged record): the
    consume queue then says what is there.
    """
    # Records like the last window's fill the read exactly: an object store's read stops at the end of
    # the object anyway, and a larger read of a file would hold bytes the window does not use.
    wanted = min(window_bytes, max(MIN_RECORD_SIZE, math.ceil(follow.record_bytes * count)))
    held = await budget.acquire(wanted)
    try:
        data = await flat_file.commit_log.read_from(follow.commitlog_offset, wanted)
    except BaseException as error:
        await budget.release(held)
        if isinstance(error, NotFoundError | SegmentNotFoundError):
            return None
        raise
    count_read(FileType.COMMIT_LOG)
    bounds = np.asarray(split_back_to_back(data, count), dtype=np.int64)
    if len(bounds) < 2:
        await budget.release(held)
        return None
    records, split_end = len(bounds) - 1, int(bounds[-1])
    after = FollowPoint(offset + records, follow.commitlog_offset + split_end, split_end / records)
    await split_done(after, len(data))
    units = np.empty(records, dtype=UNIT_DTYPE)
    units["commitlog_offset"] = bounds[:-1] + follow.commitlog_offset
    units["size"] = np.diff(bounds)
    units["tag_hash"] = 0
    batch = check(
        flat_file.topic, flat_file.queue_id, offset, data, follow.commitlog_offset, units, tag_hashes_known=False
    )
    if batch.corrupt:
        await budget.release(held)
        return None
    return batch


async def _read_by_units(
    flat_file: FlatMessageFile,
    offset: int,
    count: int,
    window_bytes: int,
    count_read: CountRead,
    split_done: _SplitDone,
    budget: ReadBudget,
    check: Callable[..., ReadAheadBatch],  # check_window or located_window
) -> ReadAheadBatch | None:
    """The window from ``offset`` as its consume-queue units say: one read of each file."""
    consume_queue = flat_file.consume_queue
    position = consume_queue.position_of(offset)
    raw_units = await consume_queue.read_from(position, count * UNIT_SIZE)
    count_read(FileType.CONSUME_QUEUE)
    whole = len(raw_units) - len(raw_units) % UNIT_SIZE
    if not whole and raw_units:
        # The object holding this unit ends inside it (a commit split across objects): read it whole.
        raw_units = await consume_queue.read(position, UNIT_SIZE)
    elif whole < len(raw_units):
        raw_units = raw_units[:whole]
    units = parse_units(raw_units, f"{consume_queue.path}/{FileType.CONSUME_QUEUE.value}", position)
    if not len(units):
        return None
    sizes = units["size"].astype(np.int64)
    kept = max(1, int(np.searchsorted(np.cumsum(sizes), window_bytes, side="right")))
    units, sizes = units[:kept], sizes[:kept]
    start = int(units["commitlog_offset"][0])
    ends = units["commitlog_offset"].astype(np.int64) + sizes - start
    length = int(ends.max())
    held = await budget.acquire(length)
    try:
        data = await flat_file.commit_log.read_from(start, length)
        if len(data) < length:
            # The commit log's object ended first: keep the records it holds whole, else read exactly.
            cut = int(np.argmin(ends <= len(data)))  # the first record it cuts (the last one at least)
            if cut:
                units, ends = units[:cut], ends[:cut]
            else:
                data = await flat_file.read_commit_log(start, length)
    except BaseException:
        await budget.release(held)
        raise
    count_read(FileType.COMMIT_LOG)
    records, split_end = len(units), int(ends[-1])
    after = FollowPoint(offset + records, start + split_end, split_end / records)
    await split_done(after, len(data))
    return check(flat_file.topic, flat_file.queue_id, offset, data, start, units)
