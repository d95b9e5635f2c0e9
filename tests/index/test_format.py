"""Byte layouts of our key-index files: unsealed and compacted (RocketMQ's IndexFile: tests/formats)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tieredstore.errors import CorruptRecordError
from tieredstore.formats.index_file import key_hash, slot_of
from tieredstore.index.format import (
    COMPACTED_ITEM_SIZE,
    HEADER_SIZE,
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
    encode_unsealed_item,
    unsealed_file_size,
    unsealed_item_position,
    unsealed_slot_position,
)


def _build_unsealed(items: list[IndexItem], slot_count: int, base: int) -> tuple[bytearray, UnsealedHeader]:
    """An unsealed file image built with the pure encoders (what file.py writes through a map)."""
    header = UnsealedHeader(
        file_id=7,
        created_at=base,
        base_timestamp=base,
        slot_count=slot_count,
        max_items=max(1, len(items)),
        begin_timestamp=min((i.timestamp for i in items), default=0),
        end_timestamp=max((i.timestamp for i in items), default=0),
        item_count=len(items),
        sealed=True,
    )
    image = bytearray(unsealed_file_size(slot_count, header.max_items))
    image[:HEADER_SIZE] = header.encode()
    heads = [0] * slot_count
    for number, item in enumerate(items, start=1):
        slot = slot_of(item.key_hash, slot_count)
        pos = unsealed_item_position(slot_count, number)
        image[pos : pos + 36] = encode_unsealed_item(item, base, heads[slot])
        heads[slot] = number
    for slot, head in enumerate(heads):
        pos = unsealed_slot_position(slot)
        image[pos : pos + 4] = head.to_bytes(4, "big")
    return image, header


def _compact(items: list[IndexItem], slot_count: int, base: int = 1_000_000) -> tuple[bytearray, CompactedHeader]:
    image, header = _build_unsealed(items, slot_count, base)
    out = bytearray(compacted_file_size(slot_count, len(items)))
    compacted = compact_into(out, image, header, len(items))
    return out, compacted


def _lookup(data: bytes | bytearray, header: CompactedHeader, hash_value: int) -> list[IndexItem]:
    slot = slot_of(hash_value, header.slot_count)
    pos = compacted_slot_position(slot)
    slot_range = decode_compacted_slot(data[pos : pos + 8], header)
    start = compacted_item_position(header.slot_count, slot_range.position)
    raw = data[start : start + slot_range.length * COMPACTED_ITEM_SIZE]
    items = decode_compacted_items(raw, slot_range, slot, header.slot_count, header.begin_timestamp)
    return [item for item in items if item.key_hash == hash_value]


keys = st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=0x2FFF), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(
    entries=st.lists(st.tuples(keys, st.integers(0, 7), st.integers(-500_000, 500_000)), min_size=0, max_size=60),
    slot_count=st.integers(1, 17),
)
def test_compacted_lookup_finds_exactly_the_items_of_each_key(
    entries: list[tuple[str, int, int]], slot_count: int
) -> None:
    items = [
        IndexItem(
            topic_id=3,
            queue_id=queue,
            queue_offset=n,
            size=100 + n,
            key_hash=key_hash("T", key),
            timestamp=1_000_000 + ts,
        )
        for n, (key, queue, ts) in enumerate(entries)
    ]
    data, header = _compact(items, slot_count)
    assert header.item_count == len(items)
    assert CompactedHeader.decode(data) == header
    for key in {key for key, _, _ in entries}:
        wanted = key_hash("T", key)
        expected = [item for item in reversed(items) if item.key_hash == wanted]
        assert _lookup(data, header, wanted) == expected


def test_compacted_slot_items_are_contiguous_newest_first() -> None:
    items = [IndexItem(1, 0, n, 10, key_hash("T", f"k{n % 3}"), 5_000 + n) for n in range(9)]
    data, header = _compact(items, slot_count=1)
    slot_range = decode_compacted_slot(data[HEADER_SIZE : HEADER_SIZE + 8], header)
    assert slot_range == SlotRange(0, 9)
    all_items = decode_compacted_items(data[compacted_item_position(1, 0) :], slot_range, 0, 1, header.begin_timestamp)
    assert [item.queue_offset for item in all_items] == list(range(8, -1, -1))


def test_flipped_item_byte_is_a_corrupt_record_error() -> None:
    items = [IndexItem(1, 0, 42, 10, key_hash("T", "k"), 5_000)]
    data, header = _compact(items, slot_count=4)
    data[compacted_item_position(4, 0) + 9] ^= 0xFF
    with pytest.raises(CorruptRecordError, match="CRC"):
        _lookup(data, header, key_hash("T", "k"))


def test_slot_pointing_past_the_items_is_a_corrupt_record_error() -> None:
    items = [IndexItem(1, 0, 42, 10, key_hash("T", "k"), 5_000)]
    data, header = _compact(items, slot_count=4)
    pos = compacted_slot_position(slot_of(key_hash("T", "k"), 4))
    data[pos : pos + 8] = (0).to_bytes(4, "big") + (9).to_bytes(4, "big")
    with pytest.raises(CorruptRecordError, match="past the 1 in the file"):
        _lookup(data, header, key_hash("T", "k"))


def test_bad_header_magic_and_crc_are_typed_errors() -> None:
    data, _ = _compact([IndexItem(1, 0, 1, 1, 5, 1_000_000)], slot_count=2)
    torn = bytearray(data)
    torn[20] ^= 0x01
    with pytest.raises(CorruptRecordError, match="header CRC"):
        CompactedHeader.decode(torn)
    with pytest.raises(CorruptRecordError, match="not an unsealed index file"):
        UnsealedHeader.decode(data)
    with pytest.raises(CorruptRecordError, match="truncated"):
        CompactedHeader.decode(data[:10])
