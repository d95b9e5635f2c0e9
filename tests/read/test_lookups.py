"""Time lookups over both tiers, lookups by commit-log offset / message id, and the synchronous wrapper."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.read.helpers import BASE_TIMESTAMP, append_records, archive_hot, make_config, make_record
from tieredstore.config import ReadPolicy
from tieredstore.errors import NotFoundError, ValidationError
from tieredstore.fetcher import GetMessageStatus
from tieredstore.store import AsyncTieredMessageStore, TieredMessageStore

TOPIC = "Lookups"
FAR_FUTURE_MS = 1 << 50


async def test_offset_for_timestamp_in_cold_storage_with_equal_timestamps(tmp_path: Path) -> None:
    async with AsyncTieredMessageStore.open(make_config(tmp_path), hot=False) as store:
        # offsets 2j and 2j+1 share the timestamp T + 10j
        records = [make_record(TOPIC, 0, n, store_timestamp=BASE_TIMESTAMP + 10 * (n // 2)) for n in range(50)]
        await append_records(store.runtime, TOPIC, 0, records, index=False)

        async def lookup(delta: int, boundary: str) -> int:
            return await store.offset_for_timestamp(TOPIC, 0, BASE_TIMESTAMP + delta, boundary)  # type: ignore[arg-type]

        for j in (0, 7, 24):
            assert await lookup(10 * j, "lower") == 2 * j
            assert await lookup(10 * j, "upper") == 2 * j + 1
            assert await lookup(10 * j + 5, "lower") == 2 * j + 2
            assert await lookup(10 * j + 5, "upper") == 2 * j + 1
        assert await lookup(-1, "lower") == 0 and await lookup(-1, "upper") == 0
        assert await lookup(10_000, "lower") == 50 and await lookup(10_000, "upper") == 49
        with pytest.raises(ValidationError, match="boundary"):
            await lookup(0, "middle")
        assert await store.offset_for_timestamp("Unknown", 0, BASE_TIMESTAMP) == 0


async def test_offset_for_timestamp_spans_the_cold_and_hot_tiers(tmp_path: Path) -> None:
    config = make_config(tmp_path, hot={"commit_log_file_size": 48 * 1024, "hot_retention_hours": 0})
    async with AsyncTieredMessageStore.open(config, owns_cold=True) as store:
        for n in range(150):
            await store.put_message(TOPIC, 0, bytes(2000))
            if n % 10 == 0:
                await asyncio.sleep(0.002)  # several distinct store times, some shared
        await archive_hot(store.runtime, TOPIC, 0, end=140)
        hot = store.runtime.hot
        assert hot is not None
        hot.delete_expired(lambda topic, queue_id: 140, now_ms=FAR_FUTURE_MS)
        low = hot.min_offset(TOPIC, 0)
        assert 0 < low < 140
        stamps = [m.store_timestamp for m in (await store.get_messages(TOPIC, 0, 0, 200)).messages]
        stamps += [m.store_timestamp for m in (await store.get_messages(TOPIC, 0, 140, 200)).messages]
        assert len(stamps) == 150
        for probe in sorted({*stamps, stamps[0] - 1, stamps[-1] + 1, stamps[low] + 1}):
            lower = next((n for n, stamp in enumerate(stamps) if stamp >= probe), 150)
            upper = max((n for n, stamp in enumerate(stamps) if stamp <= probe), default=0)
            assert await store.offset_for_timestamp(TOPIC, 0, probe, "lower") == lower
            assert await store.offset_for_timestamp(TOPIC, 0, probe, "upper") == upper
        # the hot tier alone (DISABLE) answers within what it still has
        hot_only = AsyncTieredMessageStore(store.runtime, read_policy=ReadPolicy.DISABLE)
        assert await hot_only.offset_for_timestamp(TOPIC, 0, stamps[0], "lower") == low


async def test_look_message_by_offset_in_the_hot_store_and_in_a_cold_commit_log(tmp_path: Path) -> None:
    async with AsyncTieredMessageStore.open(make_config(tmp_path), owns_cold=True) as store:
        puts = [await store.put_message(TOPIC, 3, f"body {n}".encode(), keys=[f"k{n}"]) for n in range(10)]
        hot = store.runtime.hot
        assert hot is not None
        found = await store.look_message_by_offset(puts[4].commitlog_offset)
        assert (found.tier, found.queue_id, found.queue_offset, found.body) == ("hot", 3, 4, b"body 4")
        by_id = await store.look_message_by_offset(hot.offset_msg_id(puts[6].commitlog_offset))
        assert by_id.body == b"body 6" and by_id.keys == ["k6"]
        with pytest.raises(NotFoundError, match="outside the hot store"):
            await store.look_message_by_offset(hot.commitlog_max_offset + 100)
        other_host = "0A000001" + "00002A9F" + f"{puts[6].commitlog_offset:016X}"
        with pytest.raises(NotFoundError, match="store host"):
            await store.look_message_by_offset(other_host)
        for bad in ("not-hex", "ABCD", -1):
            with pytest.raises(ValidationError):
                await store.look_message_by_offset(bad)

        await archive_hot(store.runtime, TOPIC, 3)
        forced = AsyncTieredMessageStore(store.runtime, read_policy=ReadPolicy.FORCE)
        cold_copy = (await forced.get_messages(TOPIC, 3, 5, 1)).messages[0]
        assert cold_copy.tier == "cold"
        cold_offset = cold_copy.record.physical_offset
        looked = await store.look_message_by_offset(cold_offset, topic=TOPIC, queue_id=3)
        assert (looked.tier, looked.queue_offset, looked.body) == ("cold", 5, b"body 5")
        by_cold_id = await store.look_message_by_offset(cold_copy.record.offset_msg_id, topic=TOPIC, queue_id=3)
        assert by_cold_id.raw == cold_copy.raw
        with pytest.raises(NotFoundError):
            await store.look_message_by_offset(10**9, topic=TOPIC, queue_id=3)
        with pytest.raises(NotFoundError):
            await store.look_message_by_offset(0, topic=TOPIC, queue_id=9)
        with pytest.raises(ValidationError, match="both"):
            await store.look_message_by_offset(0, topic=TOPIC)


def test_the_sync_wrapper_runs_every_call_on_its_own_loop(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    with TieredMessageStore(config, owns_cold=True) as store:
        for n in range(5):
            store.put_message(TOPIC, 0, f"m{n}".encode(), keys=[f"key{n}"], tags="T")
        result = store.get_messages(TOPIC, 0, 0, 10)
        assert result.status is GetMessageStatus.FOUND and [m.body for m in result.messages][-1] == b"m4"
        assert (store.get_min_offset(TOPIC, 0), store.get_max_offset(TOPIC, 0)) == (0, 5)
        stamp = result.messages[2].store_timestamp
        assert store.offset_for_timestamp(TOPIC, 0, stamp, "lower") <= 2
        store.run(archive_hot(store.runtime, TOPIC, 0))
        assert [m.body for m in store.query_by_key(TOPIC, "key3")] == [b"m3"]
        assert store.look_message_by_offset(result.messages[1].record.physical_offset).body == b"m1"
    with pytest.raises(ValidationError, match="closed"):
        store.get_max_offset(TOPIC, 0)
    # closed cleanly: the hot store's directory lock is free for the next opener
    with TieredMessageStore(config) as reopened:
        assert reopened.get_max_offset(TOPIC, 0) == 5


async def test_the_sync_wrapper_refuses_to_run_inside_an_event_loop(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="AsyncTieredMessageStore"):
        TieredMessageStore(make_config(tmp_path))
