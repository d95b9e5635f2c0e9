"""RocketMQ's IndexFile layout in formats/: the key hash, names, a real file written by the Rust port, ours."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fixtures.paths import ROCKETMQ_FIXTURES
from tieredstore.errors import CorruptRecordError, IntegrityError
from tieredstore.formats.index_file import (
    RocketMQIndexFile,
    index_file_name,
    index_key,
    key_hash,
    key_hashes,
    parse_index_file_name,
    positive_hash,
)
from tieredstore.formats.message import java_string_hash

FIXTURE = ROCKETMQ_FIXTURES / "rust-0.9.0-writer" / "index" / "20260815011551705"


def test_key_hash_is_java_hash_code_of_topic_hash_key() -> None:
    assert key_hash("V1UpgradeTopic", "v1-upgrade-key") == 1354830161
    assert positive_hash("order-123") == 392797389


def test_hash_of_integer_min_value_is_clamped_to_zero() -> None:
    assert java_string_hash("polygenelubricants") == -(2**31)
    assert positive_hash("polygenelubricants") == 0


def test_rocketmq_index_file_fixture_reads_exactly() -> None:
    index = RocketMQIndexFile(FIXTURE.read_bytes(), slot_capacity=32, item_capacity=128)
    header = index.header
    assert (header.begin_timestamp, header.end_timestamp) == (1786727751703, 1786727751704)
    assert (header.begin_physical_offset, header.end_physical_offset) == (0, 141)
    assert (header.hash_slot_count, header.index_count) == (1, 3)
    assert 1354830161 % 32 == 17
    assert index.slot(17) == 2
    assert [index.slot(s) for s in range(32) if s != 17] == [0] * 31
    newest, oldest = index.item(2), index.item(1)
    assert (newest.key_hash, newest.physical_offset, newest.time_diff_seconds, newest.previous) == (
        1354830161,
        141,
        0,
        1,
    )
    assert (oldest.key_hash, oldest.physical_offset, oldest.time_diff_seconds, oldest.previous) == (1354830161, 0, 0, 0)
    found = index.lookup("V1UpgradeTopic#v1-upgrade-key", 1786727751703, 1786727751704)
    assert found == [141, 0]
    assert index.lookup("V1UpgradeTopic#v1-upgrade-key", 0, 1786727751702) == []
    assert index.lookup("V1UpgradeTopic#other-key", 0, 2**62) == []


def test_rocketmq_index_file_of_wrong_size_is_an_integrity_error() -> None:
    with pytest.raises(IntegrityError, match="2728 bytes"):
        RocketMQIndexFile(FIXTURE.read_bytes(), slot_capacity=64, item_capacity=128)


def test_rocketmq_index_chain_that_loops_is_an_error_not_a_hang() -> None:
    data = bytearray(FIXTURE.read_bytes())
    item_one_previous = 40 + 32 * 4 + 1 * 20 + 16
    data[item_one_previous : item_one_previous + 4] = (2).to_bytes(4, "big")  # item 1 -> item 2 -> item 1 ...
    index = RocketMQIndexFile(bytes(data), slot_capacity=32, item_capacity=128)
    with pytest.raises(CorruptRecordError, match="links forward"):
        index.lookup("V1UpgradeTopic#v1-upgrade-key", 0, 2**62)


@settings(max_examples=300, deadline=None)
@given(st.text("abcXYZ019_-%|", min_size=1, max_size=40), st.text(min_size=1, max_size=40))
def test_key_hash_is_the_hash_of_topic_hash_key_for_any_key(topic: str, key: str) -> None:
    assert key_hash(topic, key) == positive_hash(index_key(topic, key))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["T", "Orders", "rmq_sys_TRACE"]), st.text(max_size=40)), max_size=40))
def test_a_batch_of_keys_hashes_as_each_key_alone(pairs: list[tuple[str, str]]) -> None:
    topics, keys = [topic for topic, _ in pairs], [key for _, key in pairs]
    assert key_hashes(topics, keys).tolist() == [key_hash(topic, key) for topic, key in pairs]
    assert key_hashes("T", keys).tolist() == [key_hash("T", key) for key in keys]


def test_a_batch_key_whose_java_hash_is_integer_min_value_hashes_to_zero() -> None:
    assert java_string_hash("T#k7883q_oi") == -(2**31)
    assert key_hashes(["T", "T", "T"], ["k7883q_oi", "order-1", "日本😀"]).tolist() == [
        0,
        key_hash("T", "order-1"),
        key_hash("T", "日本😀"),
    ]


def test_index_file_names_are_creation_times_as_rocketmq_writes_them() -> None:
    assert FIXTURE.name == "20260815011551705"
    created = parse_index_file_name(FIXTURE.name)
    assert created is not None and index_file_name(created) == FIXTURE.name
    assert index_file_name(0) == "19700101000000000"
    assert parse_index_file_name("2026081501155170") is None and parse_index_file_name("20261345011551705") is None
