"""RocketMQ's local IndexFile layout and the key hash every key index uses; pure, no I/O.

A RocketMQ store writes ``<store>/index/<yyyyMMddHHmmssSSS>`` files as it puts messages. Every integer
is big-endian::

    header (40)   begin timestamp i64, end timestamp i64, begin physical offset i64,
                  end physical offset i64, used hash-slot count i32, index count i32
    slots         slot capacity x i32: number of the newest item whose key hash falls in the slot
    items         item capacity x 20: key hash i32, physical offset i64, time diff i32 (seconds since
                  the begin timestamp), previous item number i32

Item numbers start at 1 (item 0 is never written, so a file takes ``item capacity - 1`` items) and 0
means "none" (an empty slot, the end of a chain). The index count is the number the next item gets.
A key is indexed as ``topic#key``: each of its KEYS (space separated) and its UNIQ_KEY. The slot and
item capacities are broker settings, not in the file: a reader is told them.
"""

from __future__ import annotations

import datetime
import functools
import mmap
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tieredstore.errors import CorruptRecordError, IntegrityError, ValidationError
from tieredstore.formats.message import java_string_hash

HEADER_SIZE = 40
SLOT_SIZE = 4
ITEM_SIZE = 20
ROCKETMQ_DEFAULT_SLOTS = 5_000_000
ROCKETMQ_DEFAULT_ITEMS = 20_000_000

INT32_MAX = (1 << 31) - 1
_UINT32 = (1 << 32) - 1
_HEADER = struct.Struct(">qqqqii")
SLOT = struct.Struct(">i")
ITEM = struct.Struct(">iqii")
"""A slot and an item, for a writer that packs many in a loop (``pack_slot``, ``pack_item`` do one)."""
ITEM_DTYPE = np.dtype([("key_hash", ">i4"), ("physical_offset", ">i8"), ("time_diff", ">i4"), ("previous", ">i4")])
"""An item as a numpy record (20 bytes, packed), for a writer that fills a run of items at once."""
SLOT_DTYPE = np.dtype(">i4")
_NAME_FORMAT = "%Y%m%d%H%M%S"
NAME_LENGTH = 17

ReadableBuffer = bytes | bytearray | memoryview | mmap.mmap
"""Anything the decoders read from: file bytes, a mapped file, or a view of either."""


def index_key(topic: str, key: str) -> str:
    """The string a key is indexed by: ``topic#key``, as RocketMQ builds it."""
    return f"{topic}#{key}"


def positive_hash(text: str) -> int:
    """``abs(text.hashCode())`` with RocketMQ's clamp: abs(Integer.MIN_VALUE) stays negative, so it is 0."""
    value = abs(java_string_hash(text))
    return 0 if value > INT32_MAX else value


def key_hash(topic: str, key: str) -> int:
    """The non-negative hash an index stores for ``key`` of ``topic``: ``positive_hash(index_key(topic, key))``."""
    return record_key_hashes(topic, (key,))[0]


def record_key_hashes(topic: str, keys: Sequence[str]) -> list[int]:
    """``key_hash(topic, key)`` of each of one record's keys (what a single put indexes).

    Java's hash is a polynomial, so ``topic#``'s part is computed once per topic and an ASCII key (one
    UTF-16 unit per byte) continues it byte by byte.
    """
    prefix = _prefix_hash(topic)
    hashes = []
    for key in keys:
        if not key.isascii():
            hashes.append(positive_hash(index_key(topic, key)))
            continue
        value = prefix
        for code in key.encode("ascii"):
            value = value * 31 + code
        value &= _UINT32
        value = (1 << 32) - value if value & 0x80000000 else value
        hashes.append(0 if value > INT32_MAX else value)
    return hashes


@functools.lru_cache(maxsize=4096)
def _prefix_hash(topic: str) -> int:
    return java_string_hash(f"{topic}#") & _UINT32


def key_hashes(topics: str | Sequence[str], keys: Sequence[str]) -> npt.NDArray[np.int64]:
    """``key_hash(topics[i], keys[i])`` for every i (or of the one topic ``topics`` names), for the whole
    batch at once.

    Java's hash of ``topic#key`` is ``prefix * 31**n + sum(unit[j] * 31**(n-1-j))`` mod 2**32 over the
    key's n UTF-16 code units. 31 is odd, so it has an inverse mod 2**32: weighing every unit of the
    joined keys by ``31**-position`` makes each key's sum one difference of a running total, which
    ``31**(end-1)`` scales to the key's own powers. uint32 wrap-around is the modulus.
    """
    joined = "".join(keys)
    lengths = list(map(len, keys))
    if joined.isascii():
        units: npt.NDArray[np.unsignedinteger] = np.frombuffer(joined.encode("ascii"), dtype=np.uint8)
    else:
        units = np.frombuffer(joined.encode("utf-16-be", "surrogatepass"), dtype=">u2")
        if len(units) != len(joined):  # characters past the BMP take two code units
            lengths = [len(key.encode("utf-16-be", "surrogatepass")) // 2 for key in keys]
    counts = np.array(lengths, dtype=np.int64)
    ends = np.cumsum(counts)
    powers, inverses = _powers_of_31(len(units) + 1)
    running = np.zeros(len(units) + 1, dtype=np.uint32)
    np.cumsum(units * inverses[: len(units)], dtype=np.uint32, out=running[1:])
    starts = ends - counts
    prefixes = np.array(
        _prefix_hash(topics) if isinstance(topics, str) else [_prefix_hash(topic) for topic in topics], dtype=np.uint32
    )
    combined = powers[ends - 1] * (running[ends] - running[starts]) + powers[counts] * prefixes
    hashes: npt.NDArray[np.int64] = np.abs(combined.view(np.int32).astype(np.int64))
    hashes[hashes > INT32_MAX] = 0  # abs(Integer.MIN_VALUE), which RocketMQ clamps to 0
    return hashes


# 31 * _INVERSE_OF_31 == 1 mod 2**32
_INVERSE_OF_31 = pow(31, -1, 1 << 32)


@functools.lru_cache(maxsize=8)
def _powers_of_31(needed: int) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.uint32]]:
    """31**i and 31**-i mod 2**32 for i below ``needed`` rounded up to a power of two (so few sizes are cached)."""
    size = 1 << max(needed - 1, 1).bit_length()
    tables = []
    for base in (31, _INVERSE_OF_31):
        table = np.empty(size, dtype=np.uint32)
        table[0] = 1
        np.cumprod(np.full(size - 1, base, dtype=np.uint32), dtype=np.uint32, out=table[1:])
        table.flags.writeable = False
        tables.append(table)
    return tables[0], tables[1]


def slot_of(hash_value: int, slot_count: int) -> int:
    return hash_value % slot_count


def index_file_size(slot_capacity: int, item_capacity: int) -> int:
    return HEADER_SIZE + slot_capacity * SLOT_SIZE + item_capacity * ITEM_SIZE


def slot_position(slot: int) -> int:
    return HEADER_SIZE + slot * SLOT_SIZE


def item_position(slot_capacity: int, number: int) -> int:
    return HEADER_SIZE + slot_capacity * SLOT_SIZE + number * ITEM_SIZE


def time_diff_seconds(store_timestamp: int, begin_timestamp: int) -> int:
    """Whole seconds from the file's begin timestamp, clamped to 0..INT32_MAX as RocketMQ does."""
    if begin_timestamp <= 0:
        return 0
    return min(max((store_timestamp - begin_timestamp) // 1000, 0), INT32_MAX)


def index_file_name(timestamp_ms: int) -> str:
    """``yyyyMMddHHmmssSSS`` of a creation time (UTC), the name RocketMQ gives an index file."""
    moment = datetime.datetime.fromtimestamp(timestamp_ms / 1000, tz=datetime.UTC)
    return f"{moment.strftime(_NAME_FORMAT)}{timestamp_ms % 1000:03d}"


def parse_index_file_name(name: str) -> int | None:
    """The creation time (epoch ms, UTC) an index file's name says; None when it is not such a name."""
    if len(name) != NAME_LENGTH or not name.isdigit():
        return None
    try:
        moment = datetime.datetime.strptime(name[:14], _NAME_FORMAT).replace(tzinfo=datetime.UTC)
    except ValueError:
        return None
    return int(moment.timestamp()) * 1000 + int(name[14:])


@dataclass(frozen=True, slots=True)
class RocketMQIndexHeader:
    begin_timestamp: int = 0
    end_timestamp: int = 0
    begin_physical_offset: int = 0
    end_physical_offset: int = 0
    hash_slot_count: int = 0
    index_count: int = 1

    def encode(self) -> bytes:
        return _HEADER.pack(
            self.begin_timestamp,
            self.end_timestamp,
            self.begin_physical_offset,
            self.end_physical_offset,
            self.hash_slot_count,
            self.index_count,
        )

    @classmethod
    def decode(cls, buf: ReadableBuffer) -> RocketMQIndexHeader:
        return cls(*_HEADER.unpack_from(buf, 0))

    @property
    def item_count(self) -> int:
        """Items written (the index count less the never-written item 0)."""
        return max(self.index_count - 1, 0)


@dataclass(frozen=True, slots=True)
class RocketMQIndexItem:
    key_hash: int
    physical_offset: int
    time_diff_seconds: int
    previous: int


def pack_header(
    buf: bytearray | memoryview | mmap.mmap,
    begin_timestamp: int,
    end_timestamp: int,
    begin_physical_offset: int,
    end_physical_offset: int,
    hash_slot_count: int,
    index_count: int,
) -> None:
    _HEADER.pack_into(
        buf, 0, begin_timestamp, end_timestamp, begin_physical_offset, end_physical_offset, hash_slot_count,
        index_count,
    )  # fmt: skip


def read_slot(buf: ReadableBuffer, slot: int) -> int:
    (value,) = SLOT.unpack_from(buf, HEADER_SIZE + slot * SLOT_SIZE)
    return int(value)


def pack_slot(buf: bytearray | memoryview | mmap.mmap, slot: int, number: int) -> None:
    SLOT.pack_into(buf, HEADER_SIZE + slot * SLOT_SIZE, number)


def pack_item(
    buf: bytearray | memoryview | mmap.mmap,
    slot_capacity: int,
    number: int,
    hash_value: int,
    physical_offset: int,
    time_diff: int,
    previous: int,
) -> None:
    ITEM.pack_into(buf, item_position(slot_capacity, number), hash_value, physical_offset, time_diff, previous)


def read_item(buf: ReadableBuffer, slot_capacity: int, number: int) -> RocketMQIndexItem:
    return RocketMQIndexItem(*ITEM.unpack_from(buf, item_position(slot_capacity, number)))


class RocketMQIndexFile:
    """Reads a RocketMQ local IndexFile from bytes or a live map; the caller names its capacities (broker config).

    The header is read at each call, so a map another process is writing is read as it stands: a
    writer that writes an item, then the header, then the slot pointing to it never shows a reader
    (who reads the slot, then the header) a chain into items it has not counted yet.
    """

    def __init__(
        self, data: ReadableBuffer, *, slot_capacity: int, item_capacity: int, location: str | None = None
    ) -> None:
        if slot_capacity < 1 or item_capacity < 1:
            raise ValidationError("a RocketMQ index file has at least one slot and one item")
        expected = index_file_size(slot_capacity, item_capacity)
        if len(data) != expected:
            raise IntegrityError(
                f"RocketMQ index file is {len(data)} bytes; {slot_capacity} slots and {item_capacity} items "
                f"make {expected}"
            )
        self._data = data
        self.slot_capacity = slot_capacity
        self.item_capacity = item_capacity
        self.location = location
        self._checked(self.header)

    @property
    def header(self) -> RocketMQIndexHeader:
        """The header as the file holds it now."""
        return RocketMQIndexHeader.decode(self._data)

    def _checked(self, header: RocketMQIndexHeader) -> RocketMQIndexHeader:
        if not 0 <= header.index_count <= self.item_capacity:
            raise CorruptRecordError(
                f"index count {header.index_count} is outside 0..{self.item_capacity}", location=self.location, offset=0
            )
        return header

    def slot(self, slot: int) -> int:
        """The newest item number in ``slot`` (0 when empty)."""
        return read_slot(self._data, slot)

    def item(self, number: int) -> RocketMQIndexItem:
        if not 1 <= number < self.item_capacity:
            raise CorruptRecordError(
                f"item number {number} is outside 1..{self.item_capacity - 1}", location=self.location
            )
        return read_item(self._data, self.slot_capacity, number)

    def chain(self, hash_value: int) -> Iterator[tuple[int, RocketMQIndexItem]]:
        """(number, item) of every item chained in ``hash_value``'s slot, newest first, whatever its hash.

        Each step must go to a strictly smaller item number, so a corrupt link ends in an error, never a loop.
        """
        number = self.slot(slot_of(hash_value, self.slot_capacity))
        header = self._checked(self.header)
        while number > 0:
            if number >= header.index_count:
                raise CorruptRecordError(
                    f"index chain points to item {number}, past the {header.index_count} written",
                    location=self.location,
                )
            item = self.item(number)
            yield number, item
            if item.previous >= number:
                raise CorruptRecordError(
                    f"index item {number} links forward to {item.previous}", location=self.location
                )
            number = item.previous

    def lookup(self, key: str, begin_timestamp: int, end_timestamp: int) -> list[int]:
        """Physical offsets of items whose hash matches ``key`` and whose time is in range, newest first."""
        hash_value = positive_hash(key)
        begin = self.header.begin_timestamp
        found = []
        for _, item in self.chain(hash_value):
            timestamp = begin + item.time_diff_seconds * 1000
            if item.key_hash == hash_value and begin_timestamp <= timestamp <= end_timestamp:
                found.append(item.physical_offset)
        return found
