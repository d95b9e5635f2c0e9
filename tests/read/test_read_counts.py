"""Cold reads cost one commit-log read per read-ahead window, and a consume-queue read where a reader starts."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.fixtures.backends import ProviderBackend
from tests.read.helpers import append_records, config_for_backend, counting_reads, make_record
from tieredstore.fetcher import GetMessageStatus
from tieredstore.formats.naming import FileType
from tieredstore.store import AsyncTieredMessageStore

TOPIC = "Sequential"


@pytest.mark.slow
@pytest.mark.parametrize("provider_factory", ["memory", "s3"], indirect=True)
async def test_sequential_consumer_reads_each_window_once_and_the_consume_queue_once(
    tmp_path: Path, provider_factory: ProviderBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    total = 100_000
    config = config_for_backend(tmp_path, provider_factory)
    with counting_reads(monkeypatch) as reads:
        async with AsyncTieredMessageStore.open(config, hot=False) as store:
            records = [make_record(TOPIC, 0, n, body=n.to_bytes(4, "big")) for n in range(total)]
            await append_records(store.runtime, TOPIC, 0, records, index=False)
            reads.clear()
            started = time.perf_counter()
            offset, served = 0, 0
            while True:
                result = await store.get_messages(TOPIC, 0, offset, 32)
                if result.status is GetMessageStatus.OFFSET_OVERFLOW_ONE:
                    break
                assert result.status is GetMessageStatus.FOUND
                for message in result.messages:
                    assert message.queue_offset == served and message.body == served.to_bytes(4, "big")
                    served += 1
                offset = result.next_begin_offset
            elapsed = time.perf_counter() - started
    assert served == total
    windows = -(-total // 4096)
    # No window needs the consume queue: the first starts at the oldest record, at the commit log's
    # start, and each later one is split out of the commit log from where the one before ended.
    assert reads.count(FileType.CONSUME_QUEUE) == 0
    assert reads.count(FileType.COMMIT_LOG) == windows
    assert reads.count() == windows
    metrics = store.runtime.metrics
    assert metrics.cache_misses._value.get() == windows
    assert metrics.cache_hits._value.get() == total - total // 4096 * 32 - min(total % 4096, 32)
    assert elapsed < 60


async def test_read_ahead_is_trimmed_to_read_ahead_size_but_never_below_one_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = config_for_backend(
        tmp_path,
        ProviderBackend("memory", f"memory://trim-{tmp_path.name}"),
        read={"read_ahead_size": 10_000, "read_ahead_count": 100},
    )
    with counting_reads(monkeypatch) as reads:
        async with AsyncTieredMessageStore.open(config, hot=False) as store:
            sizes = [1000] * 30 + [50_000] + [1000] * 5
            records = [make_record(TOPIC, 0, n, body=bytes([n]) * size) for n, size in enumerate(sizes)]
            await append_records(store.runtime, TOPIC, 0, records, index=False)
            reads.clear()
            first = await store.get_messages(TOPIC, 0, 0, 1)
            await store.fetcher.wait_for_prefetches()
            window, second, third = [r for r in reads.reads if r[0] is FileType.COMMIT_LOG]
            # 1,000-byte bodies make ~1,100-byte records: 9 fit in 10,000 bytes, the 10th would not
            assert 9 * 1000 < window[3] <= 10_000
            # the next two windows (offsets 9 to 17, 18 to 26) were read ahead in the background, each from
            # where the one before ended, within read_ahead_size too
            assert second[2] == sum(map(len, records[:9])) and second[3] <= 10_000
            assert third[2] == sum(map(len, records[:18])) and third[3] <= 10_000
            assert [m.queue_offset for m in first.messages] == [0]
            reads.clear()
            served = await store.get_messages(TOPIC, 0, 1, 8)
            assert [m.queue_offset for m in served.messages] == list(range(1, 9)) and reads.count() == 0
            # the 50,000-byte message alone is above read_ahead_size: it is still read, on its own
            reads.clear()
            big = await store.get_messages(TOPIC, 0, 30, 5)
            assert big.messages[0].queue_offset == 30
            assert big.messages[0].body == bytes([30]) * 50_000
            assert next(r[3] for r in reads.reads if r[0] is FileType.COMMIT_LOG) == len(big.messages[0].raw)


async def test_a_consumer_starting_mid_queue_reads_units_for_its_first_window_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = config_for_backend(
        tmp_path, ProviderBackend("memory", f"memory://mid-{tmp_path.name}"), read={"read_ahead_count": 100}
    )
    with counting_reads(monkeypatch) as reads:
        async with AsyncTieredMessageStore.open(config, hot=False) as store:
            records = [make_record(TOPIC, 0, n, body=n.to_bytes(4, "big")) for n in range(1000)]
            await append_records(store.runtime, TOPIC, 0, records, commit_every=100, index=False)
            reads.clear()
            offset, served = 450, []
            while offset < 1000:
                result = await store.get_messages(TOPIC, 0, offset, 32)
                served += [int.from_bytes(m.body, "big") for m in result.messages]
                offset = result.next_begin_offset
            await store.fetcher.wait_for_prefetches()
    assert served == list(range(450, 1000))
    # [450, 550) by its units, then [550, 650) .. [950, 1000) each from where the one before ended
    assert reads.count(FileType.CONSUME_QUEUE) == 1
    assert reads.count(FileType.COMMIT_LOG) == 6
