"""get_messages statuses: the same table whether the hot store or cold storage serves the queue."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from tests.read.helpers import archive_hot, make_config
from tieredstore.config import ReadPolicy, TieredStoreConfig
from tieredstore.errors import InvalidQueueError, InvalidTopicError, ValidationError
from tieredstore.fetcher import GetMessageStatus
from tieredstore.store import AsyncTieredMessageStore

TOPIC = "Status"
FAR_FUTURE_MS = 1 << 50


@asynccontextmanager
async def queue_on_one_tier(tmp_path: Path, tier: str) -> AsyncIterator[tuple[AsyncTieredMessageStore, int, int, int]]:
    """Queue 0 holds [low, high) and queue 1 is known but empty at ``empty_at``, on ``tier`` only.

    Both tiers are built the same way: messages are put, the hot store's retention drops its oldest
    files (so min offsets are above 0), and what is left is archived. The hot case reads with
    DISABLE; the cold case reopens without the hot store at all.
    """
    config = make_config(
        tmp_path,
        hot={"commit_log_file_size": 48 * 1024, "hot_retention_hours": 0},
    )
    async with AsyncTieredMessageStore.open(config, read_policy=ReadPolicy.DISABLE, owns_cold=True) as store:
        for n in range(4):
            await store.put_message(TOPIC, 1, b"early" * 10, keys=[f"e{n}"])
        for n in range(150):
            await store.put_message(TOPIC, 0, bytes([n % 251]) * 2000, keys=[f"k{n}"], tags="TagA")
        hot = store.runtime.hot
        assert hot is not None
        hot.delete_expired(lambda topic, queue_id: 1 << 40, now_ms=FAR_FUTURE_MS)
        for n in range(150, 210):
            await store.put_message(TOPIC, 0, bytes([n % 251]) * 2000, keys=[f"k{n}"], tags="TagA")
        low, high = hot.min_offset(TOPIC, 0), hot.max_offset(TOPIC, 0)
        empty_at = hot.max_offset(TOPIC, 1)
        assert 0 < low < 150 and high == 210 and hot.min_offset(TOPIC, 1) == empty_at == 4
        await archive_hot(store.runtime, TOPIC, 0)
        await store.runtime.flat.get_or_create(TOPIC, 1)
        if tier == "hot":
            yield store, low, high, empty_at
            return
    cold_config = TieredStoreConfig.model_validate(config.model_dump())
    # queue 1 exists in cold storage with nothing in it, at the offset the hot store had reached
    position = store.runtime.metadata.get_queue(TOPIC, 1)
    async with AsyncTieredMessageStore.open(cold_config, hot=False) as cold_store:
        cold_store.runtime.metadata.update_queue(
            TOPIC, 1, expected_version=position.version, min_offset=empty_at, max_offset=empty_at
        )
    async with AsyncTieredMessageStore.open(cold_config, hot=False) as cold_store:
        assert cold_store.runtime.hot is None
        yield cold_store, low, high, empty_at


@pytest.mark.parametrize("tier", ["hot", "cold"])
async def test_status_table_is_the_same_on_both_tiers(tmp_path: Path, tier: str) -> None:
    async with queue_on_one_tier(tmp_path, tier) as (store, low, high, empty_at):
        assert (await store.get_min_offset(TOPIC, 0), await store.get_max_offset(TOPIC, 0)) == (low, high)

        def table(result_status: GetMessageStatus, next_offset: int, count: int, first: int | None = None) -> tuple:
            return (result_status, next_offset, count, first)

        async def ask(offset: int, max_count: int = 32, queue_id: int = 0) -> tuple:
            result = await store.get_messages(TOPIC, queue_id, offset, max_count)
            if queue_id == 0:
                assert (result.min_offset, result.max_offset) == (low, high)
            assert all(m.tier == tier for m in result.messages)
            assert [m.queue_offset for m in result.messages] == list(range(offset, offset + len(result.messages)))
            first = result.messages[0].queue_offset if result.messages else None
            return table(result.status, result.next_begin_offset, len(result.messages), first)

        assert await ask(0) == table(GetMessageStatus.OFFSET_TOO_SMALL, low, 0)
        assert await ask(low - 1) == table(GetMessageStatus.OFFSET_TOO_SMALL, low, 0)
        assert await ask(low) == table(GetMessageStatus.FOUND, low + 32, 32, low)
        assert await ask(low, max_count=1) == table(GetMessageStatus.FOUND, low + 1, 1, low)
        assert await ask(high - 1) == table(GetMessageStatus.FOUND, high, 1, high - 1)
        assert await ask(high - 3, max_count=100) == table(GetMessageStatus.FOUND, high, 3, high - 3)
        assert await ask(high) == table(GetMessageStatus.OFFSET_OVERFLOW_ONE, high, 0)
        assert await ask(high + 1) == table(GetMessageStatus.OFFSET_OVERFLOW_BADLY, high, 0)
        assert await ask(10**9) == table(GetMessageStatus.OFFSET_OVERFLOW_BADLY, high, 0)
        assert await ask(0, queue_id=1) == table(GetMessageStatus.NO_MESSAGE_IN_QUEUE, empty_at, 0)
        assert await ask(0, queue_id=7) == table(GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, 0, 0)
        unknown = await store.get_messages("NeverWritten", 0, 5)
        assert (unknown.status, unknown.next_begin_offset) == (GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, 0)

        message = (await store.get_messages(TOPIC, 0, low + 5, 1)).messages[0]
        assert message.body == bytes([(low + 5) % 251]) * 2000
        assert message.keys == [f"k{low + 5}"] and message.tags == "TagA"
        assert message.record.topic == TOPIC and message.record.queue_offset == low + 5
        assert len(message.raw) == message.record.encode().__len__()


@pytest.mark.parametrize("tier", ["hot", "cold"])
async def test_a_consumer_walks_the_whole_queue_by_next_offsets(tmp_path: Path, tier: str) -> None:
    async with queue_on_one_tier(tmp_path, tier) as (store, low, high, _):
        offset, seen = 0, []
        for _ in range(100):
            result = await store.get_messages(TOPIC, 0, offset, 7)
            if result.status is GetMessageStatus.OFFSET_OVERFLOW_ONE:
                break
            seen.extend(m.queue_offset for m in result.messages)
            offset = result.next_begin_offset
        assert seen == list(range(low, high))


async def test_an_offset_no_tier_holds_is_found_null_and_points_past_the_gap(tmp_path: Path) -> None:
    config = make_config(tmp_path, hot={"commit_log_file_size": 48 * 1024, "hot_retention_hours": 0})
    async with AsyncTieredMessageStore.open(config, owns_cold=True) as store:
        for n in range(150):
            await store.put_message(TOPIC, 0, bytes(2000), keys=[f"k{n}"])
        # only the first 10 were archived before the hot store dropped its old files: a gap
        await archive_hot(store.runtime, TOPIC, 0, end=10)
        hot = store.runtime.hot
        assert hot is not None
        hot.delete_expired(lambda topic, queue_id: 1 << 40, now_ms=FAR_FUTURE_MS)
        hot_min = hot.min_offset(TOPIC, 0)
        assert hot_min > 11
        result = await store.get_messages(TOPIC, 0, 11)
        assert (result.status, result.next_begin_offset, result.messages) == (
            GetMessageStatus.OFFSET_FOUND_NULL,
            hot_min,
            [],
        )
        assert (result.min_offset, result.max_offset) == (0, 150)
        assert [m.tier for m in (await store.get_messages(TOPIC, 0, 9, 1)).messages] == ["cold"]
        assert [m.tier for m in (await store.get_messages(TOPIC, 0, hot_min, 1)).messages] == ["hot"]


async def test_bad_arguments_are_validation_errors(tmp_path: Path) -> None:
    async with AsyncTieredMessageStore.open(make_config(tmp_path)) as store:
        await store.put_message(TOPIC, 0, b"x")
        with pytest.raises(InvalidTopicError):
            await store.get_messages("bad/topic", 0, 0)
        with pytest.raises(InvalidQueueError):
            await store.get_messages(TOPIC, -1, 0)
        with pytest.raises(ValidationError, match="max_count"):
            await store.get_messages(TOPIC, 0, 0, 0)
        with pytest.raises(ValidationError, match="offset"):
            await store.get_messages(TOPIC, 0, "3", 1)  # type: ignore[arg-type]
        # Not hashable, after a read that a next call could go on from: still the typed errors.
        await store.get_messages(TOPIC, 0, 0, 1)
        with pytest.raises(InvalidTopicError):
            await store.get_messages([TOPIC], 0, 1)  # type: ignore[arg-type]
        with pytest.raises(InvalidQueueError):
            await store.get_messages(TOPIC, [0], 1)  # type: ignore[arg-type]
        # A key query that could only ever answer nothing is a mistake, not an empty result.
        with pytest.raises(ValidationError, match="key must be"):
            await store.query_by_key(TOPIC, "")
        with pytest.raises(ValidationError, match="max_count"):
            await store.query_by_key(TOPIC, "k", -1)
        with pytest.raises(ValidationError, match="is after end timestamp"):
            await store.query_by_key(TOPIC, "k", 10, 100, 5)
        assert (await store.get_messages(TOPIC, 0, 0)).status is GetMessageStatus.FOUND
