"""Local key-index files: the unsealed hash table written in place, its compaction, and lookups.

An unsealed file is a preallocated (sparse) file mapped into memory. ``put`` writes an item into the
map and remembers its slot in memory; ``flush`` makes the items durable, then writes the slots that
point to them, then the header with the item count. The slots on disk therefore only ever point to
durable items, and the header's count is a checkpoint: reopening after a crash trusts the items up to
it and scans only the tail past it, keeping the items whose CRC and chain link are intact and zeroing
the rest, so a torn tail is dropped instead of served.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterable
from pathlib import Path

from tieredstore.errors import CorruptRecordError, IntegrityError, ValidationError
from tieredstore.formats.index_file import slot_of
from tieredstore.index.format import (
    COMPACTED_ITEM_SIZE,
    COMPACTED_SLOT_SIZE,
    HEADER_SIZE,
    INT32_MAX,
    INT32_MIN,
    UNSEALED_ITEM_SIZE,
    UNSEALED_SLOT_SIZE,
    CompactedHeader,
    IndexItem,
    UnsealedHeader,
    compact_into,
    compacted_file_size,
    compacted_item_position,
    compacted_slot_position,
    decode_compacted_items,
    decode_compacted_slot,
    decode_unsealed_item,
    encode_unsealed_item,
    unsealed_item_position,
    unsealed_slot_position,
    walk_unsealed_chain,
)
from tieredstore.providers.base import FileSegment

_ZERO_ITEM = bytes(UNSEALED_ITEM_SIZE)


def fsync_directory(path: Path) -> None:
    """Make a create, rename or unlink in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def select_items(
    items: Iterable[IndexItem], topic_id: int, begin_timestamp: int, end_timestamp: int
) -> list[IndexItem]:
    """The items of ``topic_id`` stored within [begin_timestamp, end_timestamp]."""
    return [item for item in items if item.topic_id == topic_id and begin_timestamp <= item.timestamp <= end_timestamp]


class UnsealedIndexFile:
    """One local index file in the unsealed layout: written while UNSEALED, read-only once SEALED."""

    def __init__(self, path: Path, fd: int, mapped: mmap.mmap, header: UnsealedHeader, *, writable: bool) -> None:
        self.path = path
        self._fd = fd
        self._map = mapped
        self._static = header
        self._writable = writable
        self._item_count = header.item_count
        self._flushed_count = header.item_count
        self._begin_timestamp = header.begin_timestamp
        self._end_timestamp = header.end_timestamp
        self._sealed = header.sealed
        self._dirty_slots: dict[int, int] = {}

    # ---- life cycle ---------------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        path: Path,
        *,
        file_id: int,
        created_at: int,
        base_timestamp: int,
        slot_count: int,
        max_items: int,
    ) -> UnsealedIndexFile:
        """A new empty file (it must not exist); durable, with its directory entry, before it returns.

        It is sized and given its header under ``<name>.tmp``, then renamed: a crash in between leaves
        no file by the final name (the service forgets a record whose file never appeared, and removes
        ``*.tmp`` files at start), never an all-zero file that no restart could open.
        """
        header = UnsealedHeader(
            file_id=file_id,
            created_at=created_at,
            base_timestamp=base_timestamp,
            slot_count=slot_count,
            max_items=max_items,
        )
        if path.exists():
            raise FileExistsError(f"index file {path} already exists")
        temp_path = path.with_name(path.name + ".tmp")
        fd = os.open(temp_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        mapped: mmap.mmap | None = None
        try:
            os.ftruncate(fd, header.file_size)
            mapped = mmap.mmap(fd, header.file_size)
            mapped[:HEADER_SIZE] = header.encode()
            mapped.flush()
            os.replace(temp_path, path)
        except BaseException:
            if mapped is not None:
                mapped.close()
            os.close(fd)
            temp_path.unlink(missing_ok=True)
            raise
        fsync_directory(path.parent)
        return cls(path, fd, mapped, header, writable=True)

    @classmethod
    def open(cls, path: Path, *, writable: bool = True) -> UnsealedIndexFile:
        """Open an existing file; a writable open of an unsealed file recovers its tail first."""
        fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            if size < HEADER_SIZE:
                raise CorruptRecordError(f"index file is {size} bytes, shorter than its header", location=str(path))
            mapped = mmap.mmap(fd, size, access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ)
            try:
                header = UnsealedHeader.decode(mapped, location=str(path))
                if size != header.file_size:
                    raise CorruptRecordError(
                        f"index file is {size} bytes, its header says {header.file_size}", location=str(path)
                    )
            except BaseException:
                mapped.close()
                raise
        except BaseException:
            os.close(fd)
            raise
        index_file = cls(path, fd, mapped, header, writable=writable and not header.sealed)
        if index_file._writable:
            index_file._recover_tail()
        return index_file

    def close(self) -> None:
        if self._map.closed:
            return
        self._map.close()
        os.close(self._fd)

    def __enter__(self) -> UnsealedIndexFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- state --------------------------------------------------------------------------------------

    @property
    def file_id(self) -> int:
        return self._static.file_id

    @property
    def created_at(self) -> int:
        return self._static.created_at

    @property
    def base_timestamp(self) -> int:
        return self._static.base_timestamp

    @property
    def slot_count(self) -> int:
        return self._static.slot_count

    @property
    def max_items(self) -> int:
        return self._static.max_items

    @property
    def item_count(self) -> int:
        return self._item_count

    @property
    def begin_timestamp(self) -> int:
        return self._begin_timestamp

    @property
    def end_timestamp(self) -> int:
        return self._end_timestamp

    @property
    def is_sealed(self) -> bool:
        return self._sealed

    @property
    def is_full(self) -> bool:
        return self._item_count >= self._static.max_items

    def header(self) -> UnsealedHeader:
        """The header as it stands in memory (the one on disk is written by ``flush``)."""
        return UnsealedHeader(
            file_id=self._static.file_id,
            created_at=self._static.created_at,
            base_timestamp=self._static.base_timestamp,
            slot_count=self._static.slot_count,
            max_items=self._static.max_items,
            begin_timestamp=self._begin_timestamp,
            end_timestamp=self._end_timestamp,
            item_count=self._item_count,
            sealed=self._sealed,
        )

    # ---- writes -------------------------------------------------------------------------------------

    def put(self, item: IndexItem) -> bool:
        """Add ``item``; False when the file is full (or sealed, or the timestamp is out of its reach).

        The item is visible to ``lookup`` at once and durable after the next ``flush``.
        """
        if not self._writable or self._sealed or self.is_full:
            return False
        if not INT32_MIN <= item.timestamp - self._static.base_timestamp <= INT32_MAX:
            return False
        if item.key_hash < 0:
            raise ValidationError(f"index key hash {item.key_hash} is negative")
        slot = slot_of(item.key_hash, self._static.slot_count)
        number = self._item_count + 1
        encoded = encode_unsealed_item(item, self._static.base_timestamp, self._slot_head(slot))
        pos = unsealed_item_position(self._static.slot_count, number)
        self._map[pos : pos + UNSEALED_ITEM_SIZE] = encoded
        self._dirty_slots[slot] = number
        self._item_count = number
        self._note_timestamp(item.timestamp)
        return True

    def flush(self) -> None:
        """Make every put durable: items first, then the slots pointing at them, then the header."""
        if not self._writable:
            return
        if self._item_count == self._flushed_count and not self._dirty_slots:
            return
        self._map.flush()
        for slot, number in self._dirty_slots.items():
            pos = unsealed_slot_position(slot)
            self._map[pos : pos + UNSEALED_SLOT_SIZE] = number.to_bytes(UNSEALED_SLOT_SIZE, "big")
        self._map.flush()
        self._dirty_slots.clear()
        self._map[:HEADER_SIZE] = self.header().encode()
        self._map.flush()
        self._flushed_count = self._item_count

    def seal(self) -> None:
        """Flush and mark the file sealed; it accepts no more puts."""
        if self._sealed or not self._writable:
            self._sealed = True
            return
        self.flush()
        self._sealed = True
        self._map[:HEADER_SIZE] = self.header().encode()
        self._map.flush()
        self._writable = False

    # ---- reads --------------------------------------------------------------------------------------

    def lookup(self, hash_value: int) -> list[IndexItem]:
        """Every item with ``hash_value``, newest first; a corrupt chain is a CorruptRecordError."""
        slot = slot_of(hash_value, self._static.slot_count)
        return list(
            walk_unsealed_chain(
                self._map, self._static, self._slot_head(slot), self._item_count, hash_value, location=str(self.path)
            )
        )

    def items(self) -> list[IndexItem]:
        """Every item in write order (small files and tests; compaction streams instead)."""
        return [
            decode_unsealed_item(
                self._map, unsealed_item_position(self.slot_count, n), self.base_timestamp, location=str(self.path)
            )[0]
            for n in range(1, self._item_count + 1)
        ]

    # ---- internals ----------------------------------------------------------------------------------

    def _slot_head(self, slot: int) -> int:
        dirty = self._dirty_slots.get(slot)
        if dirty is not None:
            return dirty
        pos = unsealed_slot_position(slot)
        return int.from_bytes(self._map[pos : pos + UNSEALED_SLOT_SIZE], "big")

    def _note_timestamp(self, timestamp: int) -> None:
        if self._item_count == 1:
            self._begin_timestamp = self._end_timestamp = timestamp
        else:
            self._begin_timestamp = min(self._begin_timestamp, timestamp)
            self._end_timestamp = max(self._end_timestamp, timestamp)

    def _recover_tail(self) -> None:
        """Keep the unflushed items that are intact and correctly linked; zero everything after them."""
        slot_count = self._static.slot_count
        for number in range(self._flushed_count + 1, self._static.max_items + 1):
            pos = unsealed_item_position(slot_count, number)
            try:
                item, previous = decode_unsealed_item(self._map, pos, self._static.base_timestamp)
            except CorruptRecordError:
                break
            slot = slot_of(item.key_hash, slot_count)
            if previous != self._slot_head(slot):
                break
            self._dirty_slots[slot] = number
            self._item_count = number
            self._note_timestamp(item.timestamp)
        tail = self._item_count + 1
        while tail <= self._static.max_items:
            pos = unsealed_item_position(slot_count, tail)
            if self._map[pos : pos + UNSEALED_ITEM_SIZE] == _ZERO_ITEM:
                break
            self._map[pos : pos + UNSEALED_ITEM_SIZE] = _ZERO_ITEM
            tail += 1
        self._map.flush()
        self._flushed_count = -1  # force the header rewrite even when nothing was recovered
        self.flush()


# ---- compaction ---------------------------------------------------------------------------------------


def compact_file(sealed_path: Path, compacted_path: Path) -> CompactedHeader:
    """Write the compacted form of a sealed file to ``compacted_path`` atomically (temp file, then rename).

    A crash leaves at most a ``.tmp`` file beside it, which the next attempt overwrites.
    """
    temp_path = compacted_path.with_name(compacted_path.name + ".tmp")
    with UnsealedIndexFile.open(sealed_path, writable=False) as sealed:
        if not sealed.is_sealed:
            raise ValidationError(f"{sealed_path} is not sealed; only sealed index files are compacted")
        header = sealed.header()
        size = compacted_file_size(header.slot_count, header.item_count)
        fd = os.open(temp_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, size)
            with mmap.mmap(fd, size) as out:
                view = memoryview(out)
                try:
                    compacted = compact_into(view, sealed._map, header, header.item_count)
                finally:
                    view.release()
                out.flush()
        finally:
            os.close(fd)
    os.replace(temp_path, compacted_path)
    fsync_directory(compacted_path.parent)
    return compacted


class CompactedIndexFile:
    """A compacted index file on local disk, read through a read-only map."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with path.open("rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size < HEADER_SIZE:
                raise CorruptRecordError(f"index file is {size} bytes, shorter than its header", location=str(path))
            self._map = mmap.mmap(handle.fileno(), size, access=mmap.ACCESS_READ)
        try:
            self.header = CompactedHeader.decode(self._map, location=str(path))
            if size != self.header.file_size:
                raise CorruptRecordError(
                    f"compacted index file is {size} bytes, its header says {self.header.file_size}",
                    location=str(path),
                )
        except BaseException:
            self._map.close()
            raise

    def lookup(self, hash_value: int) -> list[IndexItem]:
        header = self.header
        slot = slot_of(hash_value, header.slot_count)
        pos = compacted_slot_position(slot)
        slot_range = decode_compacted_slot(self._map[pos : pos + COMPACTED_SLOT_SIZE], header, location=str(self.path))
        start = compacted_item_position(header.slot_count, slot_range.position)
        raw = self._map[start : start + slot_range.length * COMPACTED_ITEM_SIZE]
        items = decode_compacted_items(
            raw, slot_range, slot, header.slot_count, header.begin_timestamp, location=str(self.path)
        )
        return [item for item in items if item.key_hash == hash_value]

    def close(self) -> None:
        self._map.close()

    def __enter__(self) -> CompactedIndexFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def lookup_segment(segment: FileSegment, header: CompactedHeader, hash_value: int) -> list[IndexItem]:
    """Items with ``hash_value`` in an uploaded compacted file: the slot's 8 bytes, then its items.

    ``header`` comes from the catalogue, so the lookup costs exactly two ranged reads (one when
    the slot is empty). A short read (the segment is smaller than the catalogue says) is an IntegrityError.
    """
    location = segment.key
    slot = slot_of(hash_value, header.slot_count)
    raw_slot = await segment.read(compacted_slot_position(slot), COMPACTED_SLOT_SIZE)
    if len(raw_slot) != COMPACTED_SLOT_SIZE:
        raise IntegrityError(f"index segment {location} ends before slot {slot}: it is shorter than catalogued")
    slot_range = decode_compacted_slot(raw_slot, header, location=location)
    if slot_range.length == 0:
        return []
    raw_items = await segment.read(
        compacted_item_position(header.slot_count, slot_range.position), slot_range.length * COMPACTED_ITEM_SIZE
    )
    items = decode_compacted_items(
        raw_items, slot_range, slot, header.slot_count, header.begin_timestamp, location=location
    )
    return [item for item in items if item.key_hash == hash_value]
