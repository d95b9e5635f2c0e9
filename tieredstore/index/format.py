"""Byte layouts of our key-index files (unsealed and compacted); pure, no I/O.

Every integer is big-endian. Item numbers start at 1; 0 means "none" (an empty slot, the end of a chain).

**Unsealed** (a hash table with chained items, written in place while messages are archived)::

    header (64)   magic, version, flags, file_id, created_at, base_timestamp, begin_timestamp,
                  end_timestamp, slot_count, max_items, item_count, crc32 of the 60 bytes before it
    slots         slot_count x u32: number of the newest item whose key hash falls in the slot
    items         max_items x 36: topic_id i32, queue_id i32, queue_offset i64, size i32, key_hash i32,
                  time_diff i32 (ms since base_timestamp), previous item number u32, crc32 of the 32 before

**Compacted** (what is uploaded; every slot's items are contiguous, newest first)::

    header (64)   magic, version, flags, file_id, begin_timestamp, end_timestamp, slot_count,
                  item_count, crc32 of the 40 bytes before it, 20 zero bytes
    slots         slot_count x (first item index u32, item count u32)
    items         item_count x 32: topic_id, queue_id, queue_offset, size, key_hash,
                  time_diff u32 (ms since begin_timestamp), crc32

so a lookup is two ranged reads: the slot's 8 bytes, then its items. Everything a reader needs to
place them (slot count, item count, begin timestamp) follows from what a catalogue records anyway
(file size, item count, time interval), so the header itself never has to be fetched.

RocketMQ's own local IndexFile, and the ``topic#key`` hash both layouts use, are in
``tieredstore.formats.index_file``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

from tieredstore.errors import CorruptRecordError, IntegrityError, ValidationError
from tieredstore.formats.checksum import crc32
from tieredstore.formats.index_file import ReadableBuffer, slot_of

UNSEALED_MAGIC = 0x54534958  # "TSIX"
COMPACTED_MAGIC = 0x5453435A  # "TSCZ"
FORMAT_VERSION = 1
FLAG_SEALED = 0x1

HEADER_SIZE = 64
_UNSEALED_HEADER = struct.Struct(">IHHQqqqqIII")
_COMPACTED_HEADER = struct.Struct(">IHHQqqII")
_CRC = struct.Struct(">I")
_SLOT = struct.Struct(">I")
_UNSEALED_ITEM = struct.Struct(">iiqiiiI")
_COMPACTED_ITEM = struct.Struct(">iiqiiI")
_COMPACTED_SLOT = struct.Struct(">II")

UNSEALED_SLOT_SIZE = _SLOT.size
UNSEALED_ITEM_SIZE = _UNSEALED_ITEM.size + _CRC.size  # 36
COMPACTED_SLOT_SIZE = _COMPACTED_SLOT.size  # 8
COMPACTED_ITEM_SIZE = _COMPACTED_ITEM.size + _CRC.size  # 32

INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1
UINT32_MAX = (1 << 32) - 1


def _crc(data: ReadableBuffer) -> int:
    return crc32(data) & 0xFFFFFFFF


@dataclass(frozen=True, slots=True)
class IndexItem:
    """One indexed key occurrence: where the message is and when it was stored."""

    topic_id: int
    queue_id: int
    queue_offset: int
    size: int
    key_hash: int
    timestamp: int


# ---- unsealed layout ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class UnsealedHeader:
    """The header of an unsealed (or sealed, not yet compacted) index file."""

    file_id: int
    created_at: int
    base_timestamp: int
    slot_count: int
    max_items: int
    begin_timestamp: int = 0
    end_timestamp: int = 0
    item_count: int = 0
    sealed: bool = False

    def __post_init__(self) -> None:
        if not 1 <= self.slot_count <= UINT32_MAX or not 1 <= self.max_items < UINT32_MAX:
            raise ValidationError(
                f"index slot count {self.slot_count} and max items {self.max_items} must be in 1..{UINT32_MAX - 1}"
            )

    @property
    def file_size(self) -> int:
        return unsealed_file_size(self.slot_count, self.max_items)

    def encode(self) -> bytes:
        body = _UNSEALED_HEADER.pack(
            UNSEALED_MAGIC,
            FORMAT_VERSION,
            FLAG_SEALED if self.sealed else 0,
            self.file_id,
            self.created_at,
            self.base_timestamp,
            self.begin_timestamp,
            self.end_timestamp,
            self.slot_count,
            self.max_items,
            self.item_count,
        )
        return body + _CRC.pack(_crc(body))

    @classmethod
    def decode(cls, buf: ReadableBuffer, *, location: str | None = None) -> UnsealedHeader:
        if len(buf) < HEADER_SIZE:
            raise CorruptRecordError(f"index header truncated to {len(buf)} bytes", location=location, offset=0)
        fields = _UNSEALED_HEADER.unpack_from(buf, 0)
        (crc,) = _CRC.unpack_from(buf, _UNSEALED_HEADER.size)
        magic, version, flags = fields[0], fields[1], fields[2]
        if magic != UNSEALED_MAGIC:
            raise CorruptRecordError(f"not an unsealed index file: magic 0x{magic:08x}", location=location, offset=0)
        if crc != _crc(memoryview(buf)[: _UNSEALED_HEADER.size]):
            raise CorruptRecordError("index header CRC mismatch", location=location, offset=0)
        if version != FORMAT_VERSION:
            raise IntegrityError(f"index file version {version} is not supported (this build knows {FORMAT_VERSION})")
        header = cls(
            file_id=fields[3],
            created_at=fields[4],
            base_timestamp=fields[5],
            begin_timestamp=fields[6],
            end_timestamp=fields[7],
            slot_count=fields[8],
            max_items=fields[9],
            item_count=fields[10],
            sealed=bool(flags & FLAG_SEALED),
        )
        if header.item_count > header.max_items:
            raise CorruptRecordError(
                f"index header counts {header.item_count} items, above its capacity {header.max_items}",
                location=location,
                offset=0,
            )
        return header


def unsealed_file_size(slot_count: int, max_items: int) -> int:
    return HEADER_SIZE + slot_count * UNSEALED_SLOT_SIZE + max_items * UNSEALED_ITEM_SIZE


def unsealed_slot_position(slot: int) -> int:
    return HEADER_SIZE + slot * UNSEALED_SLOT_SIZE


def unsealed_item_position(slot_count: int, number: int) -> int:
    return HEADER_SIZE + slot_count * UNSEALED_SLOT_SIZE + (number - 1) * UNSEALED_ITEM_SIZE


def encode_unsealed_item(item: IndexItem, base_timestamp: int, previous: int) -> bytes:
    """The 36 bytes of an item; ValidationError when a field does not fit its width."""
    time_diff = item.timestamp - base_timestamp
    if not INT32_MIN <= time_diff <= INT32_MAX:
        raise ValidationError(f"timestamp {item.timestamp} is too far from the file's base {base_timestamp}")
    try:
        body = _UNSEALED_ITEM.pack(
            item.topic_id, item.queue_id, item.queue_offset, item.size, item.key_hash, time_diff, previous
        )
    except struct.error as exc:
        raise ValidationError(f"index item {item} does not fit the layout: {exc}") from exc
    return body + _CRC.pack(_crc(body))


def decode_unsealed_item(
    buf: ReadableBuffer, pos: int, base_timestamp: int, *, location: str | None = None
) -> tuple[IndexItem, int]:
    """(item, previous item number) of the item at ``pos``; CorruptRecordError on a CRC mismatch."""
    if len(buf) - pos < UNSEALED_ITEM_SIZE:
        raise CorruptRecordError("index item truncated", location=location, offset=pos)
    fields = _UNSEALED_ITEM.unpack_from(buf, pos)
    (crc,) = _CRC.unpack_from(buf, pos + _UNSEALED_ITEM.size)
    if crc != _crc(memoryview(buf)[pos : pos + _UNSEALED_ITEM.size]):
        raise CorruptRecordError("index item CRC mismatch", location=location, offset=pos)
    topic_id, queue_id, queue_offset, size, hash_value, time_diff, previous = fields
    if hash_value < 0:
        raise CorruptRecordError(f"index item with negative key hash {hash_value}", location=location, offset=pos)
    return IndexItem(topic_id, queue_id, queue_offset, size, hash_value, base_timestamp + time_diff), previous


def walk_unsealed_chain(
    buf: ReadableBuffer,
    header: UnsealedHeader,
    first: int,
    item_count: int,
    hash_value: int,
    *,
    location: str | None = None,
) -> Iterator[IndexItem]:
    """Items of the chain starting at item ``first`` whose hash is ``hash_value``, newest first.

    Each step must go to a strictly smaller item number, so a corrupt link ends in an error, never a loop.
    """
    slot = slot_of(hash_value, header.slot_count)
    number = first
    while number:
        if number > item_count:
            raise CorruptRecordError(
                f"index chain points to item {number}, past the {item_count} written", location=location
            )
        pos = unsealed_item_position(header.slot_count, number)
        item, previous = decode_unsealed_item(buf, pos, header.base_timestamp, location=location)
        if slot_of(item.key_hash, header.slot_count) != slot:
            raise CorruptRecordError(
                f"index item {number} is chained into the wrong slot", location=location, offset=pos
            )
        if previous >= number:
            raise CorruptRecordError(f"index item {number} links forward to {previous}", location=location, offset=pos)
        if item.key_hash == hash_value:
            yield item
        number = previous


# ---- compacted layout --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CompactedHeader:
    """The header of a compacted index file; ``from_catalogue`` rebuilds it without reading the file."""

    file_id: int
    begin_timestamp: int
    end_timestamp: int
    slot_count: int
    item_count: int

    @property
    def file_size(self) -> int:
        return compacted_file_size(self.slot_count, self.item_count)

    @classmethod
    def from_catalogue(
        cls, file_id: int, *, begin_timestamp: int, end_timestamp: int, item_count: int, size: int
    ) -> CompactedHeader:
        """The header implied by a catalogued file's size, item count and time interval."""
        slots_bytes = size - HEADER_SIZE - item_count * COMPACTED_ITEM_SIZE
        if slots_bytes < COMPACTED_SLOT_SIZE or slots_bytes % COMPACTED_SLOT_SIZE:
            raise IntegrityError(f"index file {file_id}: size {size} with {item_count} items is not a compacted layout")
        return cls(file_id, begin_timestamp, end_timestamp, slots_bytes // COMPACTED_SLOT_SIZE, item_count)

    def encode(self) -> bytes:
        body = _COMPACTED_HEADER.pack(
            COMPACTED_MAGIC,
            FORMAT_VERSION,
            FLAG_SEALED,
            self.file_id,
            self.begin_timestamp,
            self.end_timestamp,
            self.slot_count,
            self.item_count,
        )
        head = body + _CRC.pack(_crc(body))
        return head + bytes(HEADER_SIZE - len(head))

    @classmethod
    def decode(cls, buf: ReadableBuffer, *, location: str | None = None) -> CompactedHeader:
        if len(buf) < HEADER_SIZE:
            raise CorruptRecordError(f"index header truncated to {len(buf)} bytes", location=location, offset=0)
        fields = _COMPACTED_HEADER.unpack_from(buf, 0)
        (crc,) = _CRC.unpack_from(buf, _COMPACTED_HEADER.size)
        if fields[0] != COMPACTED_MAGIC:
            raise CorruptRecordError(
                f"not a compacted index file: magic 0x{fields[0]:08x}", location=location, offset=0
            )
        if crc != _crc(memoryview(buf)[: _COMPACTED_HEADER.size]):
            raise CorruptRecordError("index header CRC mismatch", location=location, offset=0)
        if fields[1] != FORMAT_VERSION:
            raise IntegrityError(f"index file version {fields[1]} is not supported (this build knows {FORMAT_VERSION})")
        return cls(*fields[3:8])


def compacted_file_size(slot_count: int, item_count: int) -> int:
    return HEADER_SIZE + slot_count * COMPACTED_SLOT_SIZE + item_count * COMPACTED_ITEM_SIZE


def compacted_slot_position(slot: int) -> int:
    return HEADER_SIZE + slot * COMPACTED_SLOT_SIZE


def compacted_item_position(slot_count: int, index: int) -> int:
    return HEADER_SIZE + slot_count * COMPACTED_SLOT_SIZE + index * COMPACTED_ITEM_SIZE


@dataclass(frozen=True, slots=True)
class SlotRange:
    """Where one slot's items are in a compacted file: ``length`` items from item index ``position``."""

    position: int
    length: int


def decode_compacted_slot(
    buf: ReadableBuffer, header_or_item_count: CompactedHeader | int, *, location: str | None = None
) -> SlotRange:
    """The slot entry in ``buf`` (exactly its 8 bytes), checked against the file's item count."""
    item_count = (
        header_or_item_count.item_count if isinstance(header_or_item_count, CompactedHeader) else header_or_item_count
    )
    if len(buf) != COMPACTED_SLOT_SIZE:
        raise CorruptRecordError(
            f"index slot read returned {len(buf)} of {COMPACTED_SLOT_SIZE} bytes", location=location
        )
    position, length = _COMPACTED_SLOT.unpack_from(buf, 0)
    if position + length > item_count:
        raise CorruptRecordError(
            f"index slot points to items {position}..{position + length}, past the {item_count} in the file",
            location=location,
        )
    return SlotRange(position, length)


def encode_compacted_item(item: IndexItem, begin_timestamp: int) -> bytes:
    time_diff = item.timestamp - begin_timestamp
    if not 0 <= time_diff <= UINT32_MAX:
        raise ValidationError(f"timestamp {item.timestamp} is outside the file's interval from {begin_timestamp}")
    body = _COMPACTED_ITEM.pack(item.topic_id, item.queue_id, item.queue_offset, item.size, item.key_hash, time_diff)
    return body + _CRC.pack(_crc(body))


def decode_compacted_items(
    buf: ReadableBuffer,
    slot_range: SlotRange,
    slot: int,
    slot_count: int,
    begin_timestamp: int,
    *,
    location: str | None = None,
) -> list[IndexItem]:
    """The items of one slot from exactly their bytes; each must pass its CRC and belong to ``slot``."""
    if len(buf) != slot_range.length * COMPACTED_ITEM_SIZE:
        raise CorruptRecordError(
            f"index items read returned {len(buf)} bytes, the slot holds {slot_range.length * COMPACTED_ITEM_SIZE}",
            location=location,
        )
    view = memoryview(buf)
    items = []
    for pos in range(0, len(buf), COMPACTED_ITEM_SIZE):
        (crc,) = _CRC.unpack_from(view, pos + _COMPACTED_ITEM.size)
        where = compacted_item_position(slot_count, slot_range.position) + pos
        if crc != _crc(view[pos : pos + _COMPACTED_ITEM.size]):
            raise CorruptRecordError("index item CRC mismatch", location=location, offset=where)
        topic_id, queue_id, queue_offset, size, hash_value, time_diff = _COMPACTED_ITEM.unpack_from(view, pos)
        if hash_value < 0 or slot_of(hash_value, slot_count) != slot:
            raise CorruptRecordError(f"index item does not belong to slot {slot}", location=location, offset=where)
        items.append(IndexItem(topic_id, queue_id, queue_offset, size, hash_value, begin_timestamp + time_diff))
    return items


def decode_compacted_item_run(
    buf: ReadableBuffer, begin_timestamp: int, *, location: str | None = None, position: int = 0
) -> list[IndexItem]:
    """Consecutive items of a compacted file from exactly their bytes, whatever their slots; each CRC-checked.

    For reading a file's items through (``position``: where ``buf`` starts in it, for errors); a lookup
    reads one slot's with ``decode_compacted_items`` instead.
    """
    if len(buf) % COMPACTED_ITEM_SIZE:
        raise CorruptRecordError(f"{len(buf)} bytes are not whole index items", location=location, offset=position)
    view = memoryview(buf)
    items = []
    for pos in range(0, len(buf), COMPACTED_ITEM_SIZE):
        (crc,) = _CRC.unpack_from(view, pos + _COMPACTED_ITEM.size)
        if crc != _crc(view[pos : pos + _COMPACTED_ITEM.size]):
            raise CorruptRecordError("index item CRC mismatch", location=location, offset=position + pos)
        topic_id, queue_id, queue_offset, size, hash_value, time_diff = _COMPACTED_ITEM.unpack_from(view, pos)
        items.append(IndexItem(topic_id, queue_id, queue_offset, size, hash_value, begin_timestamp + time_diff))
    return items


def compact_into(
    out: bytearray | memoryview,
    source: ReadableBuffer,
    header: UnsealedHeader,
    item_count: int,
) -> CompactedHeader:
    """Write the compacted form of the first ``item_count`` items of an unsealed file into ``out``.

    ``out`` must be ``compacted_file_size(header.slot_count, item_count)`` bytes. Two passes over the
    items: count per slot, then place each item (newest first within its slot). Every source item is
    CRC-checked, so a corrupt sealed file fails here instead of being uploaded.
    """
    slot_count = header.slot_count
    expected = compacted_file_size(slot_count, item_count)
    if len(out) != expected:
        raise ValidationError(f"compaction output is {len(out)} bytes, needs {expected}")
    items_start = unsealed_item_position(slot_count, 1)
    counts = [0] * slot_count
    for number in range(1, item_count + 1):
        item, _ = decode_unsealed_item(source, items_start + (number - 1) * UNSEALED_ITEM_SIZE, header.base_timestamp)
        counts[slot_of(item.key_hash, slot_count)] += 1
    cursor = [0] * slot_count
    position = 0
    for slot, count in enumerate(counts):
        _COMPACTED_SLOT.pack_into(out, compacted_slot_position(slot), position if count else 0, count)
        cursor[slot] = position
        position += count
    for number in range(item_count, 0, -1):
        item, _ = decode_unsealed_item(source, items_start + (number - 1) * UNSEALED_ITEM_SIZE, header.base_timestamp)
        slot = slot_of(item.key_hash, slot_count)
        pos = compacted_item_position(slot_count, cursor[slot])
        out[pos : pos + COMPACTED_ITEM_SIZE] = encode_compacted_item(item, header.begin_timestamp)
        cursor[slot] += 1
    compacted = CompactedHeader(
        file_id=header.file_id,
        begin_timestamp=header.begin_timestamp,
        end_timestamp=header.end_timestamp,
        slot_count=slot_count,
        item_count=item_count,
    )
    out[:HEADER_SIZE] = compacted.encode()
    return compacted
