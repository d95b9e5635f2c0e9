"""Every decoder fed random and bit-flipped bytes: only typed errors, never a hang, never wrong data.

"Wrong data" is judged against what each layout can vouch for. A message body is covered by its
CRC, and so are index headers and index items; RocketMQ's record header, topic and properties and
its consume-queue units carry no checksum, so a flip there can change a decoded field without an
error (the archive checker cross-checks those fields instead). A flip may never change a body that
is returned, and bytes that were never flipped must decode to exactly what was encoded.
"""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.fixtures.paths import ROCKETMQ_FIXTURES
from tieredstore.errors import CorruptRecordError, IntegrityError, TieredStoreError, ValidationError
from tieredstore.formats.consume_queue import UNIT_SIZE, ConsumeQueueUnit, encode_units, iter_units
from tieredstore.formats.index_file import RocketMQIndexFile, slot_of
from tieredstore.formats.message import (
    MessageRecord,
    body_crc,
    decode,
    iter_records,
    record_size_at,
)
from tieredstore.formats.naming import parse_segment_name, segment_name
from tieredstore.index.format import (
    COMPACTED_ITEM_SIZE,
    COMPACTED_SLOT_SIZE,
    HEADER_SIZE,
    UNSEALED_ITEM_SIZE,
    CompactedHeader,
    IndexItem,
    SlotRange,
    UnsealedHeader,
    compact_into,
    compacted_file_size,
    compacted_item_position,
    compacted_slot_position,
    decode_compacted_items,
    decode_compacted_slot,
    decode_unsealed_item,
    encode_compacted_item,
    encode_unsealed_item,
    unsealed_file_size,
    unsealed_item_position,
    unsealed_slot_position,
    walk_unsealed_chain,
)
from tieredstore.local.checkpoint import Checkpoint
from tieredstore.providers.chunks import (
    Chunk,
    ObjectInfo,
    chunk_name,
    chunks_in,
    contiguous_run,
    parse_chunk_name,
    slices_for,
)

pytestmark = pytest.mark.timeout(120)  # a decoder that loops fails the test instead of hanging CI

# A decode of a few hundred bytes takes microseconds; a second means a runaway loop.
FUZZ = settings(max_examples=300, deadline=1000, suppress_health_check=[HealthCheck.too_slow])
ROCKETMQ_INDEX = ROCKETMQ_FIXTURES / "rust-0.9.0-writer" / "index" / "20260815011551705"


def flip(data: bytes, bit: int) -> bytes:
    """``data`` with one bit inverted (bit 0 is the top bit of byte 0)."""
    out = bytearray(data)
    out[bit // 8] ^= 0x80 >> (bit % 8)
    return bytes(out)


# ---- message records -----------------------------------------------------------------------------

property_text = st.text(st.characters(blacklist_characters="\x01\x02", codec="utf-8"), max_size=12)
records = st.builds(
    MessageRecord,
    topic=st.text("abcXYZ019_-%|", min_size=1, max_size=140),
    queue_id=st.integers(0, 2**31 - 1),
    body=st.binary(max_size=200),
    properties=st.dictionaries(property_text.filter(bool), property_text, max_size=4),
    queue_offset=st.integers(0, 2**63 - 1),
    physical_offset=st.integers(0, 2**63 - 1),
    store_timestamp=st.integers(0, 2**63 - 1),
)


def body_span(raw: bytes) -> tuple[int, int]:
    """Where the body sits in an encoded record (IPv4 hosts, as ``records`` makes them)."""
    (body_len,) = struct.unpack_from(">i", raw, 84)
    return 88, 88 + body_len


@FUZZ
@given(st.binary(max_size=400), st.integers(0, 64))
def test_random_bytes_decode_to_a_record_with_a_good_crc_or_a_corrupt_record_error(data: bytes, pos: int) -> None:
    try:
        record = decode(data, min(pos, len(data)))
    except CorruptRecordError:
        return
    assert body_crc(record.body) == record.body_crc


@FUZZ
@given(records, st.data())
def test_a_flipped_bit_never_yields_a_wrong_body(record: MessageRecord, data: st.DataObject) -> None:
    raw = record.encode()
    bit = data.draw(st.integers(0, len(raw) * 8 - 1))
    start, end = body_span(raw)
    covered = bit // 8 < 12 or start <= bit // 8 < end  # TOTALSIZE, MAGICCODE, BODYCRC and the body
    try:
        decoded = decode(flip(raw, bit), location="fuzz")
    except CorruptRecordError as error:
        refused: CorruptRecordError | None = error
    else:
        refused = None
    if refused is not None:
        assert (refused.location, refused.offset) == ("fuzz", 0)  # the error says where
        return
    assert not covered, f"bit {bit} lies in a checked field but the record decoded"
    assert decoded.body == record.body


@FUZZ
@given(st.binary(max_size=64), st.integers(-4, 80))
def test_record_size_at_reads_eight_bytes_or_raises(data: bytes, pos: int) -> None:
    pos = max(0, pos)
    try:
        size, magic = record_size_at(data, pos)
    except CorruptRecordError:
        assert len(data) - pos < 8
        return
    assert (size, magic) == struct.unpack_from(">iI", data, pos)


@FUZZ
@given(st.lists(records, min_size=1, max_size=4), st.data())
def test_iter_records_over_a_flipped_log_yields_true_bodies_then_stops_with_a_typed_error(
    batch: list[MessageRecord], data: st.DataObject
) -> None:
    raws = [r.encode() for r in batch]
    log = b"".join(raws)
    positions = [sum(len(r) for r in raws[:i]) for i in range(len(raws))]
    assert [(p, r.body) for p, r in iter_records(log)] == list(zip(positions, [r.body for r in batch], strict=True))
    damaged = flip(log, data.draw(st.integers(0, len(log) * 8 - 1)))
    seen: list[tuple[int, bytes]] = []
    try:
        for position, record in iter_records(damaged):
            seen.append((position, record.body))
    except CorruptRecordError:
        pass
    else:
        assert len(seen) == len(batch)  # one flip can neither forge a blank record nor hide a record
    for (position, body), expected_position, original in zip(seen, positions, batch, strict=False):
        assert (position, body) == (expected_position, original.body)


@FUZZ
@given(st.binary(max_size=600))
def test_iter_records_over_random_bytes_ends_or_raises_typed(data: bytes) -> None:
    try:
        for _, record in iter_records(data):
            assert body_crc(record.body) == record.body_crc
    except CorruptRecordError:
        pass


# ---- consume-queue units -------------------------------------------------------------------------

units = st.builds(
    ConsumeQueueUnit, st.integers(0, 2**63 - 1), st.integers(0, 2**31 - 1), st.integers(-(2**63), 2**63 - 1)
)


@FUZZ
@given(st.binary(max_size=120))
def test_random_consume_queue_bytes_decode_exactly_or_raise_typed(data: bytes) -> None:
    try:
        decoded = list(iter_units(data))
    except CorruptRecordError:
        fields = [struct.unpack_from(">qiq", data, p) for p in range(0, len(data) - len(data) % UNIT_SIZE, UNIT_SIZE)]
        assert len(data) % UNIT_SIZE or any(offset < 0 or size < 0 for offset, size, _ in fields)
        return
    assert encode_units(decoded) == data


@FUZZ
@given(st.lists(units, max_size=10), st.data())
def test_units_round_trip_and_a_flip_changes_at_most_the_unit_it_hits(
    unit_list: list[ConsumeQueueUnit], data: st.DataObject
) -> None:
    raw = encode_units(unit_list)
    assert list(iter_units(raw)) == unit_list
    if not raw:
        return
    bit = data.draw(st.integers(0, len(raw) * 8 - 1))
    try:
        damaged = list(iter_units(flip(raw, bit)))
    except CorruptRecordError:
        return  # a sign bit flipped: negative offset or size
    hit = bit // 8 // UNIT_SIZE
    assert [u for i, u in enumerate(damaged) if i != hit] == [u for i, u in enumerate(unit_list) if i != hit]


# ---- key-index files -----------------------------------------------------------------------------

index_items = st.builds(
    IndexItem,
    topic_id=st.integers(0, 100),
    queue_id=st.integers(0, 7),
    queue_offset=st.integers(0, 2**40),
    size=st.integers(1, 4096),
    key_hash=st.integers(0, 2**31 - 1),
    timestamp=st.integers(1_000_000, 1_000_000 + 2**30),
)
unsealed_headers = st.builds(
    UnsealedHeader,
    file_id=st.integers(0, 2**63),
    created_at=st.integers(0, 2**62),
    base_timestamp=st.integers(0, 2**62),
    slot_count=st.integers(1, 2**32 - 1),
    max_items=st.integers(1, 2**32 - 2),
    begin_timestamp=st.integers(0, 2**62),
    end_timestamp=st.integers(0, 2**62),
    item_count=st.just(0),
    sealed=st.booleans(),
)


@FUZZ
@given(st.binary(min_size=0, max_size=80))
def test_random_index_headers_are_refused_with_typed_errors(data: bytes) -> None:
    for decoder in (UnsealedHeader.decode, CompactedHeader.decode):
        try:
            decoder(data)
        except IntegrityError:
            continue
        pytest.fail("random bytes passed an index header CRC")  # 1 in 2**32: not a flaky outcome


@FUZZ
@given(unsealed_headers, st.data())
def test_a_flipped_unsealed_header_is_a_corrupt_record_error(header: UnsealedHeader, data: st.DataObject) -> None:
    raw = header.encode()
    assert UnsealedHeader.decode(raw) == header
    with pytest.raises(CorruptRecordError):
        UnsealedHeader.decode(flip(raw, data.draw(st.integers(0, len(raw) * 8 - 1))))


@FUZZ
@given(
    st.builds(
        CompactedHeader,
        st.integers(0, 2**63),
        st.integers(0, 2**62),
        st.integers(0, 2**62),
        st.integers(1, 2**32 - 1),
        st.integers(0, 2**32 - 1),
    ),
    st.data(),
)
def test_a_flipped_compacted_header_fails_or_the_flip_was_in_the_padding(
    header: CompactedHeader, data: st.DataObject
) -> None:
    raw = header.encode()
    assert CompactedHeader.decode(raw) == header
    bit = data.draw(st.integers(0, HEADER_SIZE * 8 - 1))
    try:
        decoded = CompactedHeader.decode(flip(raw, bit))
    except CorruptRecordError:
        return
    assert bit // 8 >= 44 and decoded == header  # the 20 zero bytes after the CRC are not read


@FUZZ
@given(index_items, st.integers(0, 2**32 - 1), st.data())
def test_a_flipped_index_item_is_a_corrupt_record_error(item: IndexItem, previous: int, data: st.DataObject) -> None:
    base = 1_000_000
    unsealed = encode_unsealed_item(item, base, previous)
    assert decode_unsealed_item(unsealed, 0, base) == (item, previous)
    with pytest.raises(CorruptRecordError):
        decode_unsealed_item(flip(unsealed, data.draw(st.integers(0, UNSEALED_ITEM_SIZE * 8 - 1))), 0, base)
    compacted = encode_compacted_item(item, base)
    slot_count = 1
    assert decode_compacted_items(compacted, SlotRange(0, 1), 0, slot_count, base) == [item]
    bit = data.draw(st.integers(0, COMPACTED_ITEM_SIZE * 8 - 1))
    with pytest.raises(CorruptRecordError):
        decode_compacted_items(flip(compacted, bit), SlotRange(0, 1), 0, slot_count, base)


@FUZZ
@given(st.binary(min_size=0, max_size=12), st.integers(0, 2**32))
def test_random_compacted_slots_are_in_range_or_refused(data: bytes, item_count: int) -> None:
    try:
        found = decode_compacted_slot(data, item_count)
    except CorruptRecordError:
        return
    assert len(data) == COMPACTED_SLOT_SIZE and found.position + found.length <= item_count


def build_unsealed(items: list[IndexItem], slot_count: int, base: int) -> tuple[bytearray, UnsealedHeader]:
    header = UnsealedHeader(
        file_id=1,
        created_at=base,
        base_timestamp=base,
        slot_count=slot_count,
        max_items=max(1, len(items)),
        begin_timestamp=base,
        end_timestamp=max((i.timestamp for i in items), default=base),
        item_count=len(items),
        sealed=True,
    )
    image = bytearray(unsealed_file_size(slot_count, header.max_items))
    image[:HEADER_SIZE] = header.encode()
    heads = [0] * slot_count
    for number, item in enumerate(items, start=1):
        slot = slot_of(item.key_hash, slot_count)
        pos = unsealed_item_position(slot_count, number)
        image[pos : pos + UNSEALED_ITEM_SIZE] = encode_unsealed_item(item, base, heads[slot])
        heads[slot] = number
    for slot, head in enumerate(heads):
        image[unsealed_slot_position(slot) : unsealed_slot_position(slot) + 4] = head.to_bytes(4, "big")
    return image, header


def chain_lookup(image: bytes, header: UnsealedHeader, hash_value: int) -> list[IndexItem]:
    slot = slot_of(hash_value, header.slot_count)
    (first,) = struct.unpack_from(">I", image, unsealed_slot_position(slot))
    return list(walk_unsealed_chain(image, header, first, header.item_count, hash_value))


def compacted_lookup(image: bytes, header: CompactedHeader, hash_value: int) -> list[IndexItem]:
    slot = slot_of(hash_value, header.slot_count)
    pos = compacted_slot_position(slot)
    slot_range = decode_compacted_slot(image[pos : pos + COMPACTED_SLOT_SIZE], header)
    start = compacted_item_position(header.slot_count, slot_range.position)
    raw = image[start : start + slot_range.length * COMPACTED_ITEM_SIZE]
    items = decode_compacted_items(raw, slot_range, slot, header.slot_count, header.begin_timestamp)
    return [item for item in items if item.key_hash == hash_value]


@settings(max_examples=150, deadline=2000)
@given(st.lists(index_items, min_size=1, max_size=25), st.integers(1, 7), st.data())
def test_flipped_index_files_answer_true_items_or_raise_typed(
    items: list[IndexItem], slot_count: int, data: st.DataObject
) -> None:
    base = 1_000_000
    image, header = build_unsealed(items, slot_count, base)
    compacted = bytearray(compacted_file_size(slot_count, len(items)))
    compacted_header = compact_into(compacted, image, header, len(items))
    hashes = sorted({item.key_hash for item in items})
    truth = {h: sorted((i for i in items if i.key_hash == h), key=repr) for h in hashes}
    for h in hashes:
        assert sorted(chain_lookup(bytes(image), header, h), key=repr) == truth[h]
        assert sorted(compacted_lookup(bytes(compacted), compacted_header, h), key=repr) == truth[h]

    damaged_unsealed = flip(bytes(image), data.draw(st.integers(HEADER_SIZE * 8, len(image) * 8 - 1)))
    damaged_compacted = flip(bytes(compacted), data.draw(st.integers(HEADER_SIZE * 8, len(compacted) * 8 - 1)))

    def damaged_chain_lookup(hash_value: int) -> list[IndexItem]:
        return chain_lookup(damaged_unsealed, header, hash_value)

    def damaged_compacted_lookup(hash_value: int) -> list[IndexItem]:
        return compacted_lookup(damaged_compacted, compacted_header, hash_value)

    for h in hashes:
        for damaged_lookup in (damaged_chain_lookup, damaged_compacted_lookup):
            try:
                found = damaged_lookup(h)
            except CorruptRecordError:
                continue
            # Slot entries carry no CRC: a flip may hide items, but every item returned is a true one.
            assert all(item in truth[h] for item in found)


@FUZZ
@given(st.binary(min_size=0, max_size=2 * 1024), st.integers(0, 2**31 - 1))
def test_walking_a_chain_through_random_items_terminates_with_typed_errors(garbage: bytes, first: int) -> None:
    header = UnsealedHeader(file_id=1, created_at=0, base_timestamp=0, slot_count=4, max_items=64, item_count=64)
    image = bytearray(header.file_size)
    image[: len(garbage)] = garbage[: len(image)]
    steps = 0
    try:
        for _ in walk_unsealed_chain(bytes(image), header, first, header.item_count, 12345):
            steps += 1
    except CorruptRecordError:
        pass
    assert steps <= header.item_count


@FUZZ
@given(st.binary(min_size=0, max_size=4096), st.integers(1, 8), st.integers(1, 16), st.text(max_size=10))
def test_random_rocketmq_index_files_are_read_or_refused_typed(
    data: bytes, slot_capacity: int, item_capacity: int, key: str
) -> None:
    size = 40 + slot_capacity * 4 + item_capacity * 20
    for candidate in (data, (data * (size // max(1, len(data)) + 1))[:size] if data else bytes(size)):
        try:
            index = RocketMQIndexFile(candidate, slot_capacity=slot_capacity, item_capacity=item_capacity)
            index.lookup(key, -(2**63), 2**63 - 1)
        except TieredStoreError:
            continue


@FUZZ
@given(st.integers(0, 2728 * 8 - 1), st.text(max_size=20))
@example(bit=0, key="V1UpgradeTopic#v1-upgrade-key")
def test_a_flipped_rocketmq_index_fixture_is_read_or_refused_typed(bit: int, key: str) -> None:
    data = flip(ROCKETMQ_INDEX.read_bytes(), bit)
    try:
        index = RocketMQIndexFile(data, slot_capacity=32, item_capacity=128)
        for probe in (key, "V1UpgradeTopic#v1-upgrade-key"):
            index.lookup(probe, -(2**63), 2**63 - 1)
    except TieredStoreError:
        pass


# ---- chunk listings and segment names -------------------------------------------------------------

names = st.one_of(
    st.text(max_size=30),
    st.integers(0, 10**20 - 1).map(chunk_name),
    st.integers(0, 10**20 - 1).map(lambda n: chunk_name(n) + "\n"),
    st.just("\u0660" * 20),  # ARABIC-INDIC DIGIT ZERO: a digit to "\d", not to S3
    st.sampled_from([".created", "", "0" * 19, "0" * 21, "+" + "0" * 19]),
)


@FUZZ
@given(names)
@example("0" * 20 + "\n")
@example("\u0660" * 20)
def test_only_canonical_chunk_names_parse(name: str) -> None:
    start = parse_chunk_name(name)
    assert start is None or chunk_name(start) == name


@FUZZ
@given(st.lists(st.builds(ObjectInfo, names, st.integers(0, 50)), max_size=12, unique_by=lambda o: o.name))
def test_chunk_listings_give_a_contiguous_run_from_zero(objects: list[ObjectInfo]) -> None:
    chunks = chunks_in(objects)
    assert [c.start for c in chunks] == sorted(c.start for c in chunks)
    assert {(c.name, c.size) for c in chunks} <= {(o.name, o.size) for o in objects}
    run = contiguous_run(chunks)
    end = 0
    for chunk in run:
        assert chunk.start == end and chunk.size > 0
        end = chunk.end
    assert not any(c.start == end and c.size > 0 for c in chunks)  # the run stops only at a gap or an empty chunk


@FUZZ
@given(st.lists(st.integers(1, 20), max_size=8), st.integers(0, 200), st.integers(-5, 200))
def test_slices_cover_exactly_the_requested_range(sizes: list[int], position: int, length: int) -> None:
    run, start = [], 0
    for size in sizes:
        run.append(Chunk(start, size))
        start += size
    slices = slices_for(run, position, length)
    if length <= 0 or position + length > start:
        assert slices == []
        return
    content = bytes(i % 251 for i in range(start))
    stitched = b"".join(content[s.chunk.start + s.offset : s.chunk.start + s.offset + s.length] for s in slices)
    assert stitched == content[position : position + length]


@FUZZ
@given(
    st.one_of(
        st.text(max_size=32),
        st.integers(0, 10**20 - 1).map(segment_name),
        st.integers(0, 10**20 - 1).map(lambda n: segment_name(n) + "\n"),
    )
)
@example("cfcd2084" + "\u0660" * 20)
@example("cfcd208400000000000000000000\n")
def test_only_canonical_segment_names_parse(name: str) -> None:
    try:
        base = parse_segment_name(name)
    except ValidationError:
        return
    assert segment_name(base) == name


# ---- the hot store checkpoint ---------------------------------------------------------------------


@FUZZ
@given(st.binary(max_size=64))
def test_random_checkpoint_files_are_ignored_unless_they_carry_their_crc(
    tmp_path_factory: pytest.TempPathFactory, data: bytes
) -> None:
    path = tmp_path_factory.mktemp("checkpoint") / "checkpoint"
    path.write_bytes(data)
    found = Checkpoint.read(path)
    if found is not None:
        assert zlib.crc32(data[:40]) == struct.unpack_from(">I", data, 40)[0]


@FUZZ
@given(st.builds(Checkpoint, *(st.integers(0, 2**63 - 1) for _ in range(4))), st.integers(0, 4096 * 8 - 1))
def test_a_flipped_checkpoint_is_ignored_or_reads_unchanged(
    tmp_path_factory: pytest.TempPathFactory, checkpoint: Checkpoint, bit: int
) -> None:
    path = tmp_path_factory.mktemp("checkpoint") / "checkpoint"
    raw = checkpoint.encode()
    path.write_bytes(raw)
    assert Checkpoint.read(path) == checkpoint
    path.write_bytes(flip(raw, bit))
    found = Checkpoint.read(path)
    if bit // 8 < 44:
        assert found is None  # every field and the CRC itself are covered
    else:
        assert found == checkpoint
