"""Read-ahead windows: the next one is fetched in the background, and each is checked once, when it is read."""

from __future__ import annotations

import asyncio
import gc
import random
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from tests.fixtures.backends import ProviderBackend
from tests.read.helpers import ReadLog, append_records, config_for_backend, counting_reads, make_record
from tieredstore.errors import CorruptRecordError, StorageUnavailableError
from tieredstore.fetcher import GetMessageStatus
from tieredstore.flat import FlatMessageFile
from tieredstore.formats.message import POS_MAGIC
from tieredstore.formats.naming import FileType
from tieredstore.providers.memory import MemoryProvider
from tieredstore.store import AsyncTieredMessageStore

TOPIC = "Prefetched"
WINDOW = 100
BODY = 200


@asynccontextmanager
async def _store(
    tmp_path: Path,
    reads: ReadLog,
    records: int,
    *,
    cache_records: int | None = None,
    posix: bool = False,
    readers: int | None = None,
) -> AsyncIterator[tuple[AsyncTieredMessageStore, FlatMessageFile, str]]:
    """A cold-only store holding ``records`` messages of queue 0, windows of 100, the read log cleared.

    ``cache_records``: a read-ahead cache with room for that many records (default: the default bound).
    ``posix``: cold storage is a directory (read in worker threads), not the memory provider.
    ``readers``: ``read_ahead_readers`` (default: the default, 1).
    """
    url = str(tmp_path / "cold") if posix else f"memory://prefetch-{tmp_path.name}"
    read: dict[str, float] = {"read_ahead_count": WINDOW}
    if readers is not None:
        read["read_ahead_readers"] = readers
    if cache_records is not None:
        read["read_ahead_cache_bytes"] = cache_records * len(make_record(TOPIC, 0, 0, body=bytes(BODY)))
    config = config_for_backend(tmp_path, ProviderBackend("posix" if posix else "memory", url), read=read)
    async with AsyncTieredMessageStore.open(config, hot=False, owns_cold=True) as store:
        encoded = [make_record(TOPIC, 0, n, body=bytes([n % 251]) * BODY) for n in range(records)]
        flat_file = await append_records(store.runtime, TOPIC, 0, encoded, index=False)
        reads.clear()
        yield store, flat_file, url


@pytest.fixture
async def unhandled() -> AsyncIterator[list[dict[str, object]]]:
    """What reaches the event loop's exception handler (a task's error nobody retrieved, a failed callback)."""
    loop = asyncio.get_running_loop()
    seen: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _loop, context: seen.append(context))
    yield seen
    loop.set_exception_handler(None)


def _flip(url: str, flat_file: FlatMessageFile, commitlog_offset: int) -> None:
    """Change one committed commit-log byte where the memory provider keeps it."""
    segment = flat_file.commit_log.segments[0]
    MemoryProvider(url).volume[segment.key][commitlog_offset - segment.base_offset] ^= 0xFF


def _value(counter: object) -> float:
    return float(counter._value.get())  # type: ignore[attr-defined]


async def _consume(store: AsyncTieredMessageStore, offset: int, end: int, batch: int = 32) -> list[int]:
    served: list[int] = []
    while offset < end:
        result = await store.get_messages(TOPIC, 0, offset, min(batch, end - offset))
        assert result.status is GetMessageStatus.FOUND
        served += [message.queue_offset for message in result.messages]
        offset = result.next_begin_offset
    return served


async def test_the_windows_ahead_are_read_in_the_background_and_reads_stay_one_per_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with counting_reads(monkeypatch) as reads:
        async with _store(tmp_path, reads, 350) as (store, _flat_file, _url):
            first = await store.get_messages(TOPIC, 0, 0, 10)
            assert [m.queue_offset for m in first.messages] == list(range(10))
            # each read started the next as soon as it was split, and the call gave them turns of the event loop:
            # two windows ahead of the reader have been read (on S3, their GETs went out one after the other
            # while the reader's window was checked and served, not when the reader reached them)
            assert reads.count(FileType.COMMIT_LOG) == 3
            await store.fetcher.wait_for_prefetches()
            assert store.fetcher.prefetching == 2
            # the first window [0, 100) from the commit log's start (its oldest record is there) and, without
            # anyone asking yet, [100, 200) and [200, 300), each from where the one before ended: no units read
            assert reads.count(FileType.CONSUME_QUEUE) == 0
            first_log, second_log, third_log = [read for read in reads.reads if read[0] is FileType.COMMIT_LOG]
            assert second_log[2] == first_log[2] + first_log[3]
            assert third_log[2] == second_log[2] + second_log[3]
            reads.clear()
            assert await _consume(store, 10, 100) == list(range(10, 100))
            assert reads.count() == 0
            # reaching a prefetched window reads nothing itself but starts the one two windows on
            crossing = await store.get_messages(TOPIC, 0, 100, 32)
            assert [m.queue_offset for m in crossing.messages] == list(range(100, 132))
            await store.fetcher.wait_for_prefetches()
            assert reads.count(FileType.CONSUME_QUEUE) == 0 and reads.count(FileType.COMMIT_LOG) == 1
            assert store.fetcher.prefetching == 2
            assert await _consume(store, 132, 350) == list(range(132, 350))
            await store.fetcher.wait_for_prefetches()
            # since the clear, only window [300, 350); nothing read past the end
            assert reads.count(FileType.CONSUME_QUEUE) == 0 and reads.count(FileType.COMMIT_LOG) == 1
            assert store.fetcher.prefetching == 0
            # hits and misses count as they did before windows were prefetched: one miss per window
            metrics = store.runtime.metrics
            assert _value(metrics.cache_misses) == 4
            # not hits: what each miss served from its window (10 at 0, 32 at 100, 28 at 200, 24 at 300)
            assert _value(metrics.cache_hits) == 350 - (10 + 32 + 28 + 24)


async def test_a_reader_starting_a_prefetch_has_its_read_sent_before_it_is_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """POSIX reads run in worker threads, which need the GIL that serving the window holds: the call that
    starts a prefetch is served only once the prefetch has handed its read to storage, so the read goes on
    while the consumer works through what it was served."""
    with counting_reads(monkeypatch) as reads:
        async with _store(tmp_path, reads, 350, posix=True) as (store, _flat_file, _url):
            first = await store.get_messages(TOPIC, 0, 0, 10)
            assert [m.queue_offset for m in first.messages] == list(range(10))
            # the read of the next window was sent before the reader got its answer
            assert reads.count(FileType.COMMIT_LOG) >= 2
            await store.fetcher.wait_for_prefetches()
            # and both windows ahead were read meanwhile (the second one started by the first's read)
            assert reads.count(FileType.COMMIT_LOG) == 3
            (ahead,) = [reader.prefetches for reader in store.fetcher.prefetches.ahead.values()]
            assert [prefetch.offset for prefetch in ahead] == [100, 200]
            assert ahead[1].task.done()  # read, split and checked too
            assert await _consume(store, 10, 100) == list(range(10, 100))
            reads.clear()
            crossing = await store.get_messages(TOPIC, 0, 100, 32)
            assert [m.queue_offset for m in crossing.messages] == list(range(100, 132))
            assert reads.count(FileType.COMMIT_LOG) == 1  # the window after it, prefetched in turn


async def test_a_reader_going_on_inside_a_window_gets_what_working_each_call_out_gives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Calls that go on from where the last one ended are served from its window directly; every answer
    (status, next offset, min and max, each message's offset, tier and bytes) is the one the full path gives."""
    chooser = random.Random(7)
    with counting_reads(monkeypatch) as reads:
        async with _store(tmp_path, reads, 450) as (store, _flat_file, _url):
            asked: list[tuple[int, int]] = []
            answers = []
            offset = 0
            while True:
                count = chooser.choice([1, 7, 32, 32, 32, 50, 99])
                result = await store.get_messages(TOPIC, 0, offset, count)
                asked.append((offset, count))
                answers.append(result)
                if result.status is not GetMessageStatus.FOUND:
                    break
                offset = result.next_begin_offset
            assert offset == 450 and answers[-1].status is GetMessageStatus.OFFSET_OVERFLOW_ONE
            # each window was read once (450 records, windows of 100): going on from a window reads nothing
            await store.fetcher.wait_for_prefetches()
            assert reads.count(FileType.COMMIT_LOG) == 5 and reads.count(FileType.CONSUME_QUEUE) == 0
            for (at, count), answer in zip(asked, answers, strict=True):
                full = await store.fetcher._get_messages(TOPIC, 0, at, count, None)
                assert (full.status, full.next_begin_offset, full.min_offset, full.max_offset) == (
                    answer.status,
                    answer.next_begin_offset,
                    answer.min_offset,
                    answer.max_offset,
                )
                assert [(m.queue_offset, m.tier, m.raw) for m in full.messages] == [
                    (m.queue_offset, m.tier, m.raw) for m in answer.messages
                ]


async def test_a_reader_going_on_inside_a_window_sees_what_was_archived_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The answer served from the window carries the queue's offsets as they are now, not as they were."""
    with counting_reads(monkeypatch) as reads:
        async with _store(tmp_path, reads, 50) as (store, _flat_file, _url):
            first = await store.get_messages(TOPIC, 0, 0, 10)
            assert (first.status, first.max_offset) == (GetMessageStatus.FOUND, 50)
            more = [make_record(TOPIC, 0, n, body=bytes([n % 251]) * BODY) for n in range(50, 80)]
            await append_records(store.runtime, TOPIC, 0, more, index=False)
            second = await store.get_messages(TOPIC, 0, 10, 10)
            assert [m.queue_offset for m in second.messages] == list(range(10, 20))
            assert second.max_offset == 80
            # and a window the cache dropped is read again, not served from where the reader was
            store.fetcher.cache.clear()
            reads.clear()
            third = await store.get_messages(TOPIC, 0, 20, 10)
            assert [m.queue_offset for m in third.messages] == list(range(20, 30))
            assert reads.count(FileType.COMMIT_LOG) == 1


async def test_prefetching_stays_within_the_cache_bypass_threshold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # room for 250 records: the bypass threshold (80%) is 200, two windows; windows read through are kept
    # (as for two consumer groups), so that the cache fills
    with counting_reads(monkeypatch) as reads:
        async with _store(tmp_path, reads, 400, cache_records=250, readers=0) as (store, _flat_file, _url):
            await store.get_messages(TOPIC, 0, 0, 32)
            await store.fetcher.wait_for_prefetches()
            assert reads.count(FileType.COMMIT_LOG) == 2  # window 1 cached, window 2 fits beside it
            assert await _consume(store, 32, 132) == list(range(32, 132))
            # window 2 is cached now too: a third would pass the threshold, so nothing is read ahead
            await store.fetcher.wait_for_prefetches()
            assert reads.count(FileType.COMMIT_LOG) == 2 and store.fetcher.prefetching == 0
            assert await _consume(store, 132, 200) == list(range(132, 200))
            assert reads.count(FileType.COMMIT_LOG) == 2
            # the reader of window 3 reads it itself, evicting window 1
            assert await _consume(store, 200, 201) == [200]
            assert reads.count(FileType.COMMIT_LOG) == 3
            assert len(store.fetcher.cache) == 200


async def test_a_corrupt_record_in_a_prefetched_window_fails_only_its_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with counting_reads(monkeypatch) as reads:
        async with _store(tmp_path, reads, 300) as (store, flat_file, url):
            units = await flat_file.read_units(0, 300)
            _flip(url, flat_file, units[150].commitlog_offset + len(make_record(TOPIC, 0, 150, body=bytes(BODY))) - 40)
            _flip(url, flat_file, units[170].commitlog_offset + POS_MAGIC)
            assert await _consume(store, 0, 128) == list(range(128))  # window 2 was prefetched meanwhile
            with pytest.raises(CorruptRecordError, match="body CRC mismatch") as crc_error:
                await store.get_messages(TOPIC, 0, 128, 32)
            assert (crc_error.value.location, crc_error.value.offset) == (f"{TOPIC}/0", 150)
            assert f"in {TOPIC}/0 at offset 150" in str(crc_error.value)
            await store.fetcher.wait_for_prefetches()
            reads.clear()
            # the records before it are served, from the window already read; asking again raises again
            assert await _consume(store, 128, 150, batch=22) == list(range(128, 150))
            with pytest.raises(CorruptRecordError, match="body CRC mismatch"):
                await store.get_messages(TOPIC, 0, 150, 1)
            assert [m.queue_offset for m in (await store.get_messages(TOPIC, 0, 151, 19)).messages] == list(
                range(151, 170)
            )
            with pytest.raises(CorruptRecordError, match="bad magic code") as magic_error:
                await store.get_messages(TOPIC, 0, 160, 32)
            assert magic_error.value.offset == 170
            assert await _consume(store, 171, 300) == list(range(171, 300))
            await store.fetcher.wait_for_prefetches()
            # every window was read once, ahead of its reader: failing records are not read again
            assert reads.count() == 0


async def test_a_failed_prefetch_raises_to_the_reader_of_its_window_then_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unhandled: list[dict[str, object]]
) -> None:
    with counting_reads(monkeypatch) as reads:
        async with _store(tmp_path, reads, 250) as (store, _flat_file, _url):
            reads.failing = True
            with pytest.raises(StorageUnavailableError):
                await store.get_messages(TOPIC, 0, 0, 32)
            # the outage starts after the window's read: the prefetch of the next window that its call starts fails
            reads.spared = 1
            await store.get_messages(TOPIC, 0, 0, 32)
            await store.fetcher.wait_for_prefetches()
            reads.failing = False
            assert await _consume(store, 32, 100) == list(range(32, 100))
            with pytest.raises(StorageUnavailableError, match="injected read outage"):
                await store.get_messages(TOPIC, 0, 100, 32)
            assert store.fetcher.prefetching == 0
            reads.clear()
            # the error was its reader's; asking again reads the window anew
            assert await _consume(store, 100, 250) == list(range(100, 250))
            assert reads.count(FileType.COMMIT_LOG) == 2
            # a prefetch that fails while its reader goes elsewhere is dropped without a trace
            store.fetcher.cache.clear()
            reader = store.fetcher.queues.of(TOPIC, 0).cold
            assert reader is not None
            reader.window_end = None  # as for a reader starting at the queue's oldest record
            reads.failing, reads.spared = True, 1
            await store.get_messages(TOPIC, 0, 0, 1)
            assert store.fetcher.prefetching == 1
            await store.fetcher.wait_for_prefetches()
            reads.failing = False
            assert [m.queue_offset for m in (await store.get_messages(TOPIC, 0, 220, 2)).messages] == [220, 221]
    gc.collect()  # a task whose error nobody retrieved reports it when it is collected
    assert unhandled == []


async def test_close_and_a_jump_elsewhere_cancel_the_prefetch_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unhandled: list[dict[str, object]]
) -> None:
    with counting_reads(monkeypatch) as reads:
        async with _store(tmp_path, reads, 500) as (store, _flat_file, _url):
            reads.gate, reads.spared = asyncio.Event(), 1  # after the window's read: the prefetch of [100, 200) hangs
            await store.get_messages(TOPIC, 0, 0, 32)
            await asyncio.sleep(0.01)
            (stuck,) = store.fetcher.prefetches.tasks()
            assert not stuck.done()
            reads.gate = None
            # the reader jumps past it: the prefetch is cancelled and the window there read; a reader jumping
            # about gets no prefetch, its next window would likely be read for nothing
            reads.clear()
            jumped = await store.get_messages(TOPIC, 0, 250, 5)
            assert [m.queue_offset for m in jumped.messages] == list(range(250, 255))
            await asyncio.sleep(0.01)
            assert stuck.cancelled() and store.fetcher.prefetching == 0
            assert reads.count(FileType.COMMIT_LOG) == 1
            # going on from that window is sequential again: the window after the next one is prefetched
            assert await _consume(store, 255, 350) == list(range(255, 350))
            reads.gate, reads.spared = asyncio.Event(), 1  # after the window's read: the prefetch of [450, 500) hangs
            assert [m.queue_offset for m in (await store.get_messages(TOPIC, 0, 350, 2)).messages] == [350, 351]
            await asyncio.sleep(0.01)
            (in_flight,) = store.fetcher.prefetches.tasks()
            assert not in_flight.done()
        # leaving the store closed it: the prefetch was cancelled and waited for
        assert in_flight.cancelled() and store.fetcher.prefetching == 0
    gc.collect()  # a task whose error nobody retrieved reports it when it is collected
    assert unhandled == []


async def test_a_reader_served_from_the_cache_lets_worker_threads_run_while_prefetches_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A provider's worker thread needs the GIL each time a piece of its response arrives. A reader served
    from the cache holds it, and the interpreter makes a busy thread let go only every switch interval
    (5 ms): while a prefetch is in flight, the reader hands the GIL over for 50 µs once a millisecond instead,
    the event loop idle meanwhile (a loop turn alone drops and retakes it at once, which starves the
    waiting thread)."""
    with counting_reads(monkeypatch) as reads:
        # the reader goes through the first window again and again: it stays cached (readers=0)
        async with _store(tmp_path, reads, 300, readers=0) as (store, _flat_file, _url):
            reads.gate, reads.spared = asyncio.Event(), 1  # after the window's read: the prefetch of [100, 200) hangs
            await store.get_messages(TOPIC, 0, 0, 32)
            assert store.fetcher.prefetching == 1
            stop = threading.Event()
            wakes = 0

            def worker() -> None:  # like a thread reading a response: waits on I/O, then needs the GIL
                nonlocal wakes
                while not stop.is_set():
                    time.sleep(0.0002)
                    wakes += 1

            thread = threading.Thread(target=worker)
            thread.start()
            try:
                started = time.perf_counter()
                while time.perf_counter() - started < 0.3:
                    for offset in range(0, 100, 25):  # in the window read, again and again: never a read
                        result = await store.get_messages(TOPIC, 0, offset, 25)
                        assert result.status is GetMessageStatus.FOUND
            finally:
                stop.set()
                thread.join()
            assert reads.count(FileType.COMMIT_LOG) == 1 and store.fetcher.prefetching == 1  # still hanging
            # at one wake per switch interval the thread would wake ~60 times in 0.3 s; handed the GIL far more
            # often, several hundred times
            assert wakes >= 150, f"the worker thread woke {wakes} times in 0.3 s of serving"
            reads.gate = None
