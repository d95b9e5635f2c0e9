"""The read-ahead cache: cold windows kept for the readers going through them, bounded in bytes and time."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from tieredstore.flat.cold_reader import CACHE_BYPASS_RATIO
from tieredstore.flat.served import ReadAheadBatch
from tieredstore.metrics import Metrics

__all__ = ["CACHE_BYPASS_RATIO", "CachedRun", "ReadAheadCache"]

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
    on every page, a real share of a cold reader's CPU). RocketMQ releases a
    cached message once each consumer group active on the queue has read it; this store is not told
    the groups, so ``readers`` says how many there are.
    ``max_bytes`` 0 turns the cache off. ``clock`` is injectable for tests (monotonic seconds). Sizes,
    lengths and the eviction and release metrics count records, as a consumer sees them.

    The batches are kept in the order they were last read, so the oldest is first both to expire and
    to be evicted; a hit is a dictionary move (a general TTL cache costs far more per call).
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
