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
window is read (``check_window``: size, magic, lengths, body CRC, topic, queue id and queue offset,
all records at once with numpy, one ``crc32`` per body). A record that fails keeps its
``CorruptRecordError`` naming its topic, queue and offset, raised to whoever asks for that offset;
a corrupt record further ahead does not fail an earlier batch. Serving is slicing only. A call that
goes on from where its queue's last call ended, inside the same cached window, is served from that
window without working out the queue's offsets, tiers and cached run again, while nothing they rest
on has changed (``_Continuation``): the answer is the one the full path gives.

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
"""

from __future__ import annotations

import asyncio
import enum
import functools
import math
import os
import struct
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import structlog

from tieredstore.config import ReadPolicy, ReadSettings
from tieredstore.errors import (
    CorruptRecordError,
    IntegrityError,
    InvalidQueueError,
    NotFoundError,
    SegmentNotFoundError,
    StorageError,
    ValidationError,
)
from tieredstore.flat.append_file import HeldRuns
from tieredstore.flat.consume_queue import BoundaryType
from tieredstore.flat.message_file import FlatMessageFile
from tieredstore.flat.store import FlatFileStore
from tieredstore.formats.arrays import BODY_LEN_AFTER_HOSTS, RECORD_HEAD_DTYPE, UNIT_DTYPE, as_values, gather_rows
from tieredstore.formats.checksum import BODY_CRC_MASK, body_crc, crc32
from tieredstore.formats.consume_queue import UNIT_SIZE, ConsumeQueueUnit, iter_units
from tieredstore.formats.message import (
    MAGIC_V1,
    MAGIC_V2,
    MIN_RECORD_SIZE,
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_STOREHOST_V6,
    MessageRecord,
    decode,
    java_string_hash,
    split_back_to_back,
    verify_record,
)
from tieredstore.formats.naming import FileType, validate_topic
from tieredstore.local.store import LocalMessageStore
from tieredstore.metrics import Metrics

log = structlog.get_logger(__name__)

Tier = Literal["hot", "cold"]
Boundary = Literal["lower", "upper"]
CACHE_BYPASS_RATIO = 0.8
IN_MEMORY_RATIO = 0.4
_HEAD = struct.Struct(">iI")
# While prefetches are in flight, a call served from the cache gives the event loop a turn at most this often
# (seconds): enough for a prefetch reading on the loop to take in its data, without paying a loop turn per call.
_PREFETCH_YIELD_INTERVAL = 0.001
# How long such a turn gives the GIL to worker threads reading prefetches (seconds): 5% of a busy reader's time.
_GIL_HANDOFF = 50e-6
# Windows of a queue read ahead of the one its reader is in: the next one's read starts as soon as the
# read before it has been split, so a reader going through a queue keeps one request in flight.
_PREFETCH_DEPTH = 2
# What a failed tier raises when another tier may still serve the offset.
_TIER_FAILURES = (StorageError, IntegrityError, NotFoundError)


class GetMessageStatus(enum.StrEnum):
    """RocketMQ's GetMessageStatus values that this store produces."""

    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"  # every scanned message was filtered out
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"  # inside [min, max) but no tier holds it (a gap)
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"  # offset > max
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"  # offset == max: nothing new yet
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"  # offset < min
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"  # neither tier knows the queue
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"  # the queue is known but holds nothing


@dataclass(frozen=True, slots=True)
class MessageFilter:
    """Which messages a consumer wants: any of ``tags`` (None: any tag) and ``predicate`` (None: all)."""

    tags: frozenset[str] | None = None
    predicate: Callable[[MessageRecord], bool] | None = None
    tag_hashes: frozenset[int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.tags is not None:
            if isinstance(self.tags, str):
                raise ValidationError("tags must be a set of tag strings, not one string")
            object.__setattr__(self, "tags", frozenset(self.tags))
        object.__setattr__(self, "tag_hashes", frozenset(java_string_hash(tag) for tag in self.tags or ()))

    @classmethod
    def by_tags(cls, *tags: str) -> MessageFilter:
        return cls(tags=frozenset(tags))

    def may_match(self, tag_hash: int) -> bool:
        """The cheap check on the consume-queue tag hash, before the record is read."""
        return self.tags is None or tag_hash in self.tag_hashes

    def matches(self, record: MessageRecord) -> bool:
        if self.tags is not None and record.tags not in self.tags:
            return False
        return self.predicate is None or self.predicate(record)


@dataclass(slots=True, unsafe_hash=True)
class FetchedMessage:
    """One message as served: where it is, which tier served it, its raw record bytes and decoded view.

    The bytes were checked when the message was served; ``decoded`` is the decoded record when the
    server already had it, otherwise ``record`` decodes it on first access. A value: treat it as
    immutable (it hashes by its fields). It is not a frozen dataclass only because building one costs
    twice as much, once per message served.
    """

    topic: str
    queue_id: int
    queue_offset: int
    tier: Tier
    raw: bytes = field(repr=False)
    decoded: MessageRecord | None = field(default=None, repr=False, compare=False)

    @property
    def record(self) -> MessageRecord:
        record = self.decoded
        if record is None:
            record = self.decoded = decode(self.raw, check_crc=False)
        return record

    @property
    def body(self) -> bytes:
        if self.decoded is not None:
            return self.decoded.body
        fields = verify_record(self.raw, check_crc=False)
        return self.raw[fields.body_at : fields.body_at + fields.body_len]

    @property
    def keys(self) -> list[str]:
        return self.record.keys

    @property
    def tags(self) -> str | None:
        return self.record.tags

    @property
    def unique_key(self) -> str | None:
        return self.record.unique_key

    @property
    def properties(self) -> dict[str, str]:
        return self.record.properties

    @property
    def store_timestamp(self) -> int:
        return self.record.store_timestamp


@dataclass(frozen=True, slots=True)
class GetMessageResult:
    """The answer to ``get_messages``: ask for ``next_begin_offset`` next."""

    status: GetMessageStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    messages: list[FetchedMessage] = field(default_factory=list)


# ---- read-ahead windows, checked once ----------------------------------------------------------------


@dataclass(eq=False, slots=True, weakref_slot=True)
class ReadAheadBatch:
    """One read-ahead window: the commit-log bytes as read, each record's place in them, checked once.

    The record at queue offset ``first_offset + i`` is ``data[starts[i]:ends[i]]``, with consume-queue tag
    hash ``tag_hashes[i]`` (None for a window split without its consume queue: a filter then looks at
    each record's tags); ``data`` begins at commit-log offset ``commitlog_start``. Every record was
    checked when the window was read (``check_window``); ``corrupt`` holds the typed error of each one
    that failed, raised to whoever asks for that offset. Serving the others is slicing only.
    """

    topic: str
    queue_id: int
    first_offset: int
    data: bytes = field(repr=False)
    starts: list[int] = field(repr=False)
    ends: list[int] = field(repr=False)
    tag_hashes: list[int] | None = field(repr=False)
    commitlog_start: int = 0
    corrupt: dict[int, CorruptRecordError] = field(default_factory=dict, repr=False)
    passes: int = field(default=0, repr=False)  # how many times a reader has been served its last record

    @property
    def end_offset(self) -> int:
        return self.first_offset + len(self.starts)

    def __len__(self) -> int:
        return len(self.starts)

    def raw(self, queue_offset: int) -> bytes:
        index = queue_offset - self.first_offset
        return self.data[self.starts[index] : self.ends[index]]

    def unit(self, queue_offset: int) -> ConsumeQueueUnit:
        """The consume-queue unit that pointed at the record (for messages about it)."""
        index = queue_offset - self.first_offset
        start = self.starts[index]
        tag_hash = 0 if self.tag_hashes is None else self.tag_hashes[index]
        return ConsumeQueueUnit(self.commitlog_start + start, self.ends[index] - start, tag_hash)

    def raise_if_corrupt(self, begin: int, end: int) -> None:
        """The CorruptRecordError of the first corrupt record in [begin, end), if there is one."""
        if self.corrupt:
            bad = [offset for offset in self.corrupt if begin <= offset < end]
            if bad:
                raise self.corrupt[min(bad)].with_traceback(None)

    def messages(self, begin: int, end: int) -> list[FetchedMessage]:
        """The records at [begin, end) as messages (checked when the window was read; nothing decoded)."""
        self.raise_if_corrupt(begin, end)
        data, topic, queue_id = self.data, self.topic, self.queue_id
        low, high = begin - self.first_offset, end - self.first_offset
        return [
            FetchedMessage(topic, queue_id, offset, "cold", data[start:stop])
            for offset, start, stop in zip(range(begin, end), self.starts[low:high], self.ends[low:high], strict=True)
        ]


def parse_units(raw: bytes, location: str, position: int) -> np.ndarray:
    """Consume-queue bytes as a structured array (``UNIT_DTYPE``), with ``iter_units``' checks and errors."""
    if len(raw) % UNIT_SIZE:
        raise CorruptRecordError(
            f"consume queue returned {len(raw)} bytes, not whole units", location=location, offset=position
        )
    units = np.frombuffer(raw, dtype=UNIT_DTYPE)
    if len(units) and (units["commitlog_offset"].min() < 0 or units["size"].min() < 0):
        list(iter_units(raw))  # raises the CorruptRecordError naming the first bad unit
    return units


def check_window(
    topic: str,
    queue_id: int,
    first_offset: int,
    data: bytes,
    commitlog_start: int,
    units: np.ndarray,
    *,
    tag_hashes_known: bool = True,
) -> ReadAheadBatch:
    """Split a commit-log read by its consume-queue units and check every record once (see ``verify_served``).

    A vectorised pass over the window flags each record that may fail any of ``verify_served``'s checks;
    ``verify_served`` then judges each flagged record, so the errors (and which records are corrupt) are
    exactly what checking record by record gives. Units made from the records themselves carry no tag
    hash (``tag_hashes_known=False``).
    """
    begins = units["commitlog_offset"].astype(np.int64) - commitlog_start
    ends = begins + units["size"].astype(np.int64)
    tag_hashes = units["tag_hash"].tolist() if tag_hashes_known else None
    batch = ReadAheadBatch(
        topic, queue_id, first_offset, data, begins.tolist(), ends.tolist(), tag_hashes, commitlog_start
    )
    for index in _suspect_records(_topic_bytes(topic), queue_id, first_offset, data, begins, ends - begins).tolist():
        queue_offset = first_offset + index
        raw = data[batch.starts[index] : batch.ends[index]]
        try:
            verify_served(topic, queue_id, queue_offset, raw, batch.unit(queue_offset), "cold")
        except CorruptRecordError as error:
            batch.corrupt[queue_offset] = error
    return batch


def _suspect_records(
    topic_raw: bytes, queue_id: int, first_offset: int, data: bytes, begins: np.ndarray, sizes: np.ndarray
) -> np.ndarray:
    """Indexes of the records that may fail ``verify_served``: never fewer than do (it may flag more).

    Each check of ``verify_served``/``verify_record`` is made for all records at once on their fixed
    fields and on the length fields they locate; the body CRC is one ``crc32`` per record.
    """
    count = len(begins)
    length = len(data)
    ok = (begins >= 0) & (sizes >= MIN_RECORD_SIZE) & (begins + sizes <= length)
    if not ok.any():
        return np.arange(count)
    buffer = np.frombuffer(data, dtype=np.uint8)
    base = np.where(ok, begins, 0)

    def gather(at: np.ndarray | int, width: int) -> np.ndarray:
        """``width`` bytes at ``base + at`` of each record, as a (count, width) array (clipped to the data)."""
        return gather_rows(buffer, base + at, width)

    head = as_values(gather(0, RECORD_HEAD_DTYPE.itemsize), RECORD_HEAD_DTYPE)
    magic = head["magic"]
    ok &= (magic == MAGIC_V1) | (magic == MAGIC_V2)
    ok &= head["total_size"] == sizes
    ok &= head["queue_id"] == queue_id
    ok &= head["queue_offset"] == np.arange(first_offset, first_offset + count, dtype=np.int64)
    sysflag = head["sysflag"]
    body_len_at = (
        BODY_LEN_AFTER_HOSTS
        + np.where(sysflag & SYSFLAG_BORNHOST_V6, 20, 8)
        + np.where(sysflag & SYSFLAG_STOREHOST_V6, 20, 8)
    )
    ok &= body_len_at + 4 <= sizes
    body_len = gather(body_len_at, 4).view(">i4")[:, 0].astype(np.int64)
    body_at = body_len_at + 4
    ok &= (body_len >= 0) & (body_at + body_len <= sizes)
    body_len = np.where(ok, body_len, 0)
    topic_len_at = body_at + body_len
    v2 = magic == MAGIC_V2
    topic_len_width = np.where(v2, 2, 1)
    ok &= topic_len_at + topic_len_width <= sizes
    pair = gather(topic_len_at, 2)
    topic_len = np.where(v2, pair.view(">i2")[:, 0], pair[:, 0].view(np.int8))
    topic_at = topic_len_at + topic_len_width
    # The topic must be ours (so its length is too), and PROPLEN(2) must follow it inside the record.
    ok &= (topic_len == len(topic_raw)) & (topic_at + len(topic_raw) + 2 <= sizes)
    ok &= (gather(topic_at, len(topic_raw)) == np.frombuffer(topic_raw, dtype=np.uint8)).all(axis=1)
    properties_len_at = topic_at + len(topic_raw)
    properties_len = gather(properties_len_at, 2).view(">i2")[:, 0]
    ok &= (properties_len >= 0) & (properties_len_at + 2 + properties_len == sizes)
    checked = np.flatnonzero(ok)
    body_starts = (base + body_at)[checked]
    view = memoryview(data)
    # The mask is applied to all at once: per body, the loop does the slice and the C call only.
    computed = [
        crc32(view[start:stop])
        for start, stop in zip(body_starts.tolist(), (body_starts + body_len[checked]).tolist(), strict=True)
    ]
    ok[checked] = head["body_crc"][checked] == np.array(computed, dtype=np.int64) & BODY_CRC_MASK
    return np.flatnonzero(~ok)


_BatchKey = tuple[str, int, int]
# A cached run: records [begin, end) of one batch.
CachedRun = tuple[ReadAheadBatch, int, int]


class ReadAheadCache:
    """Batches read ahead of a consumer, found by (topic, queue id, queue offset); bounded in bytes.

    A batch expires ``ttl`` seconds after it was last read (a hit renews it); when a new batch does not
    fit, the least recently read ones are evicted. A batch whose last record has been served to
    ``readers`` readers is released at once (``read_through``; ``readers`` 0 keeps batches until they
    expire or are evicted): a reader going through a queue does not come back, and a cache of windows
    already read would only hold memory, and make every new window land in fresh pages (a page fault
    each 4 KiB: on the VM of BENCHMARKS.md, a seventh of a cold reader's CPU). RocketMQ releases a
    cached message once each consumer group active on the queue has read it; this store is not told
    the groups, so ``readers`` says how many there are.
    ``max_bytes`` 0 turns the cache off. ``clock`` is injectable for tests (monotonic seconds). Sizes,
    lengths and the eviction and release metrics count records, as a consumer sees them.

    The batches are kept in the order they were last read, so the oldest is first both to expire and
    to be evicted; a hit is a dictionary move (a general TTL cache cost ten times more per call).
    """

    def __init__(
        self,
        max_bytes: int,
        ttl: float,
        *,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        readers: int = 0,
    ) -> None:
        self.max_bytes = max_bytes
        self.ttl = ttl
        self.readers = readers
        self.clock = clock
        self.metrics = metrics or Metrics()
        # key -> (batch, expiry time), least recently read first.
        self._entries: OrderedDict[_BatchKey, tuple[ReadAheadBatch, float]] = OrderedDict()
        self._bytes = 0
        # Per queue, the [first, end) offsets of the batches put; an entry whose batch has gone is dropped lazily.
        self._spans: dict[tuple[str, int], dict[int, int]] = {}
        # Per queue, the first offset of the batch found last (a hint, checked like any span).
        self._last_found: dict[tuple[str, int], int] = {}

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def _drop(self, key: _BatchKey) -> ReadAheadBatch:
        batch, _expires = self._entries.pop(key)
        self._bytes -= len(batch.data)
        return batch

    def _expire(self, now: float) -> None:
        """Drop the batches not read for ``ttl`` (they are first in the order), counting them as evictions."""
        evicted = 0
        entries = self._entries
        while entries:
            key, (_batch, expires) = next(iter(entries.items()))
            if expires > now:
                break
            evicted += len(self._drop(key))
        if evicted:
            self.metrics.cache_evictions.inc(evicted)

    @property
    def size_bytes(self) -> int:
        """Bytes held now (after dropping expired entries)."""
        self._expire(self.clock())
        return self._bytes

    def __len__(self) -> int:
        """Records held now."""
        self._expire(self.clock())
        return sum(len(batch) for batch, _expires in self._entries.values())

    def over_threshold(self) -> bool:
        """Whether the cache holds more than 80% of its bound: reads then bypass it."""
        return not self.enabled or self.size_bytes > CACHE_BYPASS_RATIO * self.max_bytes

    def get_run(self, topic: str, queue_id: int, offset: int, limit: int) -> list[CachedRun]:
        """Up to ``limit`` consecutive cached records from ``offset``, renewing the batches they come from.

        The run is a list of (batch, begin, end) slices. An empty run (``offset`` not cached) counts one
        miss; every record in it counts a hit.
        """
        if not self.enabled:
            return []
        now = self.clock()
        self._expire(now)
        run: list[CachedRun] = []
        position = offset
        end = offset + limit
        while position < end:
            batch = self._batch_holding(topic, queue_id, position)
            if batch is None:
                break
            # A read renews the batch: it expires ttl after its last access, and is evicted last.
            key = (topic, queue_id, batch.first_offset)
            self._entries[key] = (batch, now + self.ttl)
            self._entries.move_to_end(key)
            stop = min(batch.end_offset, end)
            run.append((batch, position, stop))
            position = stop
        if run:
            self.metrics.cache_hits.inc(position - offset)
        else:
            self.metrics.cache_misses.inc()
        return run

    def renew(self, batch: ReadAheadBatch, hits: int) -> bool:
        """Count ``hits`` records read from ``batch`` and renew it, as ``get_run`` does; False if it is no
        longer the cached batch of its place (expired, evicted, replaced): the caller then asks ``get_run``.
        """
        if not self.enabled:
            return False
        now = self.clock()
        self._expire(now)
        key = (batch.topic, batch.queue_id, batch.first_offset)
        entry = self._entries.get(key)
        if entry is None or entry[0] is not batch:
            return False
        self._entries[key] = (batch, now + self.ttl)
        self._entries.move_to_end(key)
        self.metrics.cache_hits.inc(hits)
        return True

    def read_through(self, batch: ReadAheadBatch) -> None:
        """A reader has been served ``batch``'s last record: once ``readers`` have, the batch is released."""
        batch.passes += 1
        if not self.readers or batch.passes < self.readers:
            return
        key = (batch.topic, batch.queue_id, batch.first_offset)
        entry = self._entries.get(key)
        if entry is None or entry[0] is not batch:
            return  # not cached (read past the cache), or already gone
        self._drop(key)
        self.metrics.cache_released.inc(len(batch))
        self.metrics.cache_bytes.set(self._bytes)

    def _batch_holding(self, topic: str, queue_id: int, offset: int) -> ReadAheadBatch | None:
        spans = self._spans.get((topic, queue_id))
        if not spans:
            return None
        # A consumer going through a queue asks within the batch it asked last, or at the start of the
        # next one: both are found without going through every batch the queue has cached.
        hint = self._last_found.get((topic, queue_id))
        for first in (hint, offset):
            if first is not None and first <= offset < spans.get(first, first):
                batch = self._current(topic, queue_id, first, spans[first])
                if batch is not None:
                    return batch
        for first, end in list(spans.items()):
            if first <= offset < end:
                batch = self._current(topic, queue_id, first, end)
                if batch is not None:
                    return batch
                del spans[first]
        return None

    def _current(self, topic: str, queue_id: int, first: int, end: int) -> ReadAheadBatch | None:
        """The cached batch the span [first, end) was put for, if it is still held (remembered as found last)."""
        entry = self._entries.get((topic, queue_id, first))
        if entry is None or entry[0].end_offset != end:
            return None
        self._last_found[(topic, queue_id)] = first
        return entry[0]

    def put(self, batch: ReadAheadBatch) -> None:
        """Keep ``batch`` (not when it alone is larger than the whole bound), evicting the least recently read."""
        if not self.enabled or len(batch.data) > self.max_bytes or not len(batch):
            return
        now = self.clock()
        self._expire(now)
        topic, queue_id = batch.topic, batch.queue_id
        key = (topic, queue_id, batch.first_offset)
        if key in self._entries:
            self._drop(key)
        evicted = 0
        while self._bytes + len(batch.data) > self.max_bytes:
            evicted += len(self._drop(next(iter(self._entries))))
        if evicted:
            self.metrics.cache_evictions.inc(evicted)
        self._entries[key] = (batch, now + self.ttl)
        self._bytes += len(batch.data)
        spans = self._spans.setdefault((topic, queue_id), {})
        for first in [first for first in spans if (topic, queue_id, first) not in self._entries]:
            del spans[first]
        spans[batch.first_offset] = batch.end_offset
        self.metrics.cache_bytes.set(self._bytes)

    def discard_queue(self, topic: str, queue_id: int) -> None:
        """Drop every batch of one queue (its cold data changed under the cache)."""
        for key in [key for key in self._entries if key[0] == topic and key[1] == queue_id]:
            self._drop(key)
        self._spans.pop((topic, queue_id), None)
        self._last_found.pop((topic, queue_id), None)
        self.metrics.cache_bytes.set(self._bytes)

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0
        self._spans.clear()
        self._last_found.clear()
        self.metrics.cache_bytes.set(0)


# ---- offsets over both tiers ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueueOffsets:
    """A queue's offsets in each tier ([min, max) each; empty when min == max) and over both."""

    known: bool
    hot_min: int
    hot_max: int
    cold_min: int
    cold_max: int
    min_offset: int
    max_offset: int
    # [start, end) offsets inside [cold_min, cold_max) that cold storage recorded as lost (never archived).
    cold_lost: tuple[tuple[int, int], ...] = ()

    def hot_has(self, offset: int) -> bool:
        return self.hot_min <= offset < self.hot_max

    def cold_has(self, offset: int) -> bool:
        return self.cold_min <= offset < self.cold_max and not any(s <= offset < e for s, e in self.cold_lost)

    def next_held_after(self, offset: int) -> int:
        """The first offset above ``offset`` that some tier holds (``max_offset`` if none)."""
        spans = [(self.hot_min, self.hot_max), (self.cold_min, self.cold_max)]
        spans += [(end, self.cold_max) for _start, end in self.cold_lost]
        later = [start for start, end in spans if start < end and start > offset]
        return min(later) if later else self.max_offset


@dataclass(slots=True)
class _Batch:
    messages: list[FetchedMessage]
    next_offset: int
    # The cached cold window the messages ended in, when unfiltered: where the queue's next call may continue.
    window: ReadAheadBatch | None = None


@dataclass(slots=True)
class _Continuation:
    """Where a reader's last call ended inside a cached cold window, and what that answer rested on.

    The next call from ``next_offset`` is served from ``window`` directly (``MessageFetcher._continue``)
    while nothing it rested on changed: the window is still cached, the cold file and its segments are
    the same objects (``FlatAppendFile.held`` is one object until they change), the hot store's offsets
    for the queue are the same, and the policy would read these offsets from cold storage. A read-only
    view cannot see another process's changes without a metadata query, so there it also goes no longer
    than ``read_ahead_ttl`` after ``checked_at``, when the full path last looked for them.
    """

    next_offset: int
    # Not a strong reference: a window the cache evicted must not stay in memory for a reader that left.
    window: weakref.ref[ReadAheadBatch]
    view: QueueOffsets
    cold: FlatMessageFile
    held: HeldRuns
    checked_at: float


@dataclass(slots=True)
class _Follow:
    """Where the record after a window lies in the cold commit log, for a window that follows it."""

    offset: int
    commitlog_offset: int
    record_bytes: float  # the mean record size of the window before, to size the next read


@dataclass(slots=True)
class _Prefetch:
    """A window of one queue ahead of its reader, being read (or read) before the reader asks for it."""

    start: _Follow  # its first offset and where that record lies in the cold commit log
    reserved_bytes: int  # counted against the cache's budget until the reader takes it
    started: float
    run_end: int  # the end of the archived run it is in: no window is read ahead past it
    task: asyncio.Task[ReadAheadBatch | None] = field(init=False)
    # Where the window after it begins, known once its read is split (before its records are checked).
    after: _Follow | None = None

    @property
    def offset(self) -> int:
        return self.start.offset


# Told where the record after a window lies (and the window's size) once its read is split; whether it
# started a read there.
_OnSplit = Callable[[_Follow, int], bool]


def _follow_after(batch: ReadAheadBatch) -> _Follow:
    """Where the record after a (non-empty) window lies in the cold commit log."""
    first, last = batch.starts[0], batch.ends[-1]
    return _Follow(batch.end_offset, batch.commitlog_start + last, (last - first) / len(batch))


def physical_memory_bytes() -> int:
    """Total RAM as the OS reports it (0 when it cannot tell)."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 0


class MessageFetcher:
    """Reads messages for consumers from whichever tier ``read_policy`` picks; see the module docstring.

    ``hot`` may be None (a cold-only reader). ``read_only_cold`` reads cold queues through read-only
    views instead of ``flat``'s recovered queues (see the module docstring). Everything runs on one
    event loop; hot-store reads go through a worker thread because they touch mapped files.
    """

    def __init__(
        self,
        hot: LocalMessageStore | None,
        flat: FlatFileStore,
        *,
        settings: ReadSettings | None = None,
        metrics: Metrics | None = None,
        hot_in_memory_bytes: int | None = None,
        cache_clock: Callable[[], float] = time.monotonic,
        read_only_cold: bool = False,
    ) -> None:
        self.hot = hot
        self.flat = flat
        self.read_only_cold = read_only_cold
        self._views: dict[tuple[str, int], FlatMessageFile] = {}
        self.settings = settings or ReadSettings()
        self.metrics = metrics or Metrics()
        self.hot_in_memory_bytes = (
            int(physical_memory_bytes() * IN_MEMORY_RATIO) if hot_in_memory_bytes is None else hot_in_memory_bytes
        )
        self.cache = ReadAheadCache(
            self.settings.read_ahead_cache_bytes,
            self.settings.read_ahead_ttl,
            metrics=self.metrics,
            clock=cache_clock,
            readers=self.settings.read_ahead_readers,
        )
        # Per queue, its windows read ahead, in offset order: each begins where the one before it ends.
        self._prefetches: dict[tuple[str, int], list[_Prefetch]] = {}
        self._prefetch_bytes = 0
        self._pending_bytes = 0  # windows being read by their readers that have started one ahead, until cached
        self._in_flight = 0  # prefetches still reading
        self._last_yield = 0.0  # when a call last gave the event loop a turn for them (time.monotonic)
        self._window_ends: dict[tuple[str, int], int] = {}  # per queue, where the last window read ended
        self._follows: dict[tuple[str, int], _Follow] = {}  # per queue, where the next record lies
        self._continuations: dict[tuple[str, int], _Continuation] = {}  # per queue, where its last call ended
        self._closed = False

    @property
    def read_policy(self) -> ReadPolicy:
        return self.settings.read_policy

    # ---- offsets --------------------------------------------------------------------------------------

    async def cold_file(self, topic: str, queue_id: int) -> FlatMessageFile | None:
        """The queue's loaded cold file; None if cold storage does not know the queue.

        A queue whose recovery failed is recovered again here (a StorageError if it still fails).
        With ``read_only_cold`` it is the queue's read-only view, opened on first use.
        """
        loaded = self._loaded_cold_file(topic, queue_id)
        if loaded is not None:
            return loaded
        if self.read_only_cold:
            try:
                view = await self.flat.open_read_only(topic, queue_id)
            except NotFoundError:
                return None  # not cached: the archiver may create the queue later
            self._views[(topic, queue_id)] = view
            return view
        if (topic, queue_id) in self.flat.failed:
            return await self.flat.get_or_create(topic, queue_id)
        return None

    async def refresh_cold(self, topic: str, queue_id: int, *, if_changed: bool = False) -> bool:
        """Re-read a read-only view's rows (see what another process committed); False if there is none.

        ``if_changed``: only when the queue's metadata row changed (``FlatMessageFile.refresh``), for a
        reader asking for what is new, not one that found a segment gone. A queue deleted since (its
        topic was removed) loses its view, so it reads as unknown.
        """
        _validate_queue(topic, queue_id)
        view = self._views.get((topic, queue_id))
        if view is None:
            return False
        try:
            await view.refresh(if_changed=if_changed)
        except NotFoundError:
            del self._views[(topic, queue_id)]
            self._continuations.pop((topic, queue_id), None)  # nor keep the view alive through it
        return True

    async def offsets(self, topic: str, queue_id: int) -> QueueOffsets:
        """The queue's offsets in each tier and over the tiers this policy reads."""
        _validate_queue(topic, queue_id)
        hot_min = hot_max = cold_min = cold_max = 0
        cold_lost: tuple[tuple[int, int], ...] = ()
        known = False
        hot_span = self._hot_span(topic, queue_id)
        if hot_span is not None:
            known = True
            hot_min, hot_max = hot_span
        if self.read_policy is not ReadPolicy.DISABLE:
            flat_file = await self.cold_file(topic, queue_id)
            if flat_file is not None:
                known = True
                cold_min, cold_max = flat_file.min_offset, flat_file.archived_offset
                cold_lost = flat_file.consume_queue.queue_runs().lost
        ranges = [(start, end) for start, end in ((hot_min, hot_max), (cold_min, cold_max)) if start < end]
        if ranges:
            min_offset, max_offset = min(s for s, _ in ranges), max(e for _, e in ranges)
        else:
            # Nothing held: both ends sit where the queue will continue.
            min_offset = max_offset = max(hot_max, cold_max)
        return QueueOffsets(known, hot_min, hot_max, cold_min, cold_max, min_offset, max_offset, cold_lost)

    def _hot_span(self, topic: str, queue_id: int) -> tuple[int, int] | None:
        """The hot store's [min, max) offsets of the queue; None when it holds none (or there is no hot store)."""
        hot = self.hot
        if hot is None:
            return None
        hot_max = hot.max_offset(topic, queue_id)
        return None if hot_max <= 0 else (hot.min_offset(topic, queue_id), hot_max)

    def _loaded_cold_file(self, topic: str, queue_id: int) -> FlatMessageFile | None:
        """The queue's cold file if it is loaded already (``cold_file`` without opening or recovering one)."""
        if self.read_only_cold:
            return self._views.get((topic, queue_id))
        try:
            return self.flat.get(topic, queue_id)
        except NotFoundError:
            return None

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
        if self._in_flight:
            # Served from the cache, a call never waits: now and then, let the prefetches in flight take in
            # their data. Not on every call: a loop turn costs more than serving 32 cached messages. The S3
            # and POSIX providers read in worker threads, which need the GIL after each piece of a response
            # arrives, and a thread holding it (this one, serving) gives it up only every switch interval
            # (5 ms): beside a busy reader, an S3 GET took a third longer. A short sleep hands it over now.
            now = time.monotonic()
            if now - self._last_yield >= _PREFETCH_YIELD_INTERVAL:
                self._last_yield = now
                time.sleep(_GIL_HANDOFF)  # noqa: ASYNC251 - blocks the loop 50 µs on purpose, to release the GIL
                await asyncio.sleep(0)
        if message_filter is None:
            continued = self._continue(topic, queue_id, offset, max_count)
            if continued is not None:
                return continued
        try:
            return await self._get_messages(topic, queue_id, offset, max_count, message_filter)
        except SegmentNotFoundError:
            if not (self.read_only_cold and await self.refresh_cold(topic, queue_id)):
                raise
            # The archiver's retention removed a segment this view still named: answer from fresh rows.
            return await self._get_messages(topic, queue_id, offset, max_count, message_filter)

    def _continue(self, topic: str, queue_id: int, offset: int, max_count: int) -> GetMessageResult | None:
        """The answer ``_get_messages`` would give a reader going on from where its last call ended inside a
        cached cold window, served from that window without working the answer out again; None when any
        of what it rested on changed (see ``_Continuation``), or the answer would not come from the window
        alone (it reaches past the window's end, or holds a corrupt record).

        A consumer asks for the next 32 messages ~128 times per 4,096-message window; working out the
        queue's offsets, the tier and the cached run each time cost as much as serving the messages.
        """
        if type(topic) is not str or type(queue_id) is not int:
            return None  # not a queue a continuation was left for; the full path names what is wrong
        continuation = self._continuations.get((topic, queue_id))
        if continuation is None or continuation.next_offset != offset:
            return None
        if self.read_only_cold and self.cache.clock() - continuation.checked_at >= self.settings.read_ahead_ttl:
            return None  # time to look for the archiver's commits and retention (the full path does)
        window = continuation.window()
        end = offset + max_count
        if window is None or end > window.end_offset:
            return None
        view = continuation.view
        if self.read_policy is not ReadPolicy.FORCE and view.hot_min < end and offset < view.hot_max:
            return None  # the hot store holds some of these offsets: the policy may read them there
        hot_span = (view.hot_min, view.hot_max) if view.hot_min < view.hot_max else None
        if self._hot_span(topic, queue_id) != hot_span:
            return None
        cold = self._loaded_cold_file(topic, queue_id)
        if cold is not continuation.cold or cold.consume_queue.held() is not continuation.held:
            return None
        if window.corrupt and any(offset <= bad < end for bad in window.corrupt):
            return None
        if not self.cache.renew(window, max_count):
            return None
        continuation.next_offset = end
        messages = window.messages(offset, end)
        if end == window.end_offset:
            self.cache.read_through(window)
        return GetMessageResult(GetMessageStatus.FOUND, end, view.min_offset, view.max_offset, messages)

    async def _get_messages(
        self, topic: str, queue_id: int, offset: int, max_count: int, message_filter: MessageFilter | None
    ) -> GetMessageResult:
        view = await self.offsets(topic, queue_id)
        if (
            self.read_only_cold
            and self._cold_first(topic, queue_id, offset, view)
            and await self.refresh_cold(topic, queue_id, if_changed=True)
        ):
            # Look for what another process changed (one row when nothing did): later commits, at the view's
            # end, and the archiver's retention anywhere, whose new min offset makes a removed offset
            # OFFSET_TOO_SMALL even where the cache still holds it. Not when the policy serves the offset from
            # the hot store anyway (a consumer reading recent messages would query metadata every call), nor
            # on a call that goes on inside the cached window its last call read (``_continue``, which comes
            # here again at least every read_ahead_ttl).
            view = await self.offsets(topic, queue_id)
        # What the view rests on, taken with it (no await in between), for the next call to go on from.
        cold = self._loaded_cold_file(topic, queue_id)
        held = None if cold is None else cold.consume_queue.held()
        self._continuations.pop((topic, queue_id), None)

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
            self._continuations[(topic, queue_id)] = _Continuation(
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

    def _tier_order(self, topic: str, queue_id: int, offset: int, view: QueueOffsets) -> list[Tier]:
        """The tiers to try for ``offset``, in order, among those that hold it."""
        hot_has, cold_has = view.hot_has(offset), view.cold_has(offset)
        if self.read_policy is ReadPolicy.DISABLE:
            order: list[Tier] = ["hot"]
        elif self._cold_first(topic, queue_id, offset, view):
            order = ["cold", "hot"]
        else:
            order = ["hot", "cold"]
        return [tier for tier in order if (hot_has if tier == "hot" else cold_has)]

    def _cold_first(self, topic: str, queue_id: int, offset: int, view: QueueOffsets) -> bool:
        """Whether the policy reads ``offset`` from cold storage before the hot store (were it in both)."""
        policy = self.read_policy
        if policy is ReadPolicy.DISABLE:
            return False
        return (
            policy is ReadPolicy.FORCE
            or not view.hot_has(offset)
            or (policy is ReadPolicy.NOT_IN_MEM and not self._hot_in_memory(topic, queue_id, offset))
        )

    def _hot_in_memory(self, topic: str, queue_id: int, offset: int) -> bool:
        assert self.hot is not None
        try:
            unit = self.hot.cq_unit(topic, queue_id, offset)
        except NotFoundError:
            return False
        return self.hot.commitlog_max_offset - unit.commitlog_offset <= self.hot_in_memory_bytes

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
    ) -> _Batch | None:
        """Read from the first tier in order that succeeds; None when no tier holds ``offset``."""
        order = self._tier_order(topic, queue_id, offset, view)
        for position, tier in enumerate(order):
            try:
                if tier == "hot":
                    return await self._read_hot(topic, queue_id, offset, view.hot_max, max_count, message_filter)
                return await self._read_cold(
                    topic, queue_id, offset, view.cold_max, max_count, message_filter, read_ahead=read_ahead
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

    # ---- the hot tier ---------------------------------------------------------------------------------

    async def _read_hot(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        hot_max: int,
        max_count: int,
        message_filter: MessageFilter | None,
    ) -> _Batch:
        hot = self.hot
        assert hot is not None
        scan_end = self._scan_end(offset, hot_max, max_count)
        messages: list[FetchedMessage] = []
        position = offset
        while position < scan_end and len(messages) < max_count:
            wanted = max_count - len(messages) if message_filter is None else scan_end - position
            stored = await asyncio.to_thread(
                hot.read_messages,
                topic,
                queue_id,
                position,
                min(wanted, scan_end - position),
                self.settings.read_ahead_size,
            )
            if not stored:
                break
            for item in stored:
                position = item.queue_offset + 1
                message = self._serve(topic, queue_id, item.queue_offset, item.raw, item.unit, "hot", message_filter)
                if message is not None:
                    messages.append(message)
                    if len(messages) == max_count:
                        break
        return _Batch(messages, position)

    # ---- the cold tier --------------------------------------------------------------------------------

    async def _read_cold(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        cold_max: int,
        max_count: int,
        message_filter: MessageFilter | None,
        *,
        read_ahead: bool,
    ) -> _Batch:
        flat_file = await self.cold_file(topic, queue_id)
        if flat_file is None:
            raise NotFoundError(f"cold queue {topic}/{queue_id} is not loaded")
        # A read stops where offsets recorded as lost begin; the next call is answered OFFSET_FOUND_NULL.
        run_end = min(cold_max, flat_file.archived_run_end(offset))
        scan_end = self._scan_end(offset, run_end, max_count)
        messages: list[FetchedMessage] = []
        position = offset
        window: ReadAheadBatch | None = None
        while position < scan_end and len(messages) < max_count:
            needed = max_count - len(messages)
            limit = min(needed if message_filter is None else scan_end - position, scan_end - position)
            run = self.cache.get_run(topic, queue_id, position, limit) if read_ahead else []
            if not run:
                batch = await self._read_window(flat_file, position, scan_end, needed, run_end, use_cache=read_ahead)
                if batch is None:
                    break
                run = [(batch, position, min(batch.end_offset, position + limit))]
            for batch, begin, end in run:
                if message_filter is None:
                    messages += batch.messages(begin, end)
                    position = end
                    window = batch if read_ahead else None
                else:
                    for queue_offset in range(begin, end):
                        position = queue_offset + 1
                        message = self._serve_filtered(batch, queue_offset, message_filter)
                        if message is not None:
                            messages.append(message)
                            if len(messages) == max_count:
                                break
                if position == batch.end_offset:
                    self.cache.read_through(batch)
                if len(messages) == max_count:
                    break
        return _Batch(messages, position, window)

    async def _read_window(
        self, flat_file: FlatMessageFile, offset: int, end: int, needed: int, run_end: int, *, use_cache: bool
    ) -> ReadAheadBatch | None:
        """The window of records from ``offset``: the one prefetched for it, else one read now; None if empty.

        A window read for the cache is cached. For a reader going through the queue (this is its first
        window, or one following the last) the windows after it are read ahead (``_read_ahead``), not
        for one jumping about, whose next window would be read for nothing.
        """
        bypass = not use_cache or self.cache.over_threshold()
        count = min(needed if bypass else max(needed, self.settings.read_ahead_count), end - offset)
        if count <= 0:
            return None
        key = (flat_file.topic, flat_file.queue_id)
        sequential = not bypass and self._window_ends.get(key, offset) == offset
        batch = await self._take_prefetch(flat_file, offset) if use_cache else None
        if batch is None:
            pending = 0

            def split(after: _Follow, size: int) -> bool:
                # The next window's read starts before this one is checked. Until this one is cached, its
                # bytes count against the read-ahead budget as a prefetched window's do.
                nonlocal pending
                self._pending_bytes += size - pending
                pending = size
                return self._read_ahead(flat_file, after, run_end, size)

            try:
                batch = await self._read_records(flat_file, offset, count, on_split=split if sequential else None)
                if batch is not None and not bypass:
                    self.cache.put(batch)
            finally:
                self._pending_bytes -= pending
            if batch is None:
                return None
        elif not bypass:
            self.cache.put(batch)
        if sequential:
            # Keep the queue's windows ahead coming: the one after this, or after the last one read ahead
            # (once that one's read has been split; until then, that read starts the next itself).
            ahead = self._prefetches.get(key)
            after, expected = (
                (ahead[-1].after, ahead[-1].reserved_bytes) if ahead else (_follow_after(batch), len(batch.data))
            )
            if after is not None and self._read_ahead(flat_file, after, run_end, expected):
                await self._hand_off()
        if not bypass:
            self._window_ends[key] = batch.end_offset
        return batch

    async def _hand_off(self) -> None:
        """Let a prefetch just started send its request now, not when the window in hand has been served.

        One loop turn runs its task up to handing the read to a worker thread, and the wait lets that
        thread take the GIL and send (serving or checking a window holds the GIL; the thread would wait
        until that is done).
        """
        await asyncio.sleep(self.settings.prefetch_handoff)

    async def _read_records(
        self,
        flat_file: FlatMessageFile,
        offset: int,
        count: int,
        *,
        follow: _Follow | None = None,
        on_split: _OnSplit | None = None,
    ) -> ReadAheadBatch | None:
        """Up to ``count`` checked records from ``offset``, trimmed from the end to ``read_ahead_size`` bytes
        (never below one): a window.

        A window that follows the last one read of its queue (or ``follow``), or starts at the queue's
        oldest record, is one commit-log read from where that one ended, or from the commit log's start
        (``_read_following``); any other is one consume-queue read and one commit-log read
        (``_read_by_units``). Both read from where a read starts to the end of the storage object
        holding it at most, so a reader going through a queue reads each object once, whole.

        ``on_split`` is told where the record after the window lies as soon as the read has been split,
        before its records are checked; when it has started a read there, that read is handed off.
        """
        key = (flat_file.topic, flat_file.queue_id)
        if follow is None or follow.offset != offset:
            follow = self._follows.get(key)
        if (follow is None or follow.offset != offset) and offset == flat_file.min_offset:
            # A reader starting at the oldest record: it most likely starts the commit log.
            guess = flat_file.first_record_guess()
            follow = None if guess is None else _Follow(offset, guess[0], guess[1])
        batch = None
        if follow is not None and follow.offset == offset:
            batch = await self._read_following(flat_file, offset, count, follow, on_split)
            if batch is None and on_split is not None:
                # Where the split put the next record did not check out: what it started reading goes too.
                self._drop_ahead(key, offset)
        if batch is None:
            batch = await self._read_by_units(flat_file, offset, count, on_split)
        if batch is not None and len(batch):
            self._follows[key] = _follow_after(batch)
        return batch

    async def _split_done(self, on_split: _OnSplit | None, after: _Follow, size: int) -> None:
        if on_split is not None and on_split(after, size):
            await self._hand_off()

    async def _read_following(
        self, flat_file: FlatMessageFile, offset: int, count: int, follow: _Follow, on_split: _OnSplit | None = None
    ) -> ReadAheadBatch | None:
        """The window from ``offset`` split out of the commit log from where the last window ended.

        A queue's cold commit log holds its records back to back in queue-offset order, so no
        consume-queue read is needed: the records are split by their TOTALSIZE, and the window check
        proves each is the message at its queue offset. None when that does not hold (offsets lost
        in between, a segment gone, a damaged record): the consume queue then says what is there.
        """
        # Records like the last window's fill the read exactly: an object store's read stops at the end of
        # the object anyway, and a larger read of a file would hold bytes the window does not use.
        wanted = min(self.settings.read_ahead_size, max(MIN_RECORD_SIZE, math.ceil(follow.record_bytes * count)))
        try:
            data = await flat_file.commit_log.read_from(follow.commitlog_offset, wanted)
        except (NotFoundError, SegmentNotFoundError):
            return None
        self.metrics.cold_reads.labels(file_type=FileType.COMMIT_LOG.value).inc()
        bounds = np.asarray(split_back_to_back(data, count), dtype=np.int64)
        if len(bounds) < 2:
            return None
        records, split_end = len(bounds) - 1, int(bounds[-1])
        after = _Follow(offset + records, follow.commitlog_offset + split_end, split_end / records)
        await self._split_done(on_split, after, len(data))
        units = np.empty(records, dtype=UNIT_DTYPE)
        units["commitlog_offset"] = bounds[:-1] + follow.commitlog_offset
        units["size"] = np.diff(bounds)
        units["tag_hash"] = 0
        batch = check_window(
            flat_file.topic, flat_file.queue_id, offset, data, follow.commitlog_offset, units, tag_hashes_known=False
        )
        return None if batch.corrupt else batch

    async def _read_by_units(
        self, flat_file: FlatMessageFile, offset: int, count: int, on_split: _OnSplit | None = None
    ) -> ReadAheadBatch | None:
        """The window from ``offset`` as its consume-queue units say: one read of each file."""
        consume_queue = flat_file.consume_queue
        position = consume_queue.position_of(offset)
        raw_units = await consume_queue.read_from(position, count * UNIT_SIZE)
        self.metrics.cold_reads.labels(file_type=FileType.CONSUME_QUEUE.value).inc()
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
        kept = max(1, int(np.searchsorted(np.cumsum(sizes), self.settings.read_ahead_size, side="right")))
        units, sizes = units[:kept], sizes[:kept]
        start = int(units["commitlog_offset"][0])
        ends = units["commitlog_offset"].astype(np.int64) + sizes - start
        length = int(ends.max())
        data = await flat_file.commit_log.read_from(start, length)
        if len(data) < length:
            # The commit log's object ended first: keep the records it holds whole, else read exactly.
            held = int(np.argmin(ends <= len(data)))  # the first record it cuts (the last one at least)
            if held:
                units, ends = units[:held], ends[:held]
            else:
                data = await flat_file.read_commit_log(start, length)
        self.metrics.cold_reads.labels(file_type=FileType.COMMIT_LOG.value).inc()
        records, split_end = len(units), int(ends[-1])
        await self._split_done(on_split, _Follow(offset + records, start + split_end, split_end / records), len(data))
        return check_window(flat_file.topic, flat_file.queue_id, offset, data, start, units)

    # ---- prefetching the windows ahead ----------------------------------------------------------------

    def _read_ahead(self, flat_file: FlatMessageFile, after: _Follow, run_end: int, expected_bytes: int) -> bool:
        """Start reading the window at ``after`` in the background, if the queue's windows read ahead end
        there and are fewer than ``_PREFETCH_DEPTH`` (whether it started; see ``_start_prefetch``)."""
        ahead = self._prefetches.get((flat_file.topic, flat_file.queue_id), [])
        if len(ahead) >= _PREFETCH_DEPTH or (ahead and ahead[-1].after != after):
            return False
        return self._start_prefetch(flat_file, after, run_end, expected_bytes)

    def _start_prefetch(self, flat_file: FlatMessageFile, start: _Follow, run_end: int, expected_bytes: int) -> bool:
        """Start reading the window at ``start`` in the background, if it exists and the byte budget allows
        (whether it started).

        The bytes of every window read ahead (each estimated by the window before it) and of windows
        being read now, plus the cache's, stay within the cache's bypass threshold. A queue's windows
        read ahead that nobody came for within ``read_ahead_ttl`` are dropped when the next one starts.
        """
        key = (flat_file.topic, flat_file.queue_id)
        if start.offset >= run_end or self._closed:
            return False
        now = self.cache.clock()
        for stale_key, ahead in list(self._prefetches.items()):
            if now - ahead[0].started > self.settings.read_ahead_ttl:
                self._forget_prefetches(stale_key)
        budget = CACHE_BYPASS_RATIO * self.cache.max_bytes
        if self.cache.size_bytes + self._prefetch_bytes + self._pending_bytes + expected_bytes > budget:
            return False
        prefetch = _Prefetch(start, expected_bytes, now, run_end)
        prefetch.task = asyncio.create_task(self._prefetch(flat_file, prefetch))
        self._in_flight += 1
        prefetch.task.add_done_callback(self._prefetch_done)
        self._prefetches.setdefault(key, []).append(prefetch)
        self._prefetch_bytes += expected_bytes
        return True

    async def _prefetch(self, flat_file: FlatMessageFile, prefetch: _Prefetch) -> ReadAheadBatch | None:
        """A prefetched window's read; once it is split, the window after it is read ahead in turn."""

        def split(after: _Follow, _size: int) -> bool:
            prefetch.after = after
            return self._read_ahead(flat_file, after, prefetch.run_end, prefetch.reserved_bytes)

        count = min(self.settings.read_ahead_count, prefetch.run_end - prefetch.offset)
        return await self._read_records(flat_file, prefetch.offset, count, follow=prefetch.start, on_split=split)

    async def _take_prefetch(self, flat_file: FlatMessageFile, offset: int) -> ReadAheadBatch | None:
        """The window prefetched for ``offset`` (waiting for it; its read error is raised here), else None.

        When the queue's first window read ahead is not at ``offset`` (the reader went elsewhere), they
        are all cancelled.
        """
        key = (flat_file.topic, flat_file.queue_id)
        ahead = self._prefetches.get(key)
        if not ahead:
            return None
        if ahead[0].offset != offset:
            self._forget_prefetches(key)
            return None
        prefetch = ahead.pop(0)
        if not ahead:
            del self._prefetches[key]
        self._prefetch_bytes -= prefetch.reserved_bytes
        return await prefetch.task

    def _prefetch_done(self, task: asyncio.Task[ReadAheadBatch | None]) -> None:
        self._in_flight -= 1
        if not task.cancelled() and task.exception() is not None:
            # Seen here so that it is never reported as lost: its reader gets it from the task, or reads again.
            log.debug("prefetch failed; its reader will get the error", error=str(task.exception()))

    def _drop_ahead(self, key: tuple[str, int], offset: int) -> None:
        """Cancel the queue's windows read ahead that begin after ``offset``."""
        ahead = self._prefetches.get(key, [])
        kept = [prefetch for prefetch in ahead if prefetch.offset <= offset]
        self._cancel(ahead[len(kept) :])
        if kept:
            self._prefetches[key] = kept
        else:
            self._prefetches.pop(key, None)

    def _forget_prefetches(self, key: tuple[str, int]) -> None:
        self._cancel(self._prefetches.pop(key))

    def _cancel(self, prefetches: list[_Prefetch]) -> None:
        for prefetch in prefetches:
            self._prefetch_bytes -= prefetch.reserved_bytes
            prefetch.task.cancel()

    @property
    def prefetching(self) -> int:
        """How many windows are being prefetched or held for their reader."""
        return sum(len(ahead) for ahead in self._prefetches.values())

    def _prefetch_tasks(self) -> list[asyncio.Task[ReadAheadBatch | None]]:
        return [prefetch.task for ahead in self._prefetches.values() for prefetch in ahead]

    async def wait_for_prefetches(self) -> None:
        """Wait until every prefetch started has finished, the ones they started in turn too (their
        outcomes stay for their readers)."""
        while tasks := [task for task in self._prefetch_tasks() if not task.done()]:
            await asyncio.wait(tasks)

    async def close(self) -> None:
        """Cancel the prefetches in flight and wait for them; no prefetch starts afterwards."""
        self._closed = True
        self._continuations.clear()
        tasks = self._prefetch_tasks()
        for key in list(self._prefetches):
            self._forget_prefetches(key)
        await asyncio.gather(*tasks, return_exceptions=True)

    # ---- checking and filtering -----------------------------------------------------------------------

    def _serve_filtered(
        self, batch: ReadAheadBatch, queue_offset: int, message_filter: MessageFilter
    ) -> FetchedMessage | None:
        """A cold record through ``message_filter`` (tag hash first); its check happened when it was read."""
        tag_hashes = batch.tag_hashes
        if tag_hashes is not None and not message_filter.may_match(tag_hashes[queue_offset - batch.first_offset]):
            return None
        batch.raise_if_corrupt(queue_offset, queue_offset + 1)
        raw = batch.raw(queue_offset)
        record = decode(raw, check_crc=False)
        if not message_filter.matches(record):
            return None
        return FetchedMessage(batch.topic, batch.queue_id, queue_offset, "cold", raw, record)

    def _serve(
        self,
        topic: str,
        queue_id: int,
        queue_offset: int,
        raw: bytes,
        unit: ConsumeQueueUnit,
        tier: Tier,
        message_filter: MessageFilter | None,
    ) -> FetchedMessage | None:
        """The checked message, or None when the filter rejects it (on its tag hash before decoding).

        Without a filter the record is not decoded here: ``FetchedMessage.record`` does it on first access.
        """
        if message_filter is not None and not message_filter.may_match(unit.tag_hash):
            return None
        verify_served(topic, queue_id, queue_offset, raw, unit, tier)
        if message_filter is None:
            return FetchedMessage(topic, queue_id, queue_offset, tier, raw)
        record = decode(raw, check_crc=False)
        if not message_filter.matches(record):
            return None
        return FetchedMessage(topic, queue_id, queue_offset, tier, raw, record)

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
        matches: list[int] = []
        if view.hot_min < view.hot_max:
            assert self.hot is not None
            hot = self.hot
            found = await asyncio.to_thread(hot.offset_for_timestamp, topic, queue_id, timestamp, boundary)
            if await asyncio.to_thread(_hot_matches, hot, topic, queue_id, found, timestamp, boundary):
                matches.append(found)
        if view.cold_min < view.cold_max:
            flat_file = await self.cold_file(topic, queue_id)
            assert flat_file is not None
            found = await flat_file.find_queue_offset(
                timestamp, BoundaryType.LOWER if boundary == "lower" else BoundaryType.UPPER
            )
            if flat_file.min_offset <= found < flat_file.archived_offset:
                stamp = await flat_file.store_timestamp_of(await flat_file.consume_queue.read_unit(found))
                if (stamp >= timestamp) if boundary == "lower" else (stamp <= timestamp):
                    matches.append(found)
        if boundary == "lower":
            return min(matches) if matches else view.max_offset
        return max(matches) if matches else view.min_offset


def _hot_matches(
    hot: LocalMessageStore, topic: str, queue_id: int, offset: int, timestamp: int, boundary: Boundary
) -> bool:
    """Whether the hot store's answer is a real match rather than its 'none' fallback."""
    if not hot.min_offset(topic, queue_id) <= offset < hot.max_offset(topic, queue_id):
        return False
    stamp = hot.store_timestamp(topic, queue_id, offset)
    return stamp >= timestamp if boundary == "lower" else stamp <= timestamp


def verify_served(topic: str, queue_id: int, queue_offset: int, raw: bytes, unit: ConsumeQueueUnit, tier: Tier) -> None:
    """Check one record split out of a read without decoding it: size, magic, body CRC and identity.

    Any problem is a CorruptRecordError naming the topic, queue and queue offset.
    """

    def corrupt(reason: str) -> CorruptRecordError:
        return CorruptRecordError(
            f"corrupt record in the {tier} tier (commit-log offset {unit.commitlog_offset}): {reason}",
            location=f"{topic}/{queue_id}",
            offset=queue_offset,
        )

    if len(raw) != unit.size or len(raw) < MIN_RECORD_SIZE:
        raise corrupt(f"the consume queue says {unit.size} bytes but {len(raw)} were read")
    total, magic = _HEAD.unpack_from(raw)
    if magic not in (MAGIC_V1, MAGIC_V2):
        raise corrupt(f"bad magic code 0x{magic:08x}")
    if total != unit.size:
        raise corrupt(f"TOTALSIZE {total} but the consume queue says {unit.size}")
    try:
        fields = verify_record(raw, check_crc=False)
    except CorruptRecordError as exc:
        raise corrupt(str(exc)) from exc
    computed = body_crc(memoryview(raw)[fields.body_at : fields.body_at + fields.body_len])
    if computed != fields.body_crc:
        raise corrupt(f"body CRC mismatch: stored {fields.body_crc}, computed {computed}")
    topic_raw = raw[fields.topic_at : fields.topic_at + fields.topic_len]
    if fields.queue_id != queue_id or fields.queue_offset != queue_offset or topic_raw != _topic_bytes(topic):
        owner = topic_raw.decode("utf-8", errors="replace")
        raise corrupt(f"the record belongs to {owner}/{fields.queue_id} at queue offset {fields.queue_offset}")


@functools.lru_cache(maxsize=4096)
def _topic_bytes(topic: str) -> bytes:
    return topic.encode("utf-8")


def check_record(
    topic: str, queue_id: int, queue_offset: int, raw: bytes, unit: ConsumeQueueUnit, tier: Tier
) -> MessageRecord:
    """``verify_served``, then the decoded record. Any problem is a CorruptRecordError naming where."""
    verify_served(topic, queue_id, queue_offset, raw, unit, tier)
    try:
        return decode(raw, check_crc=False)
    except CorruptRecordError as exc:
        raise CorruptRecordError(
            f"corrupt record in the {tier} tier (commit-log offset {unit.commitlog_offset}): {exc}",
            location=f"{topic}/{queue_id}",
            offset=queue_offset,
        ) from exc


def _validate_queue(topic: str, queue_id: int) -> None:
    validate_topic(topic)
    if isinstance(queue_id, bool) or not isinstance(queue_id, int) or queue_id < 0:
        raise InvalidQueueError(f"queue id must be a non-negative integer, not {queue_id!r}")
