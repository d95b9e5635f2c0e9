"""query_by_key through the facade: unsealed and uploaded index files, time boundaries, collisions, restarts."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.read.helpers import BASE_TIMESTAMP, append_records, archive_hot, make_config, make_record
from tieredstore.formats.message import java_string_hash
from tieredstore.index import IndexFileStatus
from tieredstore.index.file import compact_file
from tieredstore.metadata import IndexFileStatus as RowStatus
from tieredstore.metadata import MetadataStore
from tieredstore.store import AsyncTieredMessageStore

TOPIC = "Keys"


def _index_rows(metadata_url: str) -> list[RowStatus]:
    with MetadataStore.open(metadata_url) as metadata:
        return [row.status for row in metadata.list_index_files()]


async def test_keys_are_found_across_unsealed_and_uploaded_files_and_after_a_restart(
    tmp_path: Path, migrated_metadata_url: str
) -> None:
    config = make_config(
        tmp_path, metadata_url=migrated_metadata_url, index={"index_max_items": 6, "index_slot_count": 8}
    )
    async with AsyncTieredMessageStore.open(config, owns_cold=True) as store:
        for n in range(20):
            await store.put_message(
                TOPIC,
                n % 2,
                f"order {n}".encode(),
                keys=[f"order-{n}", f"customer-{n % 3}"],
                properties={"UNIQ_KEY": f"U{n:04d}"},
            )
        await archive_hot(store.runtime, TOPIC, 0)
        await archive_hot(store.runtime, TOPIC, 1)
        uploaded = await store.runtime.index.maintain()
        statuses = [record.status for record in store.runtime.index.files()]
        assert len(uploaded) >= 4 and statuses[-1] is IndexFileStatus.UNSEALED
        assert set(statuses[:-1]) == {IndexFileStatus.UPLOAD}

        customer = await store.query_by_key(TOPIC, "customer-1", max_count=100)
        expected = sorted((n for n in range(20) if n % 3 == 1), reverse=True)
        assert sorted((int(m.body.split()[1]) for m in customer), reverse=True) == expected
        assert all("customer-1" in m.keys and m.record.topic == TOPIC for m in customer)
        assert [m.body for m in await store.query_by_key(TOPIC, "order-7")] == [b"order 7"]
        assert [m.unique_key for m in await store.query_by_key(TOPIC, "U0013")] == ["U0013"]
        assert len(await store.query_by_key(TOPIC, "customer-1", max_count=2)) == 2
        assert await store.query_by_key(TOPIC, "order-99") == []
        assert await store.query_by_key("OtherTopic", "order-7") == []
        assert await store.query_by_key(TOPIC, "order", max_count=5) == []  # a prefix of a key is not a key
    # the catalogue lives in the metadata database: a new process sees the same files
    assert sorted(_index_rows(migrated_metadata_url)) == sorted(RowStatus(s.value) for s in statuses)
    async with AsyncTieredMessageStore.open(config) as reopened:
        assert [r.status for r in reopened.runtime.index.files()] == statuses
        again = await reopened.query_by_key(TOPIC, "customer-1", max_count=100)
        assert sorted((int(m.body.split()[1]) for m in again), reverse=True) == expected


async def test_colliding_keys_are_told_apart_by_the_real_keys(tmp_path: Path) -> None:
    assert java_string_hash(f"{TOPIC}#Aa") == java_string_hash(f"{TOPIC}#BB")
    config = make_config(tmp_path, index={"index_max_items": 4, "index_slot_count": 4})
    async with AsyncTieredMessageStore.open(config, hot=False, owns_cold=True) as store:
        records = [make_record(TOPIC, 0, n, keys=("Aa" if n % 2 else "BB",)) for n in range(10)]
        await append_records(store.runtime, TOPIC, 0, records)
        await store.runtime.index.maintain()
        assert [m.queue_offset for m in await store.query_by_key(TOPIC, "Aa", 100)] == [9, 7, 5, 3, 1]
        assert [m.queue_offset for m in await store.query_by_key(TOPIC, "BB", 3)] == [8, 6, 4]
        assert {m.keys[0] for m in await store.query_by_key(TOPIC, "BB", 100)} == {"BB"}


async def test_a_query_window_spanning_two_files_finds_hits_in_both(tmp_path: Path) -> None:
    config = make_config(tmp_path, index={"index_max_items": 5, "index_slot_count": 4})
    async with AsyncTieredMessageStore.open(config, hot=False, owns_cold=True) as store:
        # file 1 holds items stored at T+0..T+400, file 2 T+500..T+900, file 3 T+1000..
        records = [
            make_record(TOPIC, 0, n, store_timestamp=BASE_TIMESTAMP + 100 * n, keys=("shared",)) for n in range(12)
        ]
        await append_records(store.runtime, TOPIC, 0, records)
        await store.runtime.index.maintain()
        files = store.runtime.index.files()
        assert [(f.begin_timestamp, f.end_timestamp) for f in files[:2]] == [
            (BASE_TIMESTAMP, BASE_TIMESTAMP + 400),
            (BASE_TIMESTAMP + 500, BASE_TIMESTAMP + 900),
        ]

        async def offsets(begin: int, end: int) -> list[int]:
            found = await store.query_by_key(TOPIC, "shared", 100, BASE_TIMESTAMP + begin, BASE_TIMESTAMP + end)
            return sorted(m.queue_offset for m in found)

        # starts inside file 1 and ends inside file 2: choosing files by start time alone would lose 3 and 4
        assert await offsets(250, 650) == [3, 4, 5, 6]
        assert await offsets(400, 500) == [4, 5]
        assert await offsets(0, 10_000) == list(range(12))
        assert await offsets(450, 480) == []


async def test_restart_mid_compaction_through_the_facade(
    tmp_path: Path, migrated_metadata_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = make_config(
        tmp_path, metadata_url=migrated_metadata_url, index={"index_max_items": 5, "index_slot_count": 4}
    )

    def crash_half_way(sealed_path: Path, compacted_path: Path) -> None:
        compacted_path.with_name(compacted_path.name + ".tmp").write_bytes(b"\x00" * 41)
        raise OSError("killed during compaction")

    monkeypatch.setattr("tieredstore.index.service.compact_file", crash_half_way)
    async with AsyncTieredMessageStore.open(config, hot=False, owns_cold=True) as store:
        records = [make_record(TOPIC, 0, n, keys=(f"k{n % 3}",), unique_key=f"u{n}") for n in range(8)]
        await append_records(store.runtime, TOPIC, 0, records)
        with pytest.raises(OSError, match="killed"):
            await store.runtime.index.maintain()
    assert sorted(_index_rows(migrated_metadata_url)) == sorted([RowStatus.SEALED] * 3 + [RowStatus.UNSEALED])
    monkeypatch.setattr("tieredstore.index.service.compact_file", compact_file)
    async with AsyncTieredMessageStore.open(config, hot=False, owns_cold=True) as store:
        assert not list((tmp_path / "data" / "index").glob("*.tmp"))
        before = [m.queue_offset for m in await store.query_by_key(TOPIC, "k1", 100)]
        assert sorted(before) == [1, 4, 7]
        assert len(await store.runtime.index.maintain()) == 3
        assert sorted(m.queue_offset for m in await store.query_by_key(TOPIC, "k1", 100)) == [1, 4, 7]
        assert [m.queue_offset for m in await store.query_by_key(TOPIC, "u6")] == [6]
    assert sorted(_index_rows(migrated_metadata_url)) == sorted([RowStatus.UPLOAD] * 3 + [RowStatus.UNSEALED])
