"""One consume queue of the hot store: 20-byte units in files under ``consumequeue/<topic>/<queueId>/``.

As in RocketMQ, a file is named by its start in the queue's byte address space (queue offset * 20),
so with 300,000 units per file the second file is ``00000000000006000000``. Units are published by
raising ``max_offset`` after their bytes are in place, so a reader never sees a half-written unit.
A read-only queue (a broker's directory) keeps the units it had to rebuild in memory.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from tieredstore.errors import CorruptRecordError, NotFoundError
from tieredstore.formats.consume_queue import UNIT_SIZE, ConsumeQueueUnit
from tieredstore.formats.naming import hot_file_name
from tieredstore.local.batch import units_from
from tieredstore.local.durable import DurableEnd
from tieredstore.local.mapped_file import MappedFile

_UNIT = struct.Struct(">qiq")
_OFFSET_AND_SIZE = struct.Struct(">qi")
# The tail buffer when there is no writable last file: empty and read-only, so any write to it raises.
_NO_BUFFER = memoryview(b"")


def list_offset_files(directory: Path) -> list[tuple[int, Path]]:
    """(start offset, path) of every 20-digit file in ``directory``, in offset order."""
    if not directory.is_dir():
        return []
    found = [(int(p.name), p) for p in directory.iterdir() if p.is_file() and len(p.name) == 20 and p.name.isdigit()]
    return sorted(found)


class ConsumeQueue:
    """The units of one (topic, queue id), on disk and, when read-only, in memory past the files."""

    def __init__(self, topic: str, queue_id: int, directory: Path, *, file_size: int, writable: bool) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.directory = directory
        self.writable = writable
        self._new_file_size = file_size
        self._files: list[MappedFile] = []
        self._memory_units = bytearray()
        self._memory_base = 0
        self.min_offset = 0
        self.max_offset = 0
        self._flushed_offset = 0
        self.durable_end = DurableEnd()
        # The last file, for appends that need no file or reservation work: the next units go straight
        # into tail_buffer while they end at or below ready_upto (a byte offset; 0 when the next unit
        # is not in the last file, which only the slow path handles).
        self._tail_buffer: mmap.mmap | memoryview = _NO_BUFFER
        self._tail_start = 0
        self.ready_upto = 0

    @classmethod
    def load(cls, topic: str, queue_id: int, directory: Path, *, file_size: int, writable: bool) -> ConsumeQueue:
        """Map the queue's files and find its first and last written unit."""
        queue = cls(topic, queue_id, directory, file_size=file_size, writable=writable)
        for start, path in list_offset_files(directory):
            if start % UNIT_SIZE:
                raise CorruptRecordError(
                    f"consume-queue file name is not a multiple of {UNIT_SIZE}", location=str(path)
                )
            if path.stat().st_size < UNIT_SIZE:
                continue
            queue._files.append(MappedFile(path, start, writable=writable))
        if queue._files:
            queue._find_bounds()
        queue._flushed_offset = queue.max_offset
        queue._memory_base = queue.max_offset
        queue._refresh_tail()
        return queue

    def _refresh_tail(self) -> None:
        if not self._files or not self.writable:
            self._tail_buffer, self._tail_start, self.ready_upto = _NO_BUFFER, 0, 0
            return
        last = self._files[-1]
        self._tail_buffer = last.buffer
        self._tail_start = last.start_offset
        in_last = self.max_offset * UNIT_SIZE >= last.start_offset
        self.ready_upto = last.start_offset + last.allocated_upto if in_last else 0

    def _find_bounds(self) -> None:
        first = self._files[0]
        data = first.read(0, first.size - first.size % UNIT_SIZE)
        written = data.lstrip(b"\x00")
        if not written and all(self._is_empty_at(file, 0) for file in self._files[1:]):
            # No unit written yet: files are sized before their first unit goes in, and a crash may come
            # between. The queue is empty and starts at the first file's first slot, as the follower decides.
            self.min_offset = self.max_offset = first.start_offset // UNIT_SIZE
            return
        leading_zeros = len(data) - len(written)
        # A unit's size field is never zero, so the first non-zero byte lies inside the first written unit:
        # zeros before it are the slots below a restored (rebased) queue's first offset.
        self.min_offset = (first.start_offset + leading_zeros - leading_zeros % UNIT_SIZE) // UNIT_SIZE
        # The end lies in the last file holding a unit (a batch that crossed a file boundary may have sized
        # the next file and crashed before writing into it); in a restored queue's first file, at or after
        # its first unit, since the empty slots below that unit would mislead the search.
        index = len(self._files) - 1
        while index > 0 and self._is_empty_at(self._files[index], 0):
            index -= 1
        last = self._files[index]
        low, high = max(0, self.min_offset - last.start_offset // UNIT_SIZE), last.size // UNIT_SIZE
        while low < high:
            middle = (low + high) // 2
            if self._is_empty_at(last, middle * UNIT_SIZE):
                high = middle
            else:
                low = middle + 1
        self.max_offset = max(self.min_offset, last.start_offset // UNIT_SIZE + low)

    @staticmethod
    def _is_empty_at(file: MappedFile, position: int) -> bool:
        return bool(_UNIT.unpack_from(file.buffer, position)[1] == 0)

    def _locate(self, queue_offset: int) -> tuple[MappedFile, int]:
        byte_offset = queue_offset * UNIT_SIZE
        low, high = 0, len(self._files)
        while low < high:
            middle = (low + high) // 2
            if self._files[middle].start_offset <= byte_offset:
                low = middle + 1
            else:
                high = middle
        if low == 0 or byte_offset >= self._files[low - 1].end_offset:
            raise NotFoundError(f"no consume-queue file of {self.topic}/{self.queue_id} holds offset {queue_offset}")
        file = self._files[low - 1]
        return file, byte_offset - file.start_offset

    def unit_at(self, queue_offset: int) -> ConsumeQueueUnit:
        """The unit at ``queue_offset``; NotFoundError outside ``[min_offset, max_offset)``."""
        if not self.min_offset <= queue_offset < self.max_offset:
            raise NotFoundError(
                f"offset {queue_offset} of {self.topic}/{self.queue_id} is outside "
                f"[{self.min_offset}, {self.max_offset})"
            )
        return self._unit_unchecked(queue_offset)

    def _unit_unchecked(self, queue_offset: int) -> ConsumeQueueUnit:
        if queue_offset >= self._memory_base and not self.writable:
            return ConsumeQueueUnit(
                *_UNIT.unpack_from(self._memory_units, (queue_offset - self._memory_base) * UNIT_SIZE)
            )
        file, position = self._locate(queue_offset)
        try:
            return ConsumeQueueUnit(*_UNIT.unpack_from(file.buffer, position))
        except ValueError as exc:
            # The file was unmapped by retention between the bounds check and the read.
            raise NotFoundError(f"offset {queue_offset} of {self.topic}/{self.queue_id} was just deleted") from exc

    def units(self, queue_offset: int, max_count: int) -> Iterator[tuple[int, ConsumeQueueUnit]]:
        """Up to ``max_count`` (queue offset, unit) pairs from ``queue_offset`` on, stopping at max_offset."""
        end = min(self.max_offset, queue_offset + max_count)
        for offset in range(max(queue_offset, self.min_offset), end):
            yield offset, self._unit_unchecked(offset)

    def unit_bytes(self, queue_offset: int, max_count: int) -> bytes:
        """The raw units of up to ``max_count`` offsets from ``queue_offset``, stopping at max_offset: one
        slice per file instead of one unpack per unit. NotFoundError below min_offset or for a file
        retention deleted meanwhile."""
        if queue_offset < self.min_offset:
            raise NotFoundError(
                f"offset {queue_offset} of {self.topic}/{self.queue_id} is below the min offset {self.min_offset}"
            )
        end = min(self.max_offset, queue_offset + max_count)
        if end <= queue_offset:
            return b""
        in_files = min(end, self._memory_base) if not self.writable else end
        raw = units_from(self._files, queue_offset, in_files - queue_offset) if in_files > queue_offset else b""
        if len(raw) != (in_files - queue_offset) * UNIT_SIZE and in_files > queue_offset:
            raise NotFoundError(f"offset {queue_offset} of {self.topic}/{self.queue_id} was just deleted")
        if end > in_files:
            memory = self._memory_units[
                (max(queue_offset, in_files) - self._memory_base) * UNIT_SIZE : (end - self._memory_base) * UNIT_SIZE
            ]
            raw = raw + bytes(memory)
        return raw

    def commitlog_position_at(self, queue_offset: int) -> tuple[int, int]:
        """(commit-log offset, size) of a unit without building the dataclass; for binary searches."""
        if queue_offset >= self._memory_base and not self.writable:
            offset, size = _OFFSET_AND_SIZE.unpack_from(
                self._memory_units, (queue_offset - self._memory_base) * UNIT_SIZE
            )
        else:
            file, position = self._locate(queue_offset)
            offset, size = _OFFSET_AND_SIZE.unpack_from(file.buffer, position)
        return int(offset), int(size)

    def lower_bound(self, commitlog_offset: int) -> int:
        """The first queue offset whose unit lies at or after ``commitlog_offset`` (max_offset if none)."""
        low, high = self.min_offset, self.max_offset
        while low < high:
            middle = (low + high) // 2
            if self.commitlog_position_at(middle)[0] < commitlog_offset:
                low = middle + 1
            else:
                high = middle
        return low

    def append(self, unit: ConsumeQueueUnit, queue_offset: int) -> None:
        """Write the unit for ``queue_offset`` (= max_offset, or the first offset of an empty queue) and publish it."""
        if self.max_offset == self.min_offset == 0 and queue_offset > 0 and not self._files:
            self.min_offset = self.max_offset = self._memory_base = self._flushed_offset = queue_offset
        if queue_offset != self.max_offset:
            raise CorruptRecordError(
                f"queue {self.topic}/{self.queue_id} expects offset {self.max_offset} next, not {queue_offset}"
            )
        if not self.writable:
            self._memory_units += unit.encode()
            self.max_offset = queue_offset + 1
            return
        byte_offset = queue_offset * UNIT_SIZE
        if not self._files or byte_offset >= self._files[-1].end_offset:
            self._add_file(byte_offset)
        file = self._files[-1]
        if byte_offset < file.start_offset:
            # prepare() of a batch that crosses a file boundary has created the next file already.
            file, _ = self._locate(queue_offset)
        position = byte_offset - file.start_offset
        file.reserve(position, position + UNIT_SIZE)
        _UNIT.pack_into(file.buffer, position, unit.commitlog_offset, unit.size, unit.tag_hash)
        self.max_offset = queue_offset + 1
        self._refresh_tail()

    def room_for(self, count: int) -> bool:
        """Whether the next ``count`` units can be appended with no file or reservation work."""
        return (self.max_offset + count) * UNIT_SIZE <= self.ready_upto

    def append_unit(self, commitlog_offset: int, size: int, tag_hash: int) -> int:
        """Append the unit of the next queue offset and publish it; returns that offset.

        ``prepare`` (or a true ``room_for``) must have made room first; then this cannot fail.
        """
        queue_offset = self.max_offset
        if (queue_offset + 1) * UNIT_SIZE <= self.ready_upto:
            _UNIT.pack_into(
                self._tail_buffer, queue_offset * UNIT_SIZE - self._tail_start, commitlog_offset, size, tag_hash
            )
            self.max_offset = queue_offset + 1
        else:
            self.append(ConsumeQueueUnit(commitlog_offset, size, tag_hash), queue_offset)
        return queue_offset

    def append_units(self, units: list[tuple[int, int, int]]) -> None:
        """Append and publish consecutive units, each (commit-log offset, size, tag hash), as ``append_unit`` does."""
        first = self.max_offset
        end = first + len(units)
        if end * UNIT_SIZE <= self.ready_upto:
            buffer, position, pack_into = self._tail_buffer, first * UNIT_SIZE - self._tail_start, _UNIT.pack_into
            for commitlog_offset, size, tag_hash in units:
                pack_into(buffer, position, commitlog_offset, size, tag_hash)
                position += UNIT_SIZE
            self.max_offset = end
            return
        for commitlog_offset, size, tag_hash in units:
            self.append(ConsumeQueueUnit(commitlog_offset, size, tag_hash), self.max_offset)

    def append_unit_array(self, units: npt.NDArray[Any]) -> None:
        """Append and publish consecutive units given as one ``UNIT_DTYPE`` array: one copy per file they
        land in, instead of one write per unit. ``prepare(len(units))`` must have made room first."""
        first = self.max_offset
        start_byte, end_byte = first * UNIT_SIZE, (first + len(units)) * UNIT_SIZE
        landing = [file for file in self._files if file.end_offset > start_byte and file.start_offset < end_byte]
        prepared = (
            self.writable
            and bool(landing)
            and landing[-1].end_offset >= end_byte
            and all(file.start_offset + file.allocated_upto >= min(end_byte, file.end_offset) for file in landing)
        )
        if not prepared:
            self.append_units(units[["commitlog_offset", "size", "tag_hash"]].tolist())
            return
        with memoryview(units.view(np.uint8).data) as data:
            for file in landing:
                low, high = max(start_byte, file.start_offset), min(end_byte, file.end_offset)
                local = low - file.start_offset
                file.buffer[local : local + high - low] = data[low - start_byte : high - start_byte]
        self.max_offset = first + len(units)
        self._refresh_tail()

    def release_pages(self, first: int, end: int) -> None:
        """Unmap the pages of the units of queue offsets ``[first, end)`` from this process (see
        ``MappedFile.release_pages``): a restore writes millions of units and reads none of them."""
        if not self.writable:
            return
        start_byte, end_byte = first * UNIT_SIZE, end * UNIT_SIZE
        for file in self._files:
            if file.end_offset > start_byte and file.start_offset < end_byte:
                begin = max(0, start_byte - file.start_offset)
                file.release_pages(begin, min(file.size, end_byte - file.start_offset) - begin)

    def prepare(self, count: int) -> None:
        """Create and reserve disk for the next ``count`` units, so appending them cannot fail half-way."""
        if self.room_for(count):
            return
        end_byte = (self.max_offset + count) * UNIT_SIZE
        start_byte = self.max_offset * UNIT_SIZE
        try:
            while not self._files or self._files[-1].end_offset < end_byte:
                self._add_file(start_byte)
            for file in self._files:
                if file.end_offset > start_byte and file.start_offset < end_byte:
                    file.reserve(max(0, start_byte - file.start_offset), min(file.size, end_byte - file.start_offset))
        finally:
            self._refresh_tail()

    def _add_file(self, byte_offset: int) -> None:
        start = self._files[-1].end_offset if self._files else byte_offset - byte_offset % self._new_file_size
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / hot_file_name(start)
        file = MappedFile.create_or_resume(path, start, self._new_file_size)
        self._files.append(file)

    def truncate_to(self, queue_offset: int) -> int:
        """Forget every unit at or after ``queue_offset``; returns how many were dropped."""
        dropped = self.rewind_to(queue_offset)
        if dropped:
            self.clear_past_end()
        return dropped

    def rewind_to(self, queue_offset: int) -> int:
        """Make ``queue_offset`` the next offset to append, leaving the units after it in the files for now.

        A recovery rewinds, appends the units it rebuilds over the old ones (the same bytes where they
        were right), then calls ``clear_past_end``: a follower never sees a unit vanish and come back.
        Returns how many units are past the new end. A queue that is not writable forgets them at once.
        """
        queue_offset = max(queue_offset, self.min_offset)
        dropped = max(0, self.max_offset - queue_offset)
        if dropped == 0:
            return 0
        self.max_offset = queue_offset
        if not self.writable:
            if queue_offset >= self._memory_base:
                del self._memory_units[(queue_offset - self._memory_base) * UNIT_SIZE :]
            else:
                self._memory_units.clear()
                self._memory_base = queue_offset
            return dropped
        self._flushed_offset = min(self._flushed_offset, queue_offset)
        self._refresh_tail()
        return dropped

    def clear_past_end(self) -> None:
        """Zero every unit at or after ``max_offset`` and delete the files wholly past it (after ``rewind_to``)."""
        if not self.writable or not self._files:
            return
        byte_offset = self.max_offset * UNIT_SIZE
        while self._files[-1].start_offset > byte_offset and len(self._files) > 1:
            self._files.pop().delete()
        file = self._files[-1]
        file.zero_from(max(0, byte_offset - file.start_offset))
        file.flush()
        self._refresh_tail()

    def flush(self) -> None:
        """msync the units written since the last flush."""
        end = self.max_offset
        if not self.writable or end <= self._flushed_offset:
            return
        start_byte, end_byte = self._flushed_offset * UNIT_SIZE, end * UNIT_SIZE
        for file in self._files:
            if file.end_offset > start_byte and file.start_offset < end_byte:
                file.flush(max(0, start_byte - file.start_offset), end_byte - file.start_offset)
        self._flushed_offset = end

    def delete_files_below(self, commitlog_min_offset: int) -> int:
        """Delete leading files whose every unit points below ``commitlog_min_offset``; moves min_offset up."""
        deleted = 0
        while len(self._files) > 1:
            file = self._files[0]
            last_offset = min(self.max_offset, file.end_offset // UNIT_SIZE) - 1
            if last_offset >= self.max_offset - 1 or self.commitlog_position_at(last_offset)[0] >= commitlog_min_offset:
                break
            self._files.pop(0)
            file.delete()
            self._refresh_tail()
            deleted += 1
            self.min_offset = max(self.min_offset, self._files[0].start_offset // UNIT_SIZE)
        self.min_offset = self.lower_bound(commitlog_min_offset) if self._files else self.max_offset
        return deleted

    def close(self) -> None:
        self._tail_buffer, self._tail_start, self.ready_upto = _NO_BUFFER, 0, 0
        for file in self._files:
            file.close()
