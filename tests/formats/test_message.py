"""The message record codec against real RocketMQ commit logs, and hypothesis round trips."""

from __future__ import annotations

import hashlib
import itertools
import struct
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fixtures.paths import ROCKETMQ_FIXTURES
from tieredstore.errors import CorruptRecordError, InvalidPropertyError
from tieredstore.formats.message import (
    MAGIC_BLANK,
    MAGIC_V1,
    MAGIC_V2,
    MIN_RECORD_SIZE,
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_STOREHOST_V6,
    HostAddress,
    MessageRecord,
    RecordLayout,
    blank_record,
    body_crc,
    decode,
    encode_properties,
    iter_records,
    java_string_hash,
    property_value,
    record_size_at,
    rewrite_physical_offset,
    split_back_to_back,
    store_timestamp_of,
    tag_hash,
    verify_record,
)

FIXTURES = ROCKETMQ_FIXTURES
JAVA_COMMIT_LOG = FIXTURES / "java-4x-consumequeuetest" / "commitlog" / "00000000000000000000"
RUST_COMMIT_LOG = FIXTURES / "rust-0.9.0-writer" / "commitlog" / "00000000000000000000"


@pytest.fixture(scope="module")
def java_log() -> bytes:
    return JAVA_COMMIT_LOG.read_bytes()


@pytest.fixture(scope="module")
def rust_log() -> bytes:
    return RUST_COMMIT_LOG.read_bytes()


def test_java_fixture_is_the_documented_file(java_log: bytes) -> None:
    assert len(java_log) == 8192
    assert hashlib.sha256(java_log).hexdigest().startswith("081d0913")


def test_split_back_to_back_finds_the_java_stores_records_and_stops_at_its_blank(java_log: bytes) -> None:
    starts = [position for position, _record in iter_records(java_log)]
    ends = split_back_to_back(java_log, 1000)
    assert ends[:-1] == starts and ends[-1] == 8084  # the blank record filling the file's end is no record
    assert split_back_to_back(java_log, 2) == ends[:3]
    assert split_back_to_back(memoryview(java_log)[: ends[3] - 1], 1000) == ends[:3]  # a record cut off by a read
    assert split_back_to_back(java_log[:10], 5) == [0]
    damaged = bytearray(java_log)
    damaged[ends[1] : ends[1] + 4] = (7).to_bytes(4, "big")  # a TOTALSIZE below any record's
    assert split_back_to_back(bytes(damaged), 1000) == ends[:2]


def test_java_record_zero_decodes_to_every_documented_field(java_log: bytes) -> None:
    record = decode(java_log, 0)
    assert record.magic == MAGIC_V1
    assert record.body_crc == 151131488 == body_crc(record.body)
    assert record.sysflag == 0
    assert record.born_timestamp == 1551613204833
    assert record.born_host == HostAddress("127.0.0.1", 0)
    assert record.store_timestamp == 1551613204834
    assert record.store_host == HostAddress("10.1.30.38", 8123)
    assert record.reconsume_times == 0
    assert record.prepared_tx_offset == 0
    assert record.body == b"Once, there was a chance for me!"
    assert record.topic == "abc"
    assert record.queue_id == 0
    assert list(record.properties.items()) == [("0", "imagoodperson0"), ("KEYS", "1551613204833"), ("TAGS", "TAG1")]
    assert record.keys == ["1551613204833"]
    assert record.tags == "TAG1"
    raw_properties = b"0\x01imagoodperson0\x02KEYS\x011551613204833\x02TAGS\x01TAG1\x02"
    assert java_log[172 - len(raw_properties) : 172] == raw_properties
    assert record.offset_msg_id == "0A011E2600001FBB0000000000000000"
    assert store_timestamp_of(java_log, 0) == 1551613204834


@pytest.mark.parametrize("length", [0, 39, 63])
def test_a_record_cut_short_has_no_store_timestamp_but_a_typed_error(java_log: bytes, length: int) -> None:
    # 40 bytes hold SYSFLAG, 64 the (IPv4) STORETIMESTAMP: what a follower may see just after a writer restart
    with pytest.raises(CorruptRecordError, match="too few"):
        store_timestamp_of(java_log[:length])
    assert store_timestamp_of(java_log[:64]) == 1551613204834


def test_java_fixture_has_47_records_then_the_blank(java_log: bytes) -> None:
    records = list(iter_records(java_log))
    assert len(records) == 47
    for index, (position, record) in enumerate(records):
        assert position == 172 * index
        assert record_size_at(java_log, position) == (172, MAGIC_V1)
        assert (record.queue_offset, record.physical_offset, record.queue_id, record.topic) == (
            index,
            172 * index,
            0,
            "abc",
        )
        assert record.encode() == java_log[position : position + 172]
    assert java_log[8084:8092] == bytes.fromhex("0000006ccbd43194")
    assert record_size_at(java_log, 8084) == (108, MAGIC_BLANK)
    assert java_log[8092:] == bytes(100)
    assert blank_record(108) == java_log[8084:]


def test_tag_hash_of_the_fixture_tag_and_java_string_hashes() -> None:
    assert tag_hash("TAG1") == 2567159
    assert tag_hash(None) == 0
    assert tag_hash("") == 0
    assert java_string_hash("abc") == 96354
    assert java_string_hash("order-123") == -392797389
    assert java_string_hash("rocketmq") == -518197384
    assert java_string_hash("polygenelubricants") == -2147483648
    # A character outside the BMP counts as two UTF-16 code units, as in Java.
    assert java_string_hash("\U0001f600") == 31 * 0xD83D + 0xDE00


def test_body_crc_matches_rocketmq() -> None:
    assert body_crc(b"hello!q!") == 0x3CD1C123


def test_rust_fixture_records(rust_log: bytes) -> None:
    records = list(iter_records(rust_log))
    assert [position for position, _ in records] == [0, 141]
    first = records[0][1]
    assert len(first.encode()) == 141
    assert first.body_crc == 0x666CBE46
    assert (first.queue_id, first.queue_offset, first.physical_offset, first.born_timestamp) == (0, 0, 0, 0)
    assert first.born_host == first.store_host == HostAddress("127.0.0.1", 10911)
    assert first.store_timestamp == 1786727751703
    assert first.body == b"v0.9.0-message-0"
    assert first.topic == "V1UpgradeTopic"
    assert first.properties == {"KEYS": "v1-upgrade-key"}
    second = records[1][1]
    assert (second.queue_offset, second.physical_offset, second.body) == (1, 141, b"v0.9.0-message-1")
    assert rust_log[282:] == bytes(len(rust_log) - 282)


def test_rewrite_physical_offset_changes_only_that_field(java_log: bytes) -> None:
    raw = java_log[172:344]
    moved = rewrite_physical_offset(raw, 1 << 40)
    assert decode(moved).physical_offset == 1 << 40
    assert moved[:28] == raw[:28] and moved[36:] == raw[36:]


def test_a_flipped_body_byte_fails_the_crc(java_log: bytes) -> None:
    raw = bytearray(java_log[:172])
    raw[100] ^= 0x01  # inside the 32-byte body, which starts at 88
    with pytest.raises(CorruptRecordError, match="CRC") as caught:
        decode(bytes(raw), location="commitlog/00000000000000000000")
    assert "at offset 0" in str(caught.value)
    assert decode(bytes(raw), check_crc=False).body != b"Once, there was a chance for me!"


def test_separator_in_a_property_is_a_typed_error() -> None:
    record = MessageRecord(topic="t", queue_id=0, body=b"", properties={"a": "x\x02y"})
    with pytest.raises(InvalidPropertyError, match="separator"):
        record.encode()
    with pytest.raises(InvalidPropertyError, match="UTF-8"):
        MessageRecord(topic="t", queue_id=0, body=b"", properties={"a": "\ud800"}).encode()
    with pytest.raises(InvalidPropertyError, match="32767"):
        MessageRecord(topic="t", queue_id=0, body=b"", properties={"a": "x" * 40000}).encode()


def test_long_topics_use_the_v2_layout() -> None:
    topic = "t" * 200
    raw = MessageRecord(topic=topic, queue_id=1, body=b"b").encode()
    assert struct.unpack_from(">I", raw, 4)[0] == MAGIC_V2
    assert decode(raw).topic == topic


hosts = st.one_of(
    st.builds(HostAddress, st.ip_addresses(v=4).map(str), st.integers(0, 65535)),
    st.builds(HostAddress, st.ip_addresses(v=6).map(str), st.integers(0, 65535)),
)
texts = st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)), max_size=20)
records = st.builds(
    MessageRecord,
    topic=st.text("abcXYZ019_-%|", min_size=1, max_size=300),
    queue_id=st.integers(0, 2**31 - 1),
    body=st.binary(max_size=300),
    properties=st.dictionaries(texts.filter(bool), texts, max_size=5),
    queue_offset=st.integers(0, 2**63 - 1),
    physical_offset=st.integers(0, 2**63 - 1),
    flag=st.integers(-(2**31), 2**31 - 1),
    sysflag=st.sampled_from([0, 1, 2, 4, 8, 0xC]),
    born_timestamp=st.integers(0, 2**63 - 1),
    born_host=hosts,
    store_timestamp=st.integers(0, 2**63 - 1),
    store_host=hosts,
    reconsume_times=st.integers(0, 2**31 - 1),
    prepared_tx_offset=st.integers(0, 2**63 - 1),
)


@settings(max_examples=300, deadline=None)
@given(records)
def test_encode_then_decode_is_identity(record: MessageRecord) -> None:
    raw = record.encode()
    decoded = decode(raw)
    assert decoded.encode() == raw
    assert decoded.body == record.body
    assert decoded.properties == record.properties
    assert (decoded.topic, decoded.queue_id, decoded.queue_offset) == (
        record.topic,
        record.queue_id,
        record.queue_offset,
    )
    assert (decoded.born_host, decoded.store_host) == (record.born_host, record.store_host)
    assert bool(decoded.sysflag & SYSFLAG_BORNHOST_V6) == record.born_host.is_ipv6
    assert bool(decoded.sysflag & SYSFLAG_STOREHOST_V6) == record.store_host.is_ipv6
    assert decoded.magic == (MAGIC_V2 if len(record.topic) > 127 else MAGIC_V1)
    assert store_timestamp_of(raw) == record.store_timestamp


@settings(max_examples=200, deadline=None)
@given(records)
def test_a_record_laid_down_in_place_is_byte_identical_to_encode(record: MessageRecord) -> None:
    record = replace(record, sysflag=0, flag=0, reconsume_times=0, prepared_tx_offset=0)
    topic_raw = record.topic.encode("utf-8")
    layout = RecordLayout(topic_raw, born_host=record.born_host, store_host=record.store_host)
    tail = layout.tail(encode_properties(record.properties))
    size = layout.fixed_size + len(record.body) + len(tail)
    buffer = bytearray(b"\xee" * (size + 10))
    layout.fixed.pack_into(
        buffer, 5, size, layout.magic, body_crc(record.body), record.queue_id, 0, record.queue_offset,
        record.physical_offset, layout.sysflag, record.born_timestamp, layout.born_raw, record.store_timestamp,
        layout.store_raw, 0, 0, len(record.body),
    )  # fmt: skip
    buffer[5 + layout.fixed_size : 5 + size - len(tail)] = record.body
    buffer[5 + size - len(tail) : 5 + size] = tail
    assert bytes(buffer[5 : 5 + size]) == record.encode()
    assert buffer[:5] == buffer[5 + size :][:5] == b"\xee" * 5


@settings(max_examples=200, deadline=None)
@given(records, st.data())
def test_truncated_or_garbled_records_raise_only_corrupt_record_error(
    record: MessageRecord, data: st.DataObject
) -> None:
    raw = record.encode()
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(CorruptRecordError):
        decode(raw[:cut])
    position = data.draw(st.integers(0, len(raw) - 1))
    garbled = bytearray(raw)
    garbled[position] ^= data.draw(st.integers(1, 255))
    try:
        decoded = decode(bytes(garbled))
    except CorruptRecordError:
        return
    # Header and property bytes are outside the CRC, but a body that fails its CRC is never returned.
    assert body_crc(decoded.body) == decoded.body_crc


@settings(max_examples=200, deadline=None)
@given(records, st.data())
def test_verify_record_accepts_exactly_what_decode_accepts_and_locates_every_part(
    record: MessageRecord, data: st.DataObject
) -> None:
    raw = record.encode()
    fields = verify_record(raw)
    decoded = decode(raw)
    assert raw[fields.body_at : fields.body_at + fields.body_len] == decoded.body
    assert raw[fields.topic_at : fields.topic_at + fields.topic_len] == decoded.topic.encode("utf-8")
    assert (fields.total, fields.queue_id, fields.queue_offset, fields.store_timestamp) == (
        len(raw),
        decoded.queue_id,
        decoded.queue_offset,
        decoded.store_timestamp,
    )
    for name in ("TAGS", "KEYS", "UNIQ_KEY", "absent"):
        assert property_value(raw, fields, name) == decoded.properties.get(name)
    garbled = bytearray(raw)
    garbled[data.draw(st.integers(0, len(raw) - 1))] ^= data.draw(st.integers(1, 255))
    try:
        checked = verify_record(bytes(garbled))
    except CorruptRecordError:
        with pytest.raises(CorruptRecordError):
            decode(bytes(garbled))
        return
    topic_raw = bytes(garbled[checked.topic_at : checked.topic_at + checked.topic_len])
    try:
        topic_raw.decode("utf-8")
    except UnicodeDecodeError:
        # The one thing verify leaves to the reader, who compares the topic bytes with the topic it expects.
        with pytest.raises(CorruptRecordError):
            decode(bytes(garbled))
    else:
        decode(bytes(garbled))


def test_hosts_decode_as_the_fixture_documents_them(java_log: bytes) -> None:
    first, second = decode(java_log, 0), decode(java_log, 172)
    assert HostAddress.decode(first.born_host.encode()) == first.born_host
    assert first.store_host is second.store_host, "decoded hosts are shared, not rebuilt per record"
    v6 = HostAddress("2001:db8::7", 10911)
    assert HostAddress.decode(v6.encode()) == v6


def _walk_record_by_record(buf: bytes, max_count: int) -> list[int]:
    """What ``split_back_to_back`` must return: the plain walk, one header at a time."""
    ends, position = [0], 0
    while len(ends) <= max_count and position + MIN_RECORD_SIZE <= len(buf):
        size, magic = struct.unpack_from(">iI", buf, position)
        if size < MIN_RECORD_SIZE or position + size > len(buf) or magic not in (MAGIC_V1, MAGIC_V2):
            break
        position += size
        ends.append(position)
    return ends


@settings(max_examples=300, deadline=None)
@given(
    bodies=st.lists(st.sampled_from([0, 1, 7, 1024]), min_size=0, max_size=120),
    runs=st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=6),
    damage_at=st.integers(min_value=0, max_value=10**6),
    damage=st.sampled_from(["none", "size", "magic", "blank"]),
    cut=st.integers(min_value=0, max_value=200),
    max_count=st.integers(min_value=1, max_value=500),
)
def test_split_takes_runs_of_one_size_at_once_and_agrees_with_the_plain_walk(
    bodies: list[int], runs: list[int], damage_at: int, damage: str, cut: int, max_count: int
) -> None:
    # Records in runs of equal size (where the split reads ahead in one pass) between others.
    sizes = [body for body, run in zip(bodies, runs * (len(bodies) // len(runs) + 1), strict=False) for _ in range(run)]
    records = [
        MessageRecord(topic="t", queue_id=0, queue_offset=n, body=b"b" * size).encode() for n, size in enumerate(sizes)
    ]
    buf = bytearray(b"".join(records))
    if records and damage != "none":
        starts = list(itertools.accumulate((len(r) for r in records), initial=0))[:-1]
        at = starts[damage_at % len(starts)]
        if damage == "size":
            buf[at : at + 4] = (len(records[0]) + 1).to_bytes(4, "big")
        elif damage == "magic":
            buf[at + 4 : at + 8] = (0x12345678).to_bytes(4, "big")
        else:
            buf[at : at + 8] = blank_record(MIN_RECORD_SIZE)[:8]
    data = bytes(buf[: max(0, len(buf) - cut)])
    assert split_back_to_back(data, max_count) == _walk_record_by_record(data, max_count)
    assert split_back_to_back(memoryview(data), max_count) == _walk_record_by_record(data, max_count)


def test_split_of_many_equal_records_stops_at_the_count_and_at_a_damaged_one() -> None:
    record = MessageRecord(topic="t", queue_id=0, body=b"x" * 1000).encode()
    buf = bytearray(record * 5000)
    assert split_back_to_back(bytes(buf), 4096) == list(range(0, 4097 * len(record), len(record)))
    buf[3000 * len(record) + 4] ^= 0xFF  # the 3001st record's magic
    assert split_back_to_back(bytes(buf), 4096) == list(range(0, 3001 * len(record), len(record)))
