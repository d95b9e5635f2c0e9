"""The read path: serve a queue's messages from the hot store or cold storage, with a read-ahead cache.

``MessageFetcher.get_messages`` decides the status from the queue's offsets over both tiers (RocketMQ's
``GetMessageStatus``), then routes the read by ``read_policy``:

==============  =========================================================================================
DISABLE         the hot store only; cold storage is never read and the offsets are the hot store's.
NOT_IN_DISK     cold storage exactly when the hot store no longer has the offset (the default).
NOT_IN_MEM      cold storage when the hot copy is probably not in the page cache (see below).
FORCE           cold storage always.
==============  =========================================================================================

If the cold read fails (a storage or integrity error) or cold storage does not hold the offset, and
the hot store still has it, the hot store serves it.

**NOT_IN_MEM on Linux.** Page-cache residency cannot be asked for from pure Python (no ``mincore``
or ``fincore`` binding, and ``os.posix_fadvise`` only gives advice), so the fetcher uses RocketMQ's own
rule of thumb (``DefaultMessageStore.checkInMemByCommitOffset``): the hot copy counts as in memory
when it lies within the newest ``hot_in_memory_bytes`` of the hot commit log, by default 40% of the
machine's physical memory (``accessMessageInMemoryMaxRatio``); anything older is assumed to have
left the page cache, and is served from cold storage when cold storage has it.

**Cold reads.** A miss reads a window of up to ``read_ahead_count`` messages, trimmed from the end to
``read_ahead_size`` bytes but never below one message, and never past the end of the storage object
(an S3 chunk) holding its first record, so a reader going through a queue reads each object once,
whole, with one request (``FileSegment.read_from``). A window that follows the last one read of its
queue is one commit-log read from where that one ended: a queue's cold commit log holds its records
back to back in queue-offset order, so they are split by TOTALSIZE, with no consume-queue read. So is
a window at the queue's oldest record, read from the commit log's start, where that record almost
always is (retention may have left older commit-log bytes behind; the check then fails). Any
other window (a reader's first, or one after a jump) reads its consume-queue units first, then the
commit log they point at; so does a following window whose records do not check out (offsets lost in
between, damage), so that the consume queue has the last word. Each record is checked once, when the
window is read (``flat.served.check_window``: size, magic, lengths, body CRC, topic, queue id and
queue offset, all records at once with numpy, one ``crc32`` per body). A record that fails keeps its
``CorruptRecordError`` naming its topic, queue and offset, raised to whoever asks for that offset;
a corrupt record further ahead does not fail an earlier batch. Serving is slicing only. A call that
goes on from where its queue's last call ended, inside the same cached window, is served from that
window without working out the queue's offsets, tiers and cached run again, while nothing they rest
on has changed (``read.state.Continuation``): the answer is the one the full path gives.

**Prefetching.** When a window is read for the cache, the windows after it in the same queue are read
in the background, two ahead of the reader (and only while the cache, with the windows in flight or
held, stays under its bypass threshold), unless the reader jumped there: a window that neither is the
queue's first read nor follows the last one read starts no prefetch. Each window's read starts the
next one's as soon as it has been split, before its records are checked, so a reader going through a
queue keeps a request in flight instead of waiting for one check after each read (a split whose
window then fails its check cancels what it started). The reader who reaches a window takes it
(waiting if it is still in flight; its read error, if any, is raised to that reader, and the next
call reads again), which starts the one after the last ahead; a reader who goes elsewhere cancels
them, and ``close`` cancels them all. A prefetched window counts a
miss when its reader reaches it, as a window read then would: the hit and miss metrics do not depend
on prefetching. While prefetches are in flight, a call served from the cache gives the event loop a
turn at most once a millisecond, after a 50 µs sleep that hands the GIL to the worker threads reading
them, so they progress even when every call is served from the cache.

**Read-ahead cache.** Each window is kept as one entry, a ``ReadAheadBatch`` (the commit-log bytes as
read, each record's place in them, the check's outcome), under (topic, queue, first offset): one cache
operation per read ahead, not per record. The cache is bounded in bytes (``read_ahead_cache_bytes``,
each batch weighing its bytes) and a batch expires ``read_ahead_ttl`` after its last access (a hit on
any of its records renews it); a batch whose last record has been served to ``read_ahead_readers``
readers (consumer groups) is released at once (``ReadAheadCache.read_through``). While the cache holds
more than 80% of its bound, misses read only what the request needs and add nothing to it. Hits and
misses are metrics, and so are evictions (by size or by age) and releases, counted in records.

**Decoding.** ``FetchedMessage.record`` decodes a record (hosts, properties) on first access, so a
consumer that wants the bytes or the body pays for no more. Hot records are checked as they are
served (``verify_served``), one by one.

**Cold-only readers** (``read_only_cold``: a store opened without its hot store, beside an archiver
that owns the cold queues) never recover a queue, since recovery truncates bytes a running archiver
may be about to record. Each queue is a read-only view (``FlatFileStore.open_read_only``), refreshed
from metadata when a call the policy serves from cold storage does not go on inside its cached window,
and when the max offset is asked for (its segment rows only when the queue's row changed), and wholly
once when a segment it names is gone: so later commits by another process are seen, and an offset the
archiver's retention removed is OFFSET_TOO_SMALL with the new min offset, even where the cache holds it
(a call going on inside the window its last call read is served from it for up to ``read_ahead_ttl``).

**Filters.** A ``MessageFilter`` keeps messages whose tag is one of ``tags`` (the consume-queue tag
hash is checked first where the window was read by its units, then the record's real TAGS, so a hash
collision is not a match) and for which
``predicate`` holds. Filtered-out messages still advance ``next_begin_offset``; one call scans at most
``max(max_count, read_ahead_count)`` offsets.

**Where it lives.** ``MessageFetcher`` is a facade: the cold windows, their check and their prefetching
are the cold reader of a queue (``tieredstore.flat.cold_reader``, ``tieredstore.flat.served``); result
types, the cache, the per-queue state, tier routing and each tier's read are in ``tieredstore.read``
(``results``, ``cache``, ``state``, ``routing``, ``tiers``, ``checks``). The names other modules import
from here are re-exported.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable

import structlog

from tieredstore.config import ReadPolicy, ReadSettings
from tieredstore.errors import IntegrityError, NotFoundError, SegmentNotFoundError, StorageError, ValidationError
from tieredstore.flat.cold_reader import CACHE_BYPASS_RATIO, ColdReadOptions, PrefetchPool
from tieredstore.flat.message_file import FlatMessageFile
from tieredstore.flat.served import ReadAheadBatch, Tier, check_record, check_window, parse_units, verify_served
from tieredstore.flat.store import FlatFileStore
from tieredstore.formats.naming import FileType
from tieredstore.local.hot_reader import HotReader
from tieredstore.local.reading import validate_queue
from tieredstore.metrics import Metrics
from tieredstore.read.cache import CachedRun, ReadAheadCache
from tieredstore.read.results import (
    Boundary,
    FetchedMessage,
    GetMessageResult,
    GetMessageStatus,
    MessageFilter,
    QueueOffsets,
    ReadBatch,
)
from tieredstore.read.routing import IN_MEMORY_RATIO, TierRouter, physical_memory_bytes
from tieredstore.read.state import Continuation, QueueStates
from tieredstore.read.tiers import read_cold, read_hot

__all__ = [
    "CACHE_BYPASS_RATIO",
    "IN_MEMORY_RATIO",
    "Boundary",
    "CachedRun",
    "FetchedMessage",
    "GetMessageResult",
    "GetMessageStatus",
    "MessageFetcher",
    "MessageFilter",
    "QueueOffsets",
    "ReadAheadBatch",
    "ReadAheadCache",
    "Tier",
    "check_record",
    "check_window",
    "parse_units",
    "physical_memory_bytes",
    "verify_served",
]

log = structlog.get_logger(__name__)

# What a failed tier raises when another tier may still serve the offset.
_TIER_FAILURES = (StorageError, IntegrityError, NotFoundError)


class MessageFetcher:
    """Reads messages for consumers from whichever tier ``read_policy`` picks; see the module docstring.

    ``hot`` may be None (a cold-only reader). ``read_only_cold`` reads cold queues through read-only
    views instead of ``flat``'s recovered queues (see the module docstring). Everything runs on one
    event loop; hot-store reads go through a worker thread because they touch mapped files.
    """

    def __init__(
        self,
        hot: HotReader | None,
        flat: FlatFileStore,
        *,
        settings: ReadSettings | None = None,
        metrics: Metrics | None = None,
        hot_in_memory_bytes: int | None = None,
        cache_clock: Callable[[], float] = time.monotonic,
        read_only_cold: bool = False,
    ) -> None:
        self.flat = flat
        self.read_only_cold = read_only_cold
        self.settings = settings or ReadSettings()
        self.metrics = metrics or Metrics()
        self.router = TierRouter(hot, lambda: self.settings.read_policy, hot_in_memory_bytes)
        self.cache = ReadAheadCache(
            self.settings.read_ahead_cache_bytes,
            self.settings.read_ahead_ttl,
            metrics=self.metrics,
            clock=cache_clock,
            readers=self.settings.read_ahead_readers,
        )
        self.prefetches = PrefetchPool(self.cache)
        settings = self.settings
        self._cold_options = ColdReadOptions(
            settings.read_ahead_count, settings.read_ahead_size, settings.read_ahead_ttl
        )
        self.queues = QueueStates(flat, read_only_cold)  # one state object per queue

    @property
    def hot(self) -> HotReader | None:
        return self.router.hot

    @hot.setter
    def hot(self, hot: HotReader | None) -> None:
        self.router.hot = hot

    @property
    def hot_in_memory_bytes(self) -> int:
        return self.router.hot_in_memory_bytes

    @hot_in_memory_bytes.setter
    def hot_in_memory_bytes(self, size: int) -> None:
        self.router.hot_in_memory_bytes = size

    @property
    def read_policy(self) -> ReadPolicy:
        return self.settings.read_policy

    # ---- offsets --------------------------------------------------------------------------------------

    async def cold_file(self, topic: str, queue_id: int) -> FlatMessageFile | None:
        """The queue's loaded cold file; None if cold storage does not know the queue.

        A queue whose recovery failed is recovered again here (a StorageError if it still fails).
        With ``read_only_cold`` it is the queue's read-only view, opened on first use.
        """
        return await self.queues.cold_file(topic, queue_id)

    async def refresh_cold(self, topic: str, queue_id: int, *, if_changed: bool = False) -> bool:
        """Re-read a read-only view's rows (see what another process committed); False if there is none.

        ``if_changed``: only when the queue's metadata row changed (``FlatMessageFile.refresh``), for a
        reader asking for what is new, not one that found a segment gone. A queue deleted since (its
        topic was removed) loses its view, so it reads as unknown.
        """
        validate_queue(topic, queue_id)
        return await self.queues.refresh_cold(topic, queue_id, if_changed=if_changed)

    async def offsets(self, topic: str, queue_id: int) -> QueueOffsets:
        """The queue's offsets in each tier and over the tiers this policy reads."""
        validate_queue(topic, queue_id)
        cold = None if self.read_policy is ReadPolicy.DISABLE else await self.cold_file(topic, queue_id)
        return self.router.offsets(topic, queue_id, cold)

    async def min_offset(self, topic: str, queue_id: int) -> int:
        return (await self.offsets(topic, queue_id)).min_offset

    async def max_offset(self, topic: str, queue_id: int) -> int:
        if self.read_only_cold:
            await self.refresh_cold(topic, queue_id, if_changed=True)
        return (await self.offsets(topic, queue_id)).max_offset

    # ---- get_messages -------------------------------------------------------------------------------

    async def get_messages(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int = 32,
        message_filter: MessageFilter | None = None,
    ) -> GetMessageResult:
        """Up to ``max_count`` messages from ``offset`` with RocketMQ's status and next offset."""
        if isinstance(offset, bool) or not isinstance(offset, int):
            raise ValidationError(f"offset must be an integer, not {offset!r}")
        if isinstance(max_count, bool) or not isinstance(max_count, int) or max_count < 1:
            raise ValidationError(f"max_count must be a positive integer, not {max_count!r}")
        await self.prefetches.yield_to_prefetches()
        if message_filter is None and type(topic) is str and type(queue_id) is int:
            # (Any other topic or queue id is not one a continuation was left for; the full path names it.)
            state = self.queues.get(topic, queue_id)
            continued = None
            if state is not None:
                continued = state.go_on(
                    offset,
                    max_count,
                    policy=self.read_policy,
                    hot_span=lambda: self.router.hot_span(topic, queue_id),
                    cold=lambda: self.queues.loaded_cold_file(topic, queue_id),
                    cache=self.cache,
                    max_age=self.settings.read_ahead_ttl if self.read_only_cold else None,
                )
            if continued is not None:
                return continued
        try:
            return await self._get_messages(topic, queue_id, offset, max_count, message_filter)
        except SegmentNotFoundError:
            if not (self.read_only_cold and await self.refresh_cold(topic, queue_id)):
                raise
            # The archiver's retention removed a segment this view still named: answer from fresh rows.
            return await self._get_messages(topic, queue_id, offset, max_count, message_filter)

    async def _get_messages(
        self, topic: str, queue_id: int, offset: int, max_count: int, message_filter: MessageFilter | None
    ) -> GetMessageResult:
        view = await self.offsets(topic, queue_id)
        if (
            self.read_only_cold
            and self.router.cold_first(topic, queue_id, offset, view)
            and await self.refresh_cold(topic, queue_id, if_changed=True)
        ):
            # Look for what another process changed (one row when nothing did): later commits, at the view's
            # end, and the archiver's retention anywhere, whose new min offset makes a removed offset
            # OFFSET_TOO_SMALL even where the cache still holds it. Not when the policy serves the offset from
            # the hot store anyway (a consumer reading recent messages would query metadata every call), nor
            # on a call that goes on inside the cached window its last call read (``QueueState.go_on``, which
            # comes here again at least every read_ahead_ttl).
            view = await self.offsets(topic, queue_id)
        # What the view rests on, taken with it (no await in between), for the next call to go on from.
        cold = self.queues.loaded_cold_file(topic, queue_id)
        held = None if cold is None else cold.consume_queue.held()
        state = self.queues.get(topic, queue_id)
        if state is not None:
            state.continuation = None

        def result(
            status: GetMessageStatus, next_offset: int, messages: list[FetchedMessage] | None = None
        ) -> GetMessageResult:
            return GetMessageResult(status, next_offset, view.min_offset, view.max_offset, messages or [])

        if not view.known:
            return result(GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, 0)
        if view.min_offset == view.max_offset:
            return result(GetMessageStatus.NO_MESSAGE_IN_QUEUE, view.max_offset)
        if offset < view.min_offset:
            return result(GetMessageStatus.OFFSET_TOO_SMALL, view.min_offset)
        if offset == view.max_offset:
            return result(GetMessageStatus.OFFSET_OVERFLOW_ONE, offset)
        if offset > view.max_offset:
            return result(GetMessageStatus.OFFSET_OVERFLOW_BADLY, view.max_offset)
        batch = await self._read(topic, queue_id, offset, max_count, message_filter, view, read_ahead=True)
        if batch is None:
            return result(GetMessageStatus.OFFSET_FOUND_NULL, view.next_held_after(offset))
        if not batch.messages:
            return result(GetMessageStatus.NO_MATCHED_MESSAGE, batch.next_offset)
        if message_filter is None and batch.window is not None and cold is not None and held is not None:
            self.queues.of(topic, queue_id).continuation = Continuation(
                batch.next_offset, weakref.ref(batch.window), view, cold, held, self.cache.clock()
            )
        return result(GetMessageStatus.FOUND, batch.next_offset, batch.messages)

    async def read_message(self, topic: str, queue_id: int, queue_offset: int) -> FetchedMessage | None:
        """The one message at ``queue_offset`` from the tier the policy picks, without read-ahead; None if gone."""
        view = await self.offsets(topic, queue_id)
        batch = await self._read(topic, queue_id, queue_offset, 1, None, view, read_ahead=False)
        if batch is None or not batch.messages:
            return None
        return batch.messages[0]

    async def _read(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int,
        message_filter: MessageFilter | None,
        view: QueueOffsets,
        *,
        read_ahead: bool,
    ) -> ReadBatch | None:
        """Read from the first tier in order that succeeds; None when no tier holds ``offset``."""
        order = self.router.tier_order(topic, queue_id, offset, view)
        for position, tier in enumerate(order):
            try:
                if tier == "hot":
                    assert self.hot is not None
                    scan_end = self._scan_end(offset, view.hot_max, max_count)
                    size = self.settings.read_ahead_size
                    return await read_hot(self.hot, topic, queue_id, offset, scan_end, max_count, message_filter, size)
                return await self._read_cold(
                    topic, queue_id, offset, view.cold_max, max_count, message_filter, read_ahead
                )
            except _TIER_FAILURES as error:
                if position == len(order) - 1:
                    raise
                log.warning(
                    "read failed; trying the other tier",
                    tier=tier,
                    topic=topic,
                    queue_id=queue_id,
                    offset=offset,
                    error=str(error),
                )
        return None

    def _scan_end(self, offset: int, tier_end: int, max_count: int) -> int:
        return min(tier_end, offset + max(max_count, self.settings.read_ahead_count))

    async def _read_cold(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        cold_max: int,
        max_count: int,
        message_filter: MessageFilter | None,
        read_ahead: bool,
    ) -> ReadBatch:
        flat_file = await self.cold_file(topic, queue_id)
        if flat_file is None:
            raise NotFoundError(f"cold queue {topic}/{queue_id} is not loaded")
        state = self.queues.of(topic, queue_id)
        reader = state.cold_reader(flat_file, self._cold_options, self.prefetches, self._count_read)
        # A read stops where offsets recorded as lost begin; the next call is answered OFFSET_FOUND_NULL.
        run_end = min(cold_max, flat_file.archived_run_end(offset))
        scan_end = self._scan_end(offset, run_end, max_count)
        return await read_cold(
            reader, self.cache, offset, scan_end, run_end, max_count, message_filter, read_ahead=read_ahead
        )

    def _count_read(self, file_type: FileType) -> None:
        self.metrics.cold_reads.labels(file_type=file_type.value).inc()

    # ---- prefetches -----------------------------------------------------------------------------------

    @property
    def prefetching(self) -> int:
        """How many windows are being prefetched or held for their reader."""
        return self.prefetches.prefetching

    async def wait_for_prefetches(self) -> None:
        """Wait until every prefetch started has finished, the ones they started in turn too (their
        outcomes stay for their readers)."""
        await self.prefetches.wait()

    async def close(self) -> None:
        """Cancel the prefetches in flight and wait for them; no prefetch starts afterwards."""
        for state in self.queues.all():
            state.continuation = None
        await self.prefetches.close()

    # ---- time lookups ---------------------------------------------------------------------------------

    async def offset_for_timestamp(
        self, topic: str, queue_id: int, timestamp: int, boundary: Boundary = "lower"
    ) -> int:
        """``lower``: the first offset stored at or after ``timestamp`` (max offset if none);
        ``upper``: the last offset stored at or before it (min offset if none); over the tiers read.
        """
        if boundary not in ("lower", "upper"):
            raise ValidationError(f"boundary must be 'lower' or 'upper', not {boundary!r}")
        view = await self.offsets(topic, queue_id)
        cold = await self.cold_file(topic, queue_id) if view.cold_min < view.cold_max else None
        return await self.router.offset_for_timestamp(topic, queue_id, timestamp, boundary, view, cold)
