"""query_by_key over both tiers: the hot store's index finds what is not archived yet, each message once."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.backends import ProviderBackend
from tests.read.helpers import archive_hot, config_for_backend
from tieredstore.formats.message import java_string_hash
from tieredstore.store import AsyncTieredMessageStore

TOPIC = "Keys"


@pytest.mark.parametrize("provider_factory", ["posix", "s3"], indirect=True)
async def test_keys_are_found_in_both_tiers_once_each_newest_first(
    tmp_path: Path, provider_factory: ProviderBackend, migrated_metadata_url: str
) -> None:
    assert java_string_hash(f"{TOPIC}#Aa") == java_string_hash(f"{TOPIC}#BB")  # one slot, one hash
    config = config_for_backend(
        tmp_path,
        provider_factory,
        metadata_url=migrated_metadata_url,
        hot={"commit_log_file_size": 40960, "hot_retention_hours": 0, "index_slot_count": 16, "index_max_items": 8},
    )
    async with AsyncTieredMessageStore.open(config, owns_cold=True) as store:
        for n in range(30):
            keys = [f"order-{n}", "shared", "Aa" if n % 2 else "BB"]
            await store.put_message(TOPIC, 0, bytes([n]) * 3000, keys=keys)
        # nothing archived yet: the topic is not even in the metadata store
        fresh = await store.query_by_key(TOPIC, "order-3")
        assert [(m.queue_offset, m.tier) for m in fresh] == [(3, "hot")]

        await archive_hot(store.runtime, TOPIC, 0, end=20)
        await store.delete_expired_hot()
        hot = store.runtime.hot
        assert hot is not None
        hot_min = hot.min_offset(TOPIC, 0)
        assert 0 < hot_min < 20  # some archived messages are cold only, some are in both tiers

        shared = await store.query_by_key(TOPIC, "shared", 100)
        assert [m.queue_offset for m in shared] == list(range(29, -1, -1))
        assert [m.tier for m in shared] == ["hot"] * (30 - hot_min) + ["cold"] * hot_min
        assert all(m.body == bytes([m.queue_offset]) * 3000 for m in shared)
        assert [m.queue_offset for m in await store.query_by_key(TOPIC, "shared", 4)] == [29, 28, 27, 26]
        assert [m.queue_offset for m in await store.query_by_key(TOPIC, "Aa", 100)] == list(range(29, 0, -2))
        assert [m.queue_offset for m in await store.query_by_key(TOPIC, "BB", 3)] == [28, 26, 24]
        assert [m.queue_offset for m in await store.query_by_key(TOPIC, "order-0")] == [0]
        assert [m.queue_offset for m in await store.query_by_key(TOPIC, "order-25")] == [25]
        newest = shared[0].record.store_timestamp
        later = await store.query_by_key(TOPIC, "shared", 100, newest, newest)
        assert {m.queue_offset for m in later} == {m.queue_offset for m in shared if m.record.store_timestamp == newest}
