"""The hot commit log: every topic's records in one log of fixed-size files named by start offset.

A record never straddles two files. When the next record plus an 8-byte blank header does not
fit in what is left of a file, the rest of the file becomes a blank record (RocketMQ's rule) and
the record starts the next file. ``write_offset`` is the end of the valid data; nothing at or
past it is ever served.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from tieredstore.errors import CorruptRecordError, NotFoundError
from tieredstore.formats.message import BLANK_HEADER, MAGIC_BLANK, MessageRecord, decode
from tieredstore.formats.naming import hot_file_name
from tieredstore.local.mapped_file import MappedFile, fsync_directory, release_files_below
from tieredstore.local.queue import list_offset_files

END_FILE_MIN_BLANK_LENGTH = BLANK_HEADER.size
# A writer keeps its last this-many flushed bytes mapped (readers of recent messages find them there)
# and unmaps what is older, in steps of WRITER_RELEASE_STEP: see CommitLog.flush.
WRITER_MAPPED_WINDOW = 128 << 20
WRITER_RELEASE_STEP = 4 << 20
# Every this many steps the release sweeps every older file whole: pages readers mapped again there
# (a consumer catching up through old hot data) go too.
WRITER_SWEEP_STEPS = 64
# From this many records a batch is laid out with numpy, a file at a time, instead of record by record.
_VECTOR_PLAN_FROM = 64
# The tail buffer when there is no writable last file: empty and read-only, so any write to it raises.
_NO_BUFFER = memoryview(b"")


@dataclass(frozen=True, slots=True)
class AppendPlan:
    """Where a batch of records will go: their offsets, blanks to write first, and the new end."""

    positions: list[int]
    blanks: list[tuple[int, int]]
    end_offset: int


@dataclass(frozen=True, slots=True)
class ScanStop:
    """Why a commit-log scan ended: a clean end (``reason`` None) or the first invalid byte."""

    offset: int
    reason: str | None


class CommitLog:
    """The files of ``<store>/commitlog``, the write position and the flushed position."""

    def __init__(self, directory: Path, *, file_size: int, writable: bool) -> None:
        self.directory = directory
        self.writable = writable
        self._new_file_size = file_size
        self.files: list[MappedFile] = []
        self.write_offset = 0
        self.flushed_offset = 0
        # Logical offset below which every byte has a file and reserved disk blocks: puts below it skip prepare().
        self._reserved_upto = 0
        # Below this, flush has unmapped the writer's pages, in this many steps (see flush).
        self._released_below = 0
        self._release_steps = 0
        # The last file, for appends that need no planning: a record may go at any offset in
        # [tail_start, tail_limit - size] straight into tail_buffer, leaving room for a blank header.
        # Without a last file the buffer is empty and read-only, so a write that skipped the limit check fails loudly.
        self.tail_buffer: mmap.mmap | memoryview = _NO_BUFFER
        self.tail_start = 0
        self.tail_limit = -1

    @classmethod
    def load(cls, directory: Path, *, file_size: int, writable: bool) -> CommitLog:
        log = cls(directory, file_size=file_size, writable=writable)
        if writable:
            directory.mkdir(parents=True, exist_ok=True)
        previous_end: int | None = None
        for start, path in list_offset_files(directory):
            if previous_end is not None and start != previous_end:
                raise CorruptRecordError(
                    f"commit-log files are not contiguous: expected a file at {previous_end}", location=str(path)
                )
            if path.stat().st_size == 0:
                continue
            file = MappedFile(path, start, writable=writable)
            log.files.append(file)
            previous_end = file.end_offset
        if log.files:
            log.write_offset = log.flushed_offset = log.files[0].start_offset
        return log

    @property
    def min_offset(self) -> int:
        return self.files[0].start_offset if self.files else self.write_offset

    def file_for(self, offset: int) -> MappedFile | None:
        low, high = 0, len(self.files)
        while low < high:
            middle = (low + high) // 2
            if self.files[middle].start_offset <= offset:
                low = middle + 1
            else:
                high = middle
        if low == 0 or offset >= self.files[low - 1].end_offset:
            return None
        return self.files[low - 1]

    def plan(self, sizes: list[int]) -> AppendPlan:
        """Lay out records of ``sizes`` after the write position; pure arithmetic, nothing is touched.

        A record goes where the last one ended if a blank record still fits after it in that file;
        otherwise a blank fills the file's end and the record starts the next file.
        """
        offset = self.write_offset
        current = self.file_for(offset)
        file_start = current.start_offset if current else offset
        file_end = current.end_offset if current else offset + self._new_file_size
        if len(sizes) >= _VECTOR_PLAN_FROM:
            return self._plan_many(np.asarray(sizes, dtype=np.int64), offset, file_end)
        positions: list[int] = []
        blanks: list[tuple[int, int]] = []
        for size in sizes:
            if file_end - offset < size + END_FILE_MIN_BLANK_LENGTH:
                blanks.append((offset, file_end - offset))
                file_start = file_end
                file_end = file_start + self._new_file_size
                offset = file_start
            positions.append(offset)
            offset += size
        return AppendPlan(positions, blanks, offset)

    def _plan_many(self, sizes: npt.NDArray[np.int64], offset: int, file_end: int) -> AppendPlan:
        """``plan`` for a large batch, a file at a time: the records fitting in a file are found at once."""
        positions = np.empty(len(sizes), dtype=np.int64)
        blanks: list[tuple[int, int]] = []
        begin = 0
        while begin < len(sizes):
            ends = offset + np.cumsum(sizes[begin:])
            fitting = int(np.searchsorted(ends, file_end - END_FILE_MIN_BLANK_LENGTH, side="right"))
            positions[begin : begin + fitting] = ends[:fitting] - sizes[begin : begin + fitting]
            if fitting:
                offset = int(ends[fitting - 1])
                begin += fitting
            if begin < len(sizes):
                # The next record does not fit: a blank ends this file, and the record starts the next
                # one whatever its size, as one record at a time would place it.
                blanks.append((offset, file_end - offset))
                offset, file_end = file_end, file_end + self._new_file_size
                positions[begin] = offset
                offset += int(sizes[begin])
                begin += 1
        return AppendPlan(positions.tolist(), blanks, offset)

    def prepare(self, plan: AppendPlan) -> None:
        """Create and reserve disk for every file the plan writes into; StoreFullError leaves data untouched."""
        target = plan.end_offset
        if target + END_FILE_MIN_BLANK_LENGTH <= self._reserved_upto:
            return
        while not self.files or self.files[-1].end_offset <= target:
            start = self.files[-1].end_offset if self.files else self.write_offset
            self._add_file(start)
        for file in self.files:
            if file.end_offset <= self.write_offset or file.start_offset > target:
                continue
            begin = max(self.write_offset, file.start_offset) - file.start_offset
            file.reserve(begin, min(target + END_FILE_MIN_BLANK_LENGTH, file.end_offset) - file.start_offset)
        last = self.files[-1]
        self._reserved_upto = last.start_offset + last.allocated_upto
        self._refresh_tail()

    def _refresh_tail(self) -> None:
        if not self.files or not self.writable:
            self.tail_buffer, self.tail_start, self.tail_limit = _NO_BUFFER, 0, -1
            return
        last = self.files[-1]
        self.tail_buffer = last.buffer
        self.tail_start = last.start_offset
        self.tail_limit = min(self._reserved_upto, last.end_offset) - END_FILE_MIN_BLANK_LENGTH

    def _add_file(self, start: int) -> None:
        path = self.directory / hot_file_name(start)
        file = MappedFile.create_or_resume(path, start, self._new_file_size)
        self.files.append(file)

    def write(self, offset: int, data: bytes) -> MappedFile:
        file = self.file_for(offset)
        if file is None:
            raise NotFoundError(f"no commit-log file holds offset {offset}")
        file.write(offset - file.start_offset, data)
        return file

    def write_blank(self, offset: int, size: int) -> None:
        # Only the header: the rest of a file is zeros already, and writing them would allocate the blocks.
        self.write(offset, BLANK_HEADER.pack(size, MAGIC_BLANK))

    def read(self, offset: int, size: int) -> bytes:
        """The bytes of a record at ``offset``; NotFoundError unless they are entirely valid data."""
        if offset < self.min_offset or offset + size > self.write_offset:
            raise NotFoundError(f"commit-log range [{offset}, {offset + size}) is not in the hot store")
        file = self.file_for(offset)
        if file is None or offset + size > file.end_offset:
            raise NotFoundError(f"commit-log range [{offset}, {offset + size}) is not in one file")
        try:
            return file.read(offset - file.start_offset, size)
        except ValueError as exc:
            raise NotFoundError(f"commit-log offset {offset} was just deleted") from exc

    def flush(self, upto: int) -> None:
        """msync every byte below ``upto`` that is not flushed yet."""
        start = self.flushed_offset
        if upto <= start:
            return
        for file in list(self.files):
            if file.end_offset > start and file.start_offset < upto:
                file.flush(max(0, start - file.start_offset), upto - file.start_offset)
        self.flushed_offset = upto
        # Every page a put wrote stays mapped until something unmaps it: without this a producer's RSS
        # grows to the size of its hot store. Flushed pages are clean; a later read maps them again.
        if self.writable and upto - WRITER_MAPPED_WINDOW >= self._released_below + WRITER_RELEASE_STEP:
            self._released_below = upto - WRITER_MAPPED_WINDOW
            self._release_steps += 1
            self.release_pages_below(self._released_below, sweep=self._release_steps % WRITER_SWEEP_STEPS == 0)

    def scan(self, start: int) -> Iterator[tuple[int, int, MessageRecord] | ScanStop]:
        """Validate records from ``start``: yields (offset, size, record) for each, then one ScanStop."""
        offset = start
        while True:
            file = self.file_for(offset)
            if file is None:
                yield ScanStop(offset, None)
                return
            local = offset - file.start_offset
            if file.size - local < BLANK_HEADER.size:
                # Every writer leaves room for a blank header, so a shorter remainder is a cut-off file.
                yield ScanStop(offset, f"file ends {file.size - local} bytes after the last record, without a blank")
                return
            size, magic = BLANK_HEADER.unpack_from(file.buffer, local)
            if size == 0 and magic == 0:
                yield ScanStop(offset, None)
                return
            if magic == MAGIC_BLANK:
                if size != file.size - local:
                    yield ScanStop(offset, f"blank record of {size} bytes does not end its file")
                    return
                offset = file.end_offset
                continue
            with memoryview(file.buffer) as view:
                try:
                    record = decode(view, local, location=str(file.path))
                except CorruptRecordError as exc:
                    yield ScanStop(offset, str(exc))
                    return
            if record.physical_offset != offset:
                yield ScanStop(offset, f"record claims physical offset {record.physical_offset}")
                return
            yield offset, size, record
            offset += size

    def truncate(self, valid_end: int) -> tuple[int, list[str]]:
        """Zero everything from ``valid_end`` and delete later files; (bytes cleared, files removed)."""
        cleared = 0
        removed: list[str] = []
        while self.files and self.files[-1].start_offset > valid_end:
            file = self.files.pop()
            removed.append(file.path.name)
            file.delete()
        if removed:
            fsync_directory(self.directory)
        last = self.files[-1] if self.files else None
        if last is not None and 0 < last.end_offset - valid_end < END_FILE_MIN_BLANK_LENGTH:
            # A file cut short (by a crash or by hand) gets its full size back so appends can continue.
            last.grow(max(self._new_file_size, valid_end - last.start_offset + END_FILE_MIN_BLANK_LENGTH))
        holder = self.file_for(valid_end)
        if holder is not None:
            cleared = holder.zero_from(valid_end - holder.start_offset)
            holder.flush()
        self.write_offset = self.flushed_offset = valid_end
        self._reserved_upto = 0
        self._refresh_tail()
        return cleared, removed

    def release_pages_below(self, offset: int, *, sweep: bool = False) -> int:
        """Unmap this process's pages of the files below ``offset`` (see ``release_files_below``)."""
        return release_files_below(list(self.files), offset, sweep=sweep)

    def delete_first_file(self) -> MappedFile:
        file = self.files.pop(0)
        file.delete()
        fsync_directory(self.directory)
        self._refresh_tail()
        return file

    def close(self) -> None:
        self._reserved_upto = 0
        self._refresh_tail()
        for file in self.files:
            file.close()
