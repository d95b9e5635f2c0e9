"""The read-ahead cache: one batch per read ahead, bounded in bytes, expiring after last access, bypassed above
80% full, with metrics counted in records."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.backends import ProviderBackend
from tests.read.helpers import append_records, config_for_backend, counting_reads, make_record
from tieredstore.flat.served import ReadAheadBatch
from tieredstore.formats.naming import FileType
from tieredstore.metrics import Metrics
from tieredstore.read.cache import CachedRun, ReadAheadCache
from tieredstore.read.results import MessageFilter
from tieredstore.store import AsyncTieredMessageStore

TOPIC = "Cached"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _batch(offset: int, size: int, records: int = 1) -> ReadAheadBatch:
    """``records`` records of ``size`` bytes each, read ahead from ``offset`` of queue T/0."""
    starts = [n * size for n in range(records)]
    return ReadAheadBatch("T", 0, offset, bytes(size * records), starts, [s + size for s in starts], [0] * records)


def _offsets(run: list[CachedRun]) -> list[int]:
    return [offset for _batch, begin, end in run for offset in range(begin, end)]


def _value(counter: object) -> float:
    return float(counter._value.get())  # type: ignore[attr-defined]


def test_cache_is_bounded_in_bytes_not_entries() -> None:
    metrics = Metrics()
    cache = ReadAheadCache(10_000, 15.0, metrics=metrics, clock=FakeClock())
    for offset in range(30):
        cache.put(_batch(offset, 1_000))
    assert cache.size_bytes <= 10_000 and len(cache) == 10
    assert _value(metrics.cache_evictions) == 20
    # the newest entries stay; the oldest were evicted
    assert _offsets(cache.get_run("T", 0, 20, 10)) == list(range(20, 30))
    assert cache.get_run("T", 0, 0, 5) == []
    # an entry larger than the whole bound is not cached at all (and evicts nothing)
    cache.put(_batch(99, 20_000))
    assert cache.get_run("T", 0, 99, 1) == [] and len(cache) == 10


def test_entries_expire_ttl_after_their_last_access() -> None:
    clock, metrics = FakeClock(), Metrics()
    cache = ReadAheadCache(1 << 20, 15.0, metrics=metrics, clock=clock)
    for offset in range(4):
        cache.put(_batch(offset, 100))
    clock.now += 10
    assert len(_offsets(cache.get_run("T", 0, 0, 2))) == 2  # offsets 0 and 1 renewed at t+10
    clock.now += 10  # t+20: 2 and 3 were last touched at t, 0 and 1 at t+10
    assert cache.get_run("T", 0, 2, 2) == []
    assert _offsets(cache.get_run("T", 0, 0, 4)) == [0, 1]
    assert len(cache) == 2 and _value(metrics.cache_evictions) == 2
    clock.now += 15.5
    assert len(cache) == 0 and cache.size_bytes == 0


def test_bypass_threshold_is_eighty_percent_of_the_byte_bound() -> None:
    cache = ReadAheadCache(10_000, 15.0, clock=FakeClock())
    for offset in range(8):
        cache.put(_batch(offset, 1_000))
    assert not cache.over_threshold()  # exactly 80%
    cache.put(_batch(8, 1))
    assert cache.over_threshold()
    assert ReadAheadCache(0, 15.0).over_threshold()  # a disabled cache is always bypassed


def test_one_batch_serves_any_run_inside_it_and_is_evicted_whole() -> None:
    metrics = Metrics()
    cache = ReadAheadCache(10_000, 15.0, metrics=metrics, clock=FakeClock())
    cache.put(_batch(100, 100, records=50))  # offsets 100..149, 5,000 bytes
    run = cache.get_run("T", 0, 120, 10)
    assert _offsets(run) == list(range(120, 130))
    assert all(
        len(batch.raw(offset)) == 100 and batch.unit(offset).size == 100
        for batch, begin, end in run
        for offset in range(begin, end)
    )
    assert _offsets(cache.get_run("T", 0, 145, 10)) == list(range(145, 150)), "stops at its end"
    assert cache.get_run("T", 0, 150, 1) == [] and cache.get_run("T", 1, 120, 1) == []
    assert len(cache) == 50 and cache.size_bytes == 5_000
    cache.put(_batch(200, 100, records=60))  # 6,000 more bytes: the older batch goes, all 50 records at once
    assert cache.get_run("T", 0, 100, 1) == [] and len(cache) == 60
    assert _value(metrics.cache_evictions) == 50
    assert _value(metrics.cache_hits) == 15 and _value(metrics.cache_misses) == 3


def test_a_batch_is_released_once_readers_have_been_served_its_last_record() -> None:
    metrics = Metrics()
    cache = ReadAheadCache(10_000, 15.0, metrics=metrics, clock=FakeClock(), readers=2)
    batch = _batch(0, 100, records=10)
    cache.put(batch)
    cache.read_through(batch)  # the first of two readers is through it: it stays for the second
    assert _offsets(cache.get_run("T", 0, 0, 10)) == list(range(10))
    cache.read_through(batch)
    assert cache.get_run("T", 0, 0, 1) == [] and len(cache) == 0 and cache.size_bytes == 0
    assert _value(metrics.cache_released) == 10 and _value(metrics.cache_evictions) == 0
    assert metrics.cache_bytes._value.get() == 0
    # a batch no longer cached (replaced by a re-read of its place) is not released in the other's stead
    replaced, current = _batch(20, 100, records=5), _batch(20, 100, records=5)
    cache.put(replaced)
    cache.put(current)
    cache.read_through(replaced)
    cache.read_through(replaced)
    assert _offsets(cache.get_run("T", 0, 20, 5)) == list(range(20, 25))
    # readers=0 keeps batches until they expire or are evicted
    keeping = ReadAheadCache(10_000, 15.0, clock=FakeClock(), readers=0)
    kept = _batch(0, 100, records=10)
    keeping.put(kept)
    for _ in range(3):
        keeping.read_through(kept)
    assert len(keeping) == 10


def test_a_batch_found_last_that_was_replaced_or_evicted_is_not_served() -> None:
    """Lookups start with the batch found last; one replaced by a shorter batch at the same offset, or
    evicted, must answer for what the cache holds now."""
    cache = ReadAheadCache(10_000, 15.0, clock=FakeClock())
    cache.put(_batch(0, 100, records=10))  # 0..9
    cache.put(_batch(10, 100, records=10))  # 10..19
    assert _offsets(cache.get_run("T", 0, 5, 2)) == [5, 6]
    assert _offsets(cache.get_run("T", 0, 7, 6)) == [7, 8, 9, 10, 11, 12], "runs on into the next batch"
    assert _offsets(cache.get_run("T", 0, 3, 1)) == [3], "back in an earlier batch"
    cache.put(_batch(0, 100, records=4))  # re-read shorter: 0..3 only
    assert cache.get_run("T", 0, 6, 1) == []
    assert _offsets(cache.get_run("T", 0, 2, 5)) == [2, 3]
    for offset in range(100, 200):  # 10,000 bytes: evicts everything else
        cache.put(_batch(offset, 100))
    assert cache.get_run("T", 0, 2, 1) == [] and cache.get_run("T", 0, 12, 1) == []
    cache.discard_queue("T", 0)
    assert cache.get_run("T", 0, 150, 1) == []


async def test_a_full_cache_is_bypassed_reading_only_what_is_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    records = [make_record(TOPIC, 0, n, body=bytes(400)) for n in range(400)]
    record_size = len(records[0])
    # room for 100 records: a 4096-message read-ahead would overflow it at once. Windows read through are
    # kept (as for consumer groups that each read them), so that the cache stays full
    config = config_for_backend(
        tmp_path,
        ProviderBackend("memory", f"memory://bypass-{tmp_path.name}"),
        read={"read_ahead_cache_bytes": 100 * record_size, "read_ahead_count": 90, "read_ahead_readers": 0},
    )
    clock = FakeClock()
    with counting_reads(monkeypatch) as reads:
        async with AsyncTieredMessageStore.open(config, hot=False, cache_clock=clock) as store:
            await append_records(store.runtime, TOPIC, 0, records, index=False)
            cache = store.fetcher.cache
            reads.clear()
            # 90 records read ahead (from the commit log's start: the oldest record) fill the cache to 90%:
            # above the 80% threshold
            assert [m.queue_offset for m in (await store.get_messages(TOPIC, 0, 0, 10)).messages] == list(range(10))
            assert reads.count() == 1 and len(cache) == 90 and cache.over_threshold()
            reads.clear()
            # from the cache while it has them ...
            assert len((await store.get_messages(TOPIC, 0, 10, 80)).messages) == 80
            assert reads.count() == 0
            # ... then, still above 80%, a miss reads just the 5 asked for and caches nothing
            result = await store.get_messages(TOPIC, 0, 90, 5)
            assert [m.queue_offset for m in result.messages] == list(range(90, 95))
            assert reads.count() == 1 and len(cache) == 90
            # it follows the window before it: one commit-log read from where that ended, sized for the 5
            (log_read,) = reads.reads
            assert log_read[0] is FileType.COMMIT_LOG and 5 * record_size <= log_read[3] < 10 * record_size
            # once the entries expire the cache is under the threshold and reads ahead again
            clock.now += 16
            reads.clear()
            await store.get_messages(TOPIC, 0, 95, 5)
            (log_read,) = reads.reads
            assert log_read[0] is FileType.COMMIT_LOG and log_read[3] >= 90 * record_size
            assert len(cache) == 90
            metrics = store.runtime.metrics
            assert _value(metrics.cache_hits) == 80
            assert _value(metrics.cache_misses) == 3
            assert _value(metrics.cache_evictions) == 90
            assert metrics.cache_bytes._value.get() == 90 * record_size


async def test_cache_ttl_decides_whether_a_consumer_coming_back_reads_storage_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = config_for_backend(
        tmp_path, ProviderBackend("memory", f"memory://ttl-{tmp_path.name}"), read={"read_ahead_ttl": 15.0}
    )
    clock = FakeClock()
    with counting_reads(monkeypatch) as reads:
        async with AsyncTieredMessageStore.open(config, hot=False, cache_clock=clock) as store:
            await append_records(store.runtime, TOPIC, 0, [make_record(TOPIC, 0, n) for n in range(100)], index=False)
            reads.clear()
            await store.get_messages(TOPIC, 0, 0, 10)  # reads 0..99 ahead as one batch, one commit-log read
            assert reads.count() == 1
            clock.now += 14
            await store.get_messages(TOPIC, 0, 10, 10)  # a hit renews the batch
            clock.now += 14
            assert reads.count() == 1
            assert len((await store.get_messages(TOPIC, 0, 20, 10)).messages) == 10
            assert reads.count() == 1  # the batch was touched 14 s ago
            clock.now += 16
            assert len((await store.get_messages(TOPIC, 0, 30, 10)).messages) == 10
            assert reads.count() == 3  # untouched for 16 s: gone, read from storage again (units, then records)


@pytest.mark.parametrize(
    ("readers", "filtered", "batch"),
    [(1, False, 32), (2, False, 32), (1, False, 25), (2, False, 25), (1, True, 32), (2, True, 32)],
)
async def test_windows_read_through_by_every_reader_leave_the_cache_and_storage_is_read_once_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, readers: int, filtered: bool, batch: int
) -> None:
    """``read_ahead_readers`` consumer groups going through a queue: each window is read from storage once,
    served to every group from the cache, and released when the last one is through it, so a cache
    holds the windows ahead of the readers, not the queue they have read. Batches of 25 end exactly at
    each window's end (the fast path for a reader going on inside a window); a filter that passes only
    even offsets reads through windows as well."""
    wanted = MessageFilter(predicate=lambda record: record.queue_offset % 2 == 0) if filtered else None
    records = [make_record(TOPIC, 0, n, body=bytes(200)) for n in range(300)]
    config = config_for_backend(
        tmp_path,
        ProviderBackend("memory", f"memory://release-{tmp_path.name}"),
        read={"read_ahead_count": 100, "read_ahead_readers": readers},
    )

    def expected(begin: int, end: int) -> list[int]:
        return [offset for offset in range(begin, end) if not filtered or offset % 2 == 0]

    async def consume(store: AsyncTieredMessageStore, begin: int, end: int) -> list[int]:
        served: list[int] = []
        offset = begin
        # At the queue's end a filtering reader asks once more after its last match and scans the rest.
        while offset < end and (expected(offset, end) or end == len(records)):
            count = max(1, min(batch, len(expected(offset, end))))
            result = await store.get_messages(TOPIC, 0, offset, count, wanted)
            served += [message.queue_offset for message in result.messages]
            offset = result.next_begin_offset
        return served

    with counting_reads(monkeypatch) as reads:
        async with AsyncTieredMessageStore.open(config, hot=False) as store:
            await append_records(store.runtime, TOPIC, 0, records, index=False)
            reads.clear()
            cache, metrics = store.fetcher.cache, store.runtime.metrics
            # every group reads the first window and half the second, one after another
            for _group in range(readers):
                assert await consume(store, 0, 150) == expected(0, 150)
            await store.fetcher.wait_for_prefetches()
            # window [0, 100) is gone; [100, 200), half read, is still cached and [200, 300) is read ahead
            assert cache.get_run(TOPIC, 0, 0, 1) == []
            assert _offsets(cache.get_run(TOPIC, 0, 100, 200)) == list(range(100, 200))
            assert store.fetcher.prefetching == 1
            assert _value(metrics.cache_released) == 100
            for _group in range(readers):
                assert await consume(store, 150, 300) == expected(150, 300)
            assert len(cache) == 0 and cache.size_bytes == 0
            assert _value(metrics.cache_released) == 300
            assert reads.count(FileType.COMMIT_LOG) == 3, "each window read from storage once, for every group"
