"""Read policies route each offset to a tier; a failed or empty cold read falls back to the hot store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from tests.read.helpers import ReadLog, archive_hot, counting_reads, make_config
from tieredstore.config import ReadPolicy
from tieredstore.errors import StorageUnavailableError
from tieredstore.fetcher import GetMessageStatus
from tieredstore.store import AsyncTieredMessageStore

TOPIC = "Policies"
FAR_FUTURE_MS = 1 << 50


@asynccontextmanager
async def three_ranges(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[AsyncTieredMessageStore, ReadLog, int]]:
    """[0, low) only in cold storage; [low, 150) in both tiers; [150, 170) only in the hot store."""
    config = make_config(tmp_path, hot={"commit_log_file_size": 48 * 1024, "hot_retention_hours": 0})
    with counting_reads(monkeypatch) as reads:
        async with AsyncTieredMessageStore.open(config, owns_cold=True) as store:
            for n in range(150):
                await store.put_message(TOPIC, 0, bytes([n]) * 2000, keys=[f"k{n}"])
            await archive_hot(store.runtime, TOPIC, 0)
            hot = store.runtime.hot
            assert hot is not None
            hot.delete_expired(lambda topic, queue_id: 150, now_ms=FAR_FUTURE_MS)
            for n in range(150, 170):
                await store.put_message(TOPIC, 0, bytes([n]) * 2000, keys=[f"k{n}"])
            low = hot.min_offset(TOPIC, 0)
            assert 0 < low <= 140
            reads.clear()
            yield store, reads, low


def _with_policy(store: AsyncTieredMessageStore, policy: ReadPolicy, **kwargs: int) -> AsyncTieredMessageStore:
    return AsyncTieredMessageStore(store.runtime, read_policy=policy, **kwargs)


async def _tiers(store: AsyncTieredMessageStore, offset: int, count: int = 1) -> list[str]:
    result = await store.get_messages(TOPIC, 0, offset, count)
    assert result.status is GetMessageStatus.FOUND
    assert [m.body[:1] for m in result.messages] == [bytes([n]) for n in range(offset, offset + count)]
    return [m.tier for m in result.messages]


async def test_not_in_disk_reads_cold_exactly_when_the_hot_store_lost_the_offset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with three_ranges(tmp_path, monkeypatch) as (store, reads, low):
        assert store.read_policy is ReadPolicy.NOT_IN_DISK
        assert (await store.get_min_offset(TOPIC, 0), await store.get_max_offset(TOPIC, 0)) == (0, 170)
        assert await _tiers(store, 0) == ["cold"]
        assert reads.count() == 1  # the oldest record: read from the commit log's start, no units needed
        reads.clear()
        assert await _tiers(store, low, 5) == ["hot"] * 5
        assert await _tiers(store, 160, 5) == ["hot"] * 5
        assert reads.count() == 0
        # a batch that starts in cold storage stops at the cold tier's end; the next one goes hot
        result = await store.get_messages(TOPIC, 0, low - 2, 10)
        assert [m.tier for m in result.messages] == ["cold"] * 10
        assert await _tiers(store, result.next_begin_offset) == ["hot"]


async def test_disable_never_touches_cold_storage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with three_ranges(tmp_path, monkeypatch) as (store, reads, low):
        hot_only = _with_policy(store, ReadPolicy.DISABLE)
        assert (await hot_only.get_min_offset(TOPIC, 0), await hot_only.get_max_offset(TOPIC, 0)) == (low, 170)
        result = await hot_only.get_messages(TOPIC, 0, 0)
        assert (result.status, result.next_begin_offset) == (GetMessageStatus.OFFSET_TOO_SMALL, low)
        assert await _tiers(hot_only, low, 3) == ["hot"] * 3
        assert reads.count() == 0


async def test_force_reads_cold_whenever_it_holds_the_offset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with three_ranges(tmp_path, monkeypatch) as (store, reads, low):
        forced = _with_policy(store, ReadPolicy.FORCE)
        assert await _tiers(forced, low, 4) == ["cold"] * 4
        assert reads.count() == 2
        # not archived yet: cold storage finds nothing, the hot store serves it
        assert await _tiers(forced, 155, 4) == ["hot"] * 4
        result = await forced.get_messages(TOPIC, 0, 148, 10)
        assert [m.tier for m in result.messages] == ["cold", "cold"] and result.next_begin_offset == 150


async def test_not_in_mem_reads_cold_for_hot_copies_outside_the_memory_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with three_ranges(tmp_path, monkeypatch) as (store, reads, low):
        record_size = len((await store.get_messages(TOPIC, 0, 160, 1)).messages[0].raw)
        # the newest 30 records of the hot commit log count as in memory: offsets 140..169
        in_memory = _with_policy(store, ReadPolicy.NOT_IN_MEM, hot_in_memory_bytes=30 * record_size)
        assert await _tiers(in_memory, 145, 3) == ["hot"] * 3
        assert await _tiers(in_memory, 165, 3) == ["hot"] * 3
        assert reads.count() == 0
        assert await _tiers(in_memory, low, 3) == ["cold"] * 3
        assert await _tiers(in_memory, 0, 1) == ["cold"]
        everything = _with_policy(store, ReadPolicy.NOT_IN_MEM, hot_in_memory_bytes=1 << 40)
        assert await _tiers(everything, low, 3) == ["hot"] * 3


async def test_a_failing_cold_read_falls_back_to_the_hot_store_when_it_still_has_the_offset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with three_ranges(tmp_path, monkeypatch) as (store, reads, low):
        forced = _with_policy(store, ReadPolicy.FORCE)
        reads.failing = True
        assert await _tiers(forced, low + 3, 5) == ["hot"] * 5
        # where only cold storage has the offset the storage error reaches the caller, typed
        with pytest.raises(StorageUnavailableError, match="injected read outage"):
            await store.get_messages(TOPIC, 0, 0, 5)
        reads.failing = False
        assert await _tiers(store, 0, 5) == ["cold"] * 5


async def test_a_reader_going_on_in_cold_storage_sees_the_hot_store_grow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Calls going on inside a cold window answer with the queue's offsets as they are now."""
    async with three_ranges(tmp_path, monkeypatch) as (store, _reads, _low):
        for reader in (store, _with_policy(store, ReadPolicy.FORCE)):
            max_offset = await store.get_max_offset(TOPIC, 0)
            first = await reader.get_messages(TOPIC, 0, 0, 10)
            assert (first.max_offset, [m.tier for m in first.messages]) == (max_offset, ["cold"] * 10)
            await store.put_message(TOPIC, 0, b"new" * 100)
            second = await reader.get_messages(TOPIC, 0, 10, 10)
            assert [(m.queue_offset, m.tier) for m in second.messages] == [(n, "cold") for n in range(10, 20)]
            assert second.max_offset == max_offset + 1
