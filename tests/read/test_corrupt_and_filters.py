"""Corrupt cold records are typed errors naming where they are; tag and predicate filters on both tiers."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.backends import ProviderBackend
from tests.read.conftest import over_backends
from tests.read.helpers import append_records, config_for_backend, make_config, make_record
from tieredstore.config import ReadPolicy
from tieredstore.errors import CorruptRecordError
from tieredstore.fetcher import GetMessageStatus, MessageFilter
from tieredstore.formats.message import POS_BORN_HOST, POS_MAGIC, java_string_hash
from tieredstore.providers.memory import MemoryProvider
from tieredstore.store import AsyncTieredMessageStore

TOPIC = "Corrupt"


def flip_byte(backend: ProviderBackend, request: pytest.FixtureRequest, key: str, position: int) -> None:
    """Change one committed byte of segment ``key`` where the backend keeps it (file, object or bytearray)."""
    if backend.name == "memory":
        MemoryProvider(backend.url).volume[key][position] ^= 0xFF
    elif backend.name == "posix":
        path = os.path.join(backend.url, *key.split("/"))
        with open(path, "r+b") as handle:
            handle.seek(position)
            original = handle.read(1)[0]
            handle.seek(position)
            handle.write(bytes([original ^ 0xFF]))
    else:
        client = request.getfixturevalue("s3_server").client()
        bucket = backend.url.split("/")[2]
        prefix = f"archive/{key}/"
        chunks = sorted(
            (int(item["Key"].rsplit("/", 1)[1]), item["Key"])
            for item in client.list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]
            if item["Key"].rsplit("/", 1)[1].isdigit()
        )
        start, object_key = [chunk for chunk in chunks if chunk[0] <= position][-1]
        data = bytearray(client.get_object(Bucket=bucket, Key=object_key)["Body"].read())
        data[position - start] ^= 0xFF
        client.put_object(Bucket=bucket, Key=object_key, Body=bytes(data))


@over_backends
async def test_a_flipped_byte_in_a_committed_record_is_a_typed_error_naming_it(
    tmp_path: Path, provider_factory: ProviderBackend, request: pytest.FixtureRequest
) -> None:
    config = config_for_backend(tmp_path, provider_factory)
    async with AsyncTieredMessageStore.open(config, hot=False, owns_cold=True) as store:
        records = [make_record(TOPIC, 2, n, body=bytes([n]) * 100) for n in range(20)]
        flat_file = await append_records(store.runtime, TOPIC, 2, records, commit_every=8)
        segment = flat_file.commit_log.segments[0]
        units = await flat_file.read_units(0, 20)
        # the 100-byte body ends where TOPICLEN(1) + topic + PROPLEN(2) (no properties) begin
        body_at = len(records[7]) - 100 - 1 - len(TOPIC) - 2
        assert body_at > POS_BORN_HOST
        flip_byte(
            provider_factory, request, segment.key, units[7].commitlog_offset - segment.base_offset + body_at + 50
        )
        flip_byte(provider_factory, request, segment.key, units[12].commitlog_offset - segment.base_offset + POS_MAGIC)

        assert [m.queue_offset for m in (await store.get_messages(TOPIC, 2, 0, 7)).messages] == list(range(7))
        with pytest.raises(CorruptRecordError, match="body CRC mismatch") as crc_error:
            await store.get_messages(TOPIC, 2, 7, 5)
        assert (crc_error.value.location, crc_error.value.offset) == (f"{TOPIC}/2", 7)
        assert f"in {TOPIC}/2 at offset 7" in str(crc_error.value)
        assert [m.queue_offset for m in (await store.get_messages(TOPIC, 2, 8, 4)).messages] == [8, 9, 10, 11]
        with pytest.raises(CorruptRecordError, match="bad magic code") as magic_error:
            await store.get_messages(TOPIC, 2, 12, 1)
        assert (magic_error.value.location, magic_error.value.offset) == (f"{TOPIC}/2", 12)
        assert len((await store.get_messages(TOPIC, 2, 13, 32)).messages) == 7


def _tagged(n: int) -> str | None:
    return ["Aa", "BB", "C", None][n % 4]


async def _store_with_tags(tmp_path: Path, tier: str) -> Any:
    config = make_config(tmp_path, read={"read_ahead_count": 50})
    if tier == "hot":
        opened = AsyncTieredMessageStore.open(config, read_policy=ReadPolicy.DISABLE)
        store = await opened.__aenter__()
        for n in range(120):
            await store.put_message(TOPIC, 0, n.to_bytes(2, "big"), tags=_tagged(n))
    else:
        opened = AsyncTieredMessageStore.open(config, hot=False)
        store = await opened.__aenter__()
        records = [make_record(TOPIC, 0, n, body=n.to_bytes(2, "big"), tags=_tagged(n)) for n in range(120)]
        await append_records(store.runtime, TOPIC, 0, records)
    return opened, store


@pytest.mark.parametrize("tier", ["hot", "cold"])
async def test_tag_filter_confirms_the_hash_on_the_record_and_skipped_offsets_advance(
    tmp_path: Path, tier: str
) -> None:
    assert java_string_hash("Aa") == java_string_hash("BB")  # the two tags collide in the consume queue
    opened, store = await _store_with_tags(tmp_path, tier)
    try:
        result = await store.get_messages(TOPIC, 0, 1, 5, MessageFilter.by_tags("Aa"))
        assert result.status is GetMessageStatus.FOUND
        assert [m.queue_offset for m in result.messages] == [4, 8, 12, 16, 20]
        assert {m.tags for m in result.messages} == {"Aa"} and {m.tier for m in result.messages} == {tier}
        assert result.next_begin_offset == 21
        both = await store.get_messages(TOPIC, 0, 0, 4, MessageFilter.by_tags("BB", "C"))
        assert [m.queue_offset for m in both.messages] == [1, 2, 5, 6] and both.next_begin_offset == 7
        # nothing matches: the scan stops after read_ahead_count (50) offsets and says where to go on
        none = await store.get_messages(TOPIC, 0, 10, 5, MessageFilter.by_tags("Zz"))
        assert (none.status, none.next_begin_offset, none.messages) == (GetMessageStatus.NO_MATCHED_MESSAGE, 60, [])
        tail = await store.get_messages(TOPIC, 0, 100, 5, MessageFilter.by_tags("Zz"))
        assert (tail.status, tail.next_begin_offset) == (GetMessageStatus.NO_MATCHED_MESSAGE, 120)
        even_untagged = MessageFilter(predicate=lambda record: record.tags is None and record.body[1] % 8 == 3)
        odd = await store.get_messages(TOPIC, 0, 0, 3, even_untagged)
        assert [m.queue_offset for m in odd.messages] == [3, 11, 19] and odd.next_begin_offset == 20
        tagged_and_big = MessageFilter(tags=frozenset({"C"}), predicate=lambda record: record.body >= b"\x00\x64")
        found = await store.get_messages(TOPIC, 0, 90, 2, tagged_and_big)
        assert [m.queue_offset for m in found.messages] == [102, 106] and found.next_begin_offset == 107
    finally:
        await opened.__aexit__(None, None, None)


@over_backends
async def test_damage_in_a_window_read_on_from_the_last_one_is_still_named(
    tmp_path: Path, provider_factory: ProviderBackend, request: pytest.FixtureRequest
) -> None:
    # Windows of 10: after the first, each is split out of the commit log from where the last ended.
    config = config_for_backend(tmp_path, provider_factory, read={"read_ahead_count": 10})
    async with AsyncTieredMessageStore.open(config, hot=False, owns_cold=True) as store:
        records = [make_record(TOPIC, 2, n, body=bytes([n]) * 100) for n in range(40)]
        flat_file = await append_records(store.runtime, TOPIC, 2, records, commit_every=10)
        segment = flat_file.commit_log.segments[0]
        units = await flat_file.read_units(0, 40)
        body_at = len(records[25]) - 100 - 1 - len(TOPIC) - 2
        flip_byte(provider_factory, request, segment.key, units[25].commitlog_offset - segment.base_offset + body_at)
        # the first record of window [30, 40): the split finds no record there at all
        flip_byte(provider_factory, request, segment.key, units[30].commitlog_offset - segment.base_offset + POS_MAGIC)

        served = []
        for offset in range(0, 25, 5):
            served += [m.queue_offset for m in (await store.get_messages(TOPIC, 2, offset, 5)).messages]
        assert served == list(range(25))
        with pytest.raises(CorruptRecordError, match="body CRC mismatch") as crc_error:
            await store.get_messages(TOPIC, 2, 25, 5)
        assert (crc_error.value.location, crc_error.value.offset) == (f"{TOPIC}/2", 25)
        assert [m.queue_offset for m in (await store.get_messages(TOPIC, 2, 26, 4)).messages] == [26, 27, 28, 29]
        with pytest.raises(CorruptRecordError, match="bad magic code") as magic_error:
            await store.get_messages(TOPIC, 2, 30, 3)
        assert (magic_error.value.location, magic_error.value.offset) == (f"{TOPIC}/2", 30)
        rest = await store.get_messages(TOPIC, 2, 31, 32)
        assert [m.queue_offset for m in rest.messages] == list(range(31, 40))
        assert [m.body for m in rest.messages] == [bytes([n]) * 100 for n in range(31, 40)]


async def test_a_tag_filter_reading_on_through_windows_confirms_tags_on_the_records(tmp_path: Path) -> None:
    # Windows split out of the commit log carry no consume-queue tag hash: the records' own TAGS decide.
    config = make_config(tmp_path, read={"read_ahead_count": 16})
    async with AsyncTieredMessageStore.open(config, hot=False) as store:
        records = [make_record(TOPIC, 0, n, body=n.to_bytes(2, "big"), tags=_tagged(n)) for n in range(120)]
        await append_records(store.runtime, TOPIC, 0, records)
        wanted, offset = [], 0
        while offset < 120:
            result = await store.get_messages(TOPIC, 0, offset, 3, MessageFilter.by_tags("BB"))
            wanted += [(m.queue_offset, m.tags) for m in result.messages]
            offset = result.next_begin_offset
        assert wanted == [(n, "BB") for n in range(1, 120, 4)]
