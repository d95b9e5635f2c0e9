"""One key-index file of the hot store, mapped whole: its items written one record or one batch at a time,
dropped from a commit-log offset on, and looked up by key hash.

``HotKeyIndex`` (``local.index_file``) keeps the list of these files; the byte layout is RocketMQ's
(``formats.index_file``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from tieredstore.formats.index_file import (
    HEADER_SIZE,
    INT32_MAX,
    ITEM,
    ITEM_DTYPE,
    ITEM_SIZE,
    SLOT,
    SLOT_DTYPE,
    SLOT_SIZE,
    RocketMQIndexFile,
    index_file_size,
    item_position,
    pack_header,
    pack_slot,
    read_item,
    read_slot,
    slot_of,
    time_diff_seconds,
)
from tieredstore.formats.records import Int64Array
from tieredstore.local.mapped_file import MappedFile, fsync_directory

# Whole seconds in the file: an item stored at ``stamp`` may be up to this many ms later.
SECOND_SLACK_MS = 999


class KeyIndexFile:
    """One index file mapped whole; a writer keeps the header fields in memory and writes them with each add."""

    def __init__(self, path: Path, mapped: MappedFile, slot_capacity: int, item_capacity: int) -> None:
        self.path = path
        self.mapped = mapped
        self.slot_capacity = slot_capacity
        self.item_capacity = item_capacity
        self.items_at = item_position(slot_capacity, 0)
        self.reader = RocketMQIndexFile(
            mapped.buffer, slot_capacity=slot_capacity, item_capacity=item_capacity, location=str(path)
        )
        header = self.reader.header
        self.begin_timestamp = header.begin_timestamp
        self.end_timestamp = header.end_timestamp
        self.begin_offset = header.begin_physical_offset
        self.end_offset = header.end_physical_offset
        self.slots_used = header.hash_slot_count
        self.index_count = header.index_count
        self.identity = file_identity(path)

    @classmethod
    def create(cls, path: Path, slot_capacity: int, item_capacity: int) -> KeyIndexFile:
        """A new empty file: disk blocks reserved for all of it, so a full disk fails here, not in a page fault."""
        mapped = MappedFile(path, 0, writable=True, create_size=index_file_size(slot_capacity, item_capacity))
        try:
            mapped.reserve(0, mapped.size)
            pack_header(mapped.buffer, 0, 0, 0, 0, 0, 1)
        except BaseException:
            mapped.delete()
            raise
        fsync_directory(path.parent)
        return cls(path, mapped, slot_capacity, item_capacity)

    @property
    def full(self) -> bool:
        return self.index_count >= self.item_capacity

    @property
    def empty(self) -> bool:
        return self.index_count <= 1

    def holds_together(self) -> bool:
        """Whether the header and slots are what a writer could have left (a torn or foreign file's are not)."""
        count = self.index_count
        if not 1 <= count <= self.item_capacity or not 0 <= self.slots_used <= min(self.slot_capacity, count - 1):
            return False
        slots = np.frombuffer(self.mapped.read(HEADER_SIZE, self.slot_capacity * SLOT_SIZE), dtype=">i4")
        if int(slots.min()) < 0 or int(slots.max()) >= count:
            return False
        if count == 1:
            return True
        first = read_item(self.mapped.buffer, self.slot_capacity, 1)
        last = read_item(self.mapped.buffer, self.slot_capacity, count - 1)
        return (
            0 < self.begin_timestamp <= self.end_timestamp
            and 0 <= self.begin_offset <= self.end_offset
            and first.physical_offset == self.begin_offset
            and last.physical_offset == self.end_offset
        )

    @property
    def room(self) -> int:
        return self.item_capacity - self.index_count

    def add_record(self, hashes: Sequence[int], physical_offset: int, store_timestamp: int) -> None:
        """Write one record's items (the file has room for them all), then publish them."""
        buffer, slot_capacity = self.mapped.buffer, self.slot_capacity
        number = self.index_count
        if number == 1:
            self.begin_offset, self.begin_timestamp = physical_offset, store_timestamp
        diff = (store_timestamp - self.begin_timestamp) // 1000
        if not 0 <= diff <= INT32_MAX:
            diff = time_diff_seconds(store_timestamp, self.begin_timestamp)
        at = self.items_at + number * ITEM_SIZE
        pending: dict[int, int] = {}
        for hash_value in hashes:
            slot = hash_value % slot_capacity
            previous = pending.get(slot)
            if previous is None:
                (previous,) = SLOT.unpack_from(buffer, HEADER_SIZE + slot * SLOT_SIZE)
                if not 0 < previous < number:
                    previous = 0
                    self.slots_used += 1
            ITEM.pack_into(buffer, at, hash_value, physical_offset, diff, previous)
            pending[slot] = number
            number += 1
            at += ITEM_SIZE
        self.index_count = number
        self.end_offset, self.end_timestamp = physical_offset, store_timestamp
        self.publish(pending)

    def add_batch(self, hashes: Int64Array, offsets: Int64Array, stamps: Int64Array) -> int:
        """Write as many of the items (key hash, commit-log offset, store timestamp) as there is room for,
        as whole arrays into the map, then publish them; returns how many were written."""
        count = min(len(hashes), self.room)
        if count <= 0:
            return 0
        hashes, offsets, stamps = hashes[:count], offsets[:count], stamps[:count]
        number = self.index_count
        if number == 1:
            self.begin_offset, self.begin_timestamp = int(offsets[0]), int(stamps[0])
        begin = self.begin_timestamp
        diffs = (stamps - begin) // 1000
        outside = (diffs < 0) | (diffs > INT32_MAX)
        if outside.any():  # as time_diff_seconds clamps them
            diffs = np.where(outside, np.clip(diffs, 0, INT32_MAX) if begin > 0 else 0, diffs)
        # Items sorted by slot, stably: each item's previous is the item before it in its slot's run, and
        # the first of a run links to what the slot held (when that is an item of this file's past).
        slots = hashes % self.slot_capacity
        order = np.argsort(slots, kind="stable")
        ordered = slots[order]
        boundary = np.empty(count + 1, dtype=np.bool_)  # between items i - 1 and i (in order): a new slot
        boundary[0] = boundary[count] = True
        np.not_equal(ordered[1:], ordered[:-1], out=boundary[1:count])
        run_starts, run_ends = boundary[:count], boundary[1:]
        buffer = self.mapped.buffer
        slot_table = np.frombuffer(buffer, dtype=SLOT_DTYPE, count=self.slot_capacity, offset=HEADER_SIZE)
        stored = slot_table[ordered[run_starts]]
        unchained = (stored <= 0) | (stored >= number)
        stored[unchained] = 0
        previous = np.empty(count, dtype=np.int64)
        previous[1:] = order[:-1] + number
        previous[run_starts] = stored
        items = np.frombuffer(buffer, dtype=ITEM_DTYPE, count=count, offset=item_position(self.slot_capacity, number))
        items["key_hash"] = hashes
        items["physical_offset"] = offsets
        items["time_diff"] = diffs
        items["previous"][order] = previous
        self.slots_used += int(np.count_nonzero(unchained))
        self.index_count = number + count
        self.end_offset, self.end_timestamp = int(offsets[-1]), int(stamps[-1])
        self.publish({})
        slot_table[ordered[run_ends]] = order[run_ends] + number
        del items, slot_table  # views of the map: it cannot be closed while they live
        return count

    def publish(self, pending: dict[int, int]) -> None:
        """The header counting the items written, then the slots that point to them."""
        buffer = self.mapped.buffer
        pack_header(
            buffer, self.begin_timestamp, self.end_timestamp, self.begin_offset, self.end_offset, self.slots_used,
            self.index_count,
        )  # fmt: skip
        pack = SLOT.pack_into
        for slot, number in pending.items():
            pack(buffer, HEADER_SIZE + slot * SLOT_SIZE, number)
        pending.clear()

    def drop_items_from(self, physical_offset: int) -> int:
        """Forget the items of records at or past ``physical_offset`` (the newest ones); returns how many."""
        buffer, slots = self.mapped.buffer, self.slot_capacity
        low, high = 1, self.index_count  # the first item at or past the offset is in [low, high]
        while low < high:
            middle = (low + high) // 2
            if read_item(buffer, slots, middle).physical_offset < physical_offset:
                low = middle + 1
            else:
                high = middle
        dropped = self.index_count - low
        if not dropped:
            return 0
        for number in range(self.index_count - 1, low - 1, -1):
            item = read_item(buffer, slots, number)
            slot = slot_of(item.key_hash, slots)
            if read_slot(buffer, slot) == number:
                pack_slot(buffer, slot, item.previous if 0 < item.previous < number else 0)
                if not 0 < item.previous < number:
                    self.slots_used -= 1
        start = item_position(slots, low)
        end = item_position(slots, self.index_count)
        buffer[start:end] = bytes(end - start)
        self.index_count = low
        if low == 1:
            self.begin_timestamp = self.end_timestamp = self.begin_offset = self.end_offset = 0
            self.slots_used = 0
        else:
            last = read_item(buffer, slots, low - 1)
            self.end_offset = last.physical_offset
            # Whole seconds are all the item keeps: the end is bounded from above.
            self.end_timestamp = self.begin_timestamp + last.time_diff_seconds * 1000 + SECOND_SLACK_MS
        self.publish({})
        return dropped

    def close(self) -> None:
        self.mapped.close()

    def delete(self) -> None:
        self.mapped.delete()


def file_identity(path: Path) -> tuple[int, int]:
    """(device, inode) of the file now at ``path``, (0, 0) if none: tells a replaced file from the one mapped."""
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return (0, 0)
    return (stat.st_dev, stat.st_ino)


def file_lookup(file: KeyIndexFile, hash_value: int, begin_timestamp: int, end_timestamp: int) -> Iterator[int]:
    """Commit-log offsets of the items of ``file`` with ``hash_value`` in the time range, newest first."""
    header = file.reader.header
    if header.index_count <= 1 or header.begin_timestamp > end_timestamp or header.end_timestamp < begin_timestamp:
        return
    for _, item in file.reader.chain(hash_value):
        stamp = header.begin_timestamp + item.time_diff_seconds * 1000
        if stamp + SECOND_SLACK_MS < begin_timestamp:
            return  # a chain runs newest to oldest
        if item.key_hash == hash_value and stamp <= end_timestamp:
            yield item.physical_offset
