"""Consume-queue units rebuilt from the commit log, in memory, for the queues that have no consume-queue files.

A consume queue is derived data: RocketMQ's dispatch (``CommitLog`` → ``ConsumeQueue.putMessagePositionInfo``,
in its reput thread and again in its recovery) writes, for each record, a 20-byte unit (commit-log offset,
size, tag hash) to the record's queue. A store copied without its ``consumequeue/`` directory still holds
every record; ``CommitLogDispatch`` does that dispatch for a follower, in memory: one scan of the commit
log, a run of records at a time through the batch record engine (``tieredstore.local.batch``), remembering
where it stopped so that each later call reads only what is new. The follower starts it where the other
queues' units end, as RocketMQ's recovery starts its dispatch (``position``; the first file when none).

Only records the writer's checkpoint says are flushed are dispatched (``FlushedBound``): a record past it
may still be torn, or taken back by a crash, and a unit in memory is never rewritten the way a broker's
recovery rewrites its files. Each dispatched record is checked as a follower checks any record it serves
(``followed_problems``); a record that does not check out stops the scan there until it does. As in
RocketMQ, prepared and rolled-back transaction messages are not dispatched. A queue whose consume-queue
directory holds files when the scan first meets it keeps its files; the choice holds for the scan's life.

A queue's units are laid out as a consume-queue file's, in an anonymous mapping, so that a follower reads
them as it reads a file. They cost 20 bytes of memory per message still in the hot store: units whose
records retention deleted are dropped.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable, Sequence

import numpy as np
import structlog

from tieredstore.basics import QueueKey
from tieredstore.errors import ValidationError
from tieredstore.formats.arrays import UNIT_DTYPE, gather_rows
from tieredstore.formats.consume_queue import UNIT_SIZE, UNIT_STRUCT
from tieredstore.formats.message import (
    BLANK_HEADER,
    MAGIC_BLANK,
    MAGIC_V1,
    MAGIC_V2,
    MIN_RECORD_SIZE,
    SYSFLAG_TRANSACTION_MASK,
    SYSFLAG_TRANSACTION_PREPARED,
    SYSFLAG_TRANSACTION_ROLLBACK,
    split_back_to_back,
    store_timestamp_of,
)
from tieredstore.formats.naming import validate_topic
from tieredstore.formats.records import HEAD_BYTES, Layout
from tieredstore.local.batch import (
    HotBatch,
    MappedRegion,
    build,
    followed_problems,
    record_tag_hashes,
)
from tieredstore.local.checkpoint import FlushedBound
from tieredstore.local.mapped_file import release_mapped_pages

log = structlog.get_logger(__name__)

# A run is at most this many records or bytes (or one record, however large): what one pass copies and checks.
RUN_RECORDS = 4096
RUN_BYTES = 4 << 20
_FIRST_CAPACITY = 1024 * UNIT_SIZE


class RebuiltUnits:
    """One queue's rebuilt units, queue offsets ``[first, end)``, back to back from byte 0 of ``buffer``."""

    __slots__ = ("_buffer", "count", "first")

    def __init__(self, first: int) -> None:
        self.first = first
        self.count = 0
        self._buffer = mmap.mmap(-1, _FIRST_CAPACITY)

    @property
    def end(self) -> int:
        """The queue offset the next unit will have."""
        return self.first + self.count

    @property
    def buffer(self) -> mmap.mmap:
        """The units as a consume-queue file lays them out; replaced when it grows or drops units."""
        return self._buffer

    def restart_at(self, queue_offset: int) -> None:
        """Make ``queue_offset`` the next unit's, holding none (a queue whose earlier records are gone)."""
        self.first, self.count = queue_offset, 0

    def append(self, units: np.ndarray) -> None:
        """Units (UNIT_DTYPE) of the queue offsets from ``end`` on."""
        used = self.count * UNIT_SIZE
        needed = used + len(units) * UNIT_SIZE
        if needed > len(self._buffer):
            self._replace(0, max(needed, 2 * len(self._buffer)))
        self._buffer[used:needed] = units.tobytes()
        self.count += len(units)

    def drop_below(self, commitlog_offset: int) -> None:
        """Forget the units whose records lie below ``commitlog_offset``: retention deleted their files."""
        if not self.count or UNIT_STRUCT.unpack_from(self._buffer, 0)[0] >= commitlog_offset:
            return
        units = np.frombuffer(self._buffer, dtype=UNIT_DTYPE, count=self.count)
        dropped = int(np.searchsorted(units["commitlog_offset"], commitlog_offset))
        del units  # the mapping cannot be closed while an array still views it
        self.first += dropped
        self.count -= dropped
        self._replace(dropped * UNIT_SIZE, max(_FIRST_CAPACITY, 2 * self.count * UNIT_SIZE))

    def _replace(self, keep_from: int, capacity: int) -> None:
        """Move the units from byte ``keep_from`` on into a new mapping of ``capacity`` bytes."""
        fresh = mmap.mmap(-1, capacity)
        fresh[: self.count * UNIT_SIZE] = self._buffer[keep_from : keep_from + self.count * UNIT_SIZE]
        self._buffer.close()
        self._buffer = fresh

    def close(self) -> None:
        self._buffer.close()


class CommitLogDispatch:
    """The in-memory dispatch of a followed commit log into the queues without consume-queue files."""

    def __init__(self, has_files: Callable[[str, int], bool]) -> None:
        # Whether a queue has consume-queue files: asked once per queue, when the scan first meets it.
        self._has_files = has_files
        self.queues: dict[QueueKey, RebuiltUnits] = {}
        self._rebuilds: dict[QueueKey, bool] = {}  # each queue met so far: whether it is rebuilt here
        self._not_topics: set[bytes] = set()
        # The commit-log offset the scan goes on from; None before the first scan.
        self.position: int | None = None
        self._stalled_at: int | None = None

    def advance(self, files: Sequence[MappedRegion], flushed: FlushedBound) -> set[QueueKey]:
        """Dispatch the flushed records from the scan position on, across ``files`` (the commit log's,
        in offset order); returns the queues given units."""
        grown: set[QueueKey] = set()
        if not files:
            return grown
        if self.position is None or self.position < files[0].start_offset:
            # Retention deleted what the scan had not reached: a queue's next record may come later than
            # the end of its units, which then restart there (see _dispatch).
            self.position = files[0].start_offset
            for units in self.queues.values():
                units.drop_below(self.position)
        while (run := self._next_run(files, flushed)) is not None:
            taken = self._dispatch(run, grown)
            if taken == 0:
                break
            self.position = int(run.units["commitlog_offset"][taken - 1]) + int(run.units["size"][taken - 1])
        return grown

    def _next_run(self, files: Sequence[MappedRegion], flushed: FlushedBound) -> HotBatch | None:
        """The whole, flushed records from the scan position, moving past a file's blank end; None when
        there is none (yet)."""
        assert self.position is not None
        while True:
            file = _holding(files, self.position)
            if file is None:
                return None
            local = self.position - file.start_offset
            available = file.end_offset - self.position
            if available < BLANK_HEADER.size:
                return None
            size, magic = BLANK_HEADER.unpack_from(file.buffer, local)
            if magic == MAGIC_BLANK:
                self.position = file.end_offset
                continue
            if size < MIN_RECORD_SIZE or size > available or magic not in (MAGIC_V1, MAGIC_V2):
                return None  # nothing written here yet
            stamp = store_timestamp_of(file.buffer[local : local + min(size, HEAD_BYTES)])
            if not flushed.covers(np.array([self.position + size]), np.array([stamp]))[0]:
                return None  # not flushed yet: nothing to copy
            with memoryview(file.buffer) as view:
                data = bytearray(view[local : local + max(size, min(available, RUN_BYTES))])
            # Slices of a mapping are copies: the pages behind the scan may go (a follower reads each once).
            release_mapped_pages(file.buffer, local, local + len(data))
            with memoryview(data) as records:
                ends = np.asarray(split_back_to_back(records, RUN_RECORDS), dtype=np.int64)
            del data[int(ends[-1]) :]
            units = np.zeros(len(ends) - 1, dtype=UNIT_DTYPE)
            units["commitlog_offset"] = self.position + ends[:-1]
            units["size"] = np.diff(ends)
            run = build("", -1, 0, units, data)
            ending = units["commitlog_offset"].astype(np.int64) + run.sizes
            covered = flushed.covers(ending, run.store_timestamps)
            durable = len(units) if bool(covered.all()) else int(np.argmin(covered))
            return _first(run, durable) if durable else None

    def _dispatch(self, run: HotBatch, grown: set[QueueKey]) -> int:
        """Append the run's records to their rebuilt queues, up to the first that does not check out;
        returns how many records of the run that covers."""
        layout = Layout.of(run)
        heads = run.heads
        sound = layout.sound & (heads["physical_offset"] == run.units["commitlog_offset"])
        taken = len(run) if bool(sound.all()) else int(np.argmin(sound))
        keys, groups = _queue_keys(run, layout, taken)
        transaction = heads["sysflag"] & SYSFLAG_TRANSACTION_MASK
        dispatched = (transaction != SYSFLAG_TRANSACTION_PREPARED) & (transaction != SYSFLAG_TRANSACTION_ROLLBACK)
        rebuilt: list[tuple[QueueKey, np.ndarray]] = []
        for group, (topic_raw, queue_id) in enumerate(keys):
            key = self._rebuilt_key(topic_raw, queue_id)
            if key is not None:
                members = np.flatnonzero((groups == group) & dispatched[:taken])
                if len(members):
                    rebuilt.append((key, members))
        checked: list[tuple[QueueKey, HotBatch, np.ndarray]] = []
        for key, members in rebuilt:
            units = self.queues.get(key)
            first = int(heads["queue_offset"][members[0]])
            # A queue starts at its first record met, and starts again after a gap only once retention
            # dropped all its units (records the scan never reached are gone); otherwise a gap is a problem.
            expected = first if units is None or (units.count == 0 and first > units.end) else units.end
            batch = _members(run, key, expected, members)
            batch.units["tag_hash"] = record_tag_hashes(batch, Layout.of(batch).properties_at, len(batch))
            bad = followed_problems(batch, key[0].encode("utf-8"))
            if bad is not None:
                taken = min(taken, int(members[bad]))
            checked.append((key, batch, members))
        if taken < len(run):
            self._say_stalled(run, taken)
        for key, batch, members in checked:
            keep = int(np.searchsorted(members, taken))
            if keep == 0:
                continue
            units = self.queues.get(key)
            if units is None:
                units = self.queues[key] = RebuiltUnits(batch.first_offset)
            elif batch.first_offset != units.end:
                units.restart_at(batch.first_offset)
            units.append(batch.units[:keep])
            grown.add(key)
        return taken

    def _rebuilt_key(self, topic_raw: bytes, queue_id: int) -> QueueKey | None:
        """The (topic, queue id) when its records are dispatched here; None for a queue with files or a
        record naming no valid topic."""
        if topic_raw in self._not_topics:
            return None
        try:
            topic = validate_topic(topic_raw.decode("utf-8"))
        except (UnicodeDecodeError, ValidationError):
            self._not_topics.add(topic_raw)
            log.warning("commit-log records name no valid topic; not dispatched", topic=repr(topic_raw))
            return None
        key = (topic, queue_id)
        rebuilds = self._rebuilds.get(key)
        if rebuilds is None:
            rebuilds = self._rebuilds[key] = queue_id >= 0 and not self._has_files(topic, queue_id)
            if rebuilds:
                log.info("rebuilding a queue's units from the commit log", topic=topic, queue_id=queue_id)
        return key if rebuilds else None

    def _say_stalled(self, run: HotBatch, taken: int) -> None:
        at = int(run.units["commitlog_offset"][taken])
        if at != self._stalled_at:
            self._stalled_at = at
            log.warning(
                "a commit-log record does not check out; queues rebuilt from the commit log wait there",
                commitlog_offset=at,
            )

    def close(self) -> None:
        for units in self.queues.values():
            units.close()
        self.queues.clear()


def _holding(files: Sequence[MappedRegion], offset: int) -> MappedRegion | None:
    index = int(np.searchsorted([file.start_offset for file in files], offset, side="right")) - 1
    if index < 0 or offset >= files[index].end_offset:
        return None
    return files[index]


def _first(run: HotBatch, count: int) -> HotBatch:
    """The run's first ``count`` records."""
    if count == len(run):
        return run
    return HotBatch(
        run.topic,
        run.queue_id,
        run.first_offset,
        run.data,
        run.units[:count],
        run.starts[:count],
        run.heads[:count],
        run.store_timestamps[:count],
    )


def _members(run: HotBatch, key: QueueKey, first_offset: int, members: np.ndarray) -> HotBatch:
    """The records ``members`` of a run, as the batch of queue ``key`` from ``first_offset`` they should be."""
    return HotBatch(
        key[0],
        key[1],
        first_offset,
        run.data,
        run.units[members],
        run.starts[members],
        run.heads[members],
        run.store_timestamps[members],
    )


def _queue_keys(run: HotBatch, layout: Layout, count: int) -> tuple[list[tuple[bytes, int]], np.ndarray]:
    """The distinct (topic bytes, queue id) of the run's first ``count`` records, and each record's index
    among them: one sort of fixed-width rows, however many records."""
    if count == 0:
        return [], np.zeros(0, dtype=np.int64)
    lengths = layout.topic_length[:count]
    width = max(1, int(lengths.max()))
    flat = np.frombuffer(run.data, dtype=np.uint8)
    names = gather_rows(flat, run.starts[:count] + layout.topic_at[:count], width)
    names = np.where(np.arange(width) < lengths[:, None], names, 0).astype(np.uint8)
    rows = np.concatenate(
        (
            run.heads["queue_id"][:count].astype(">i4").view(np.uint8).reshape(count, 4),
            lengths.astype(">i2").view(np.uint8).reshape(count, 2),
            names,
        ),
        axis=1,
    )
    distinct, first_of, groups = np.unique(
        np.ascontiguousarray(rows).view(f"V{width + 6}").reshape(count), return_index=True, return_inverse=True
    )
    keys = [
        (bytes(names[index, : int(lengths[index])]), int(run.heads["queue_id"][index])) for index in first_of.tolist()
    ]
    assert len(keys) == len(distinct)
    return keys, groups.reshape(count)
