"""The writer's files as a follower sees them: mapped read-only, relisted as the writer adds, replaces and deletes.

``FollowedLog`` is the commit log, ``FollowedQueue`` one consume queue and the range of its units that
checked out so far, ``RebuiltQueue`` a queue whose units ``CommitLogDispatch`` rebuilt in memory.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path

from tieredstore.errors import NotFoundError, ValidationError
from tieredstore.formats.consume_queue import UNIT_SIZE, ConsumeQueueUnit
from tieredstore.formats.naming import hot_file_name, validate_topic
from tieredstore.local.checkpoint import FlushedBound
from tieredstore.local.commit_log_dispatch import CommitLogDispatch, RebuiltUnits
from tieredstore.local.durable import DurableEnd
from tieredstore.local.mapped_file import release_files_below, release_mapped_pages
from tieredstore.local.queue import list_offset_files

_UNIT = struct.Struct(">qiq")


class FollowedFile:
    """One store file mapped read-only, with the identity (device, inode, size) it had when mapped."""

    __slots__ = ("buffer", "identity", "path", "released_upto", "size", "start_offset")

    def __init__(self, path: Path, start_offset: int, buffer: mmap.mmap, identity: tuple[int, int, int]) -> None:
        self.path = path
        self.start_offset = start_offset
        self.buffer = buffer
        self.identity = identity
        self.size = identity[2]
        self.released_upto = 0  # bytes from the file start whose pages release_files_below unmapped

    @classmethod
    def open(cls, path: Path, start_offset: int) -> FollowedFile | None:
        """The file mapped, or None when it is gone or still empty (the writer creates, then sizes it)."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            stat = os.fstat(fd)
            if stat.st_size == 0:
                return None
            buffer = mmap.mmap(fd, stat.st_size, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        return cls(path, start_offset, buffer, (stat.st_dev, stat.st_ino, stat.st_size))

    @property
    def end_offset(self) -> int:
        return self.start_offset + self.size

    def is_current(self) -> bool:
        """Whether the path still names the file that is mapped (not deleted, replaced or resized)."""
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            return False
        return (stat.st_dev, stat.st_ino, stat.st_size) == self.identity

    def close(self) -> None:
        self.buffer.close()


def find_file(files: Sequence[FollowedFile], offset: int) -> FollowedFile | None:
    """The mapping holding byte ``offset`` of its address space, by binary search over start offsets."""
    low, high = 0, len(files)
    while low < high:
        middle = (low + high) // 2
        if files[middle].start_offset <= offset:
            low = middle + 1
        else:
            high = middle
    if low == 0 or offset >= files[low - 1].end_offset:
        return None
    return files[low - 1]


def relist(directory: Path, current: list[FollowedFile]) -> list[FollowedFile]:
    """The directory's 20-digit files mapped: unchanged mappings kept, vanished or replaced ones closed."""
    by_path = {mapping.path: mapping for mapping in current}
    fresh: list[FollowedFile] = []
    for start, path in list_offset_files(directory):
        mapping = by_path.pop(path, None)
        if mapping is not None and not mapping.is_current():
            by_path[path] = mapping  # closed below, mapped again here
            mapping = None
        if mapping is None:
            mapping = FollowedFile.open(path, start)
        if mapping is not None:
            fresh.append(mapping)
    for stale in by_path.values():
        stale.close()
    return fresh


def queue_directories(base: Path) -> Iterator[tuple[str, int]]:
    """(topic, queue id) of every queue directory under ``base`` (``consumequeue/``) now; other names are
    passed over, and a topic directory deleted while it is listed is as if it was never there."""
    if not base.is_dir():
        return
    for topic_dir in base.iterdir():
        try:
            validate_topic(topic_dir.name)
        except ValidationError:
            continue
        try:
            queue_dirs = list(topic_dir.iterdir())
        except (FileNotFoundError, NotADirectoryError):
            continue
        for queue_dir in queue_dirs:
            if queue_dir.name.isdigit():
                yield topic_dir.name, int(queue_dir.name)


class FollowedLog:
    """The writer's commit-log files, mapped read-only."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.files: list[FollowedFile] = []

    def refresh(self) -> None:
        self.files = relist(self.directory, self.files)

    @property
    def min_offset(self) -> int:
        return self.files[0].start_offset if self.files else 0

    @property
    def max_offset(self) -> int:
        """End of the last mapped file: an upper bound of the data, not the writer's write position."""
        return self.files[-1].end_offset if self.files else 0

    def read(self, offset: int, size: int) -> bytes | None:
        """The bytes at ``[offset, offset + size)`` of one file; None when no mapped file holds them all."""
        file = find_file(self.files, offset)
        if file is None or offset + size > file.end_offset:
            return None
        local = offset - file.start_offset
        return file.buffer[local : local + size]

    def release_range(self, begin: int, end: int) -> None:
        """Unmap this process's pages of ``[begin, end)``, whatever was released before."""
        for file in self.files:
            if file.end_offset > begin and file.start_offset < end:
                local = max(begin, file.start_offset) - file.start_offset
                release_mapped_pages(file.buffer, local, min(end, file.end_offset) - file.start_offset)

    def release_pages_below(self, offset: int) -> int:
        return release_files_below(self.files, offset)

    def holder_replaced(self, offset: int) -> bool:
        """Whether the file mapped for ``offset`` is missing or no longer the one on disk."""
        file = find_file(self.files, offset)
        return file is None or not file.is_current()

    def close(self) -> None:
        for file in self.files:
            file.close()
        self.files = []


class FollowedQueue:
    """One (topic, queue id): its consume-queue files mapped read-only and the range of checked units."""

    def __init__(self, topic: str, queue_id: int, directory: Path) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.topic_raw = topic.encode("utf-8")
        self.directory = directory
        self.files: list[FollowedFile] = []
        self.min_offset = 0
        self.max_offset = 0
        self.refreshed_at = -1.0
        self.durable_end = DurableEnd()

    def refresh(self, log_min_offset: int, now: float) -> None:
        """Relist the files; the min offset follows the first file and the commit log's retention."""
        self.refreshed_at = now
        self.files = relist(self.directory, self.files)
        if not self.files:
            self.min_offset = self.max_offset
            return
        first = self.files[0]
        # A broker's retention may also have deleted every file past the last checked unit: start over as new.
        if self.max_offset <= self.min_offset or first.start_offset // UNIT_SIZE > self.max_offset:
            # Nothing checked yet: the first unit may be anywhere in the first file (a rebased queue),
            # and the units before the commit log's first file point at data retention deleted.
            # A first file of zeros holds no unit yet (the writer sizes a file before writing into it,
            # and its recovery zeroes units it rebuilds): the queue starts at the file's first slot,
            # empty, and a later look finds where its first unit really lands.
            data = first.buffer[: first.size - first.size % UNIT_SIZE]
            written = data.lstrip(b"\x00")
            leading_zeros = len(data) - len(written) if written else 0
            self.min_offset = (first.start_offset + leading_zeros) // UNIT_SIZE
            self.min_offset = self.max_offset = self._first_written_at_or_after(log_min_offset)
            return
        self.min_offset = max(self.min_offset, first.start_offset // UNIT_SIZE)
        self.min_offset = min(self._lower_bound(log_min_offset), self.max_offset)

    def _lower_bound(self, commitlog_offset: int) -> int:
        """The first checked queue offset whose unit points at or after ``commitlog_offset``."""
        low, high = self.min_offset, self.max_offset
        while low < high:
            middle = (low + high) // 2
            unit = self.raw_unit(middle)
            if unit is None or unit[0] < commitlog_offset:
                low = middle + 1
            else:
                high = middle
        return low

    def _first_written_at_or_after(self, commitlog_offset: int) -> int:
        """From min_offset, the first slot that is unwritten or points at or after ``commitlog_offset``."""
        low, high = self.min_offset, max(self.min_offset, self.files[-1].end_offset // UNIT_SIZE)
        while low < high:
            middle = (low + high) // 2
            unit = self.raw_unit(middle)
            # Written units ascend in commit-log offset and unwritten (zero) slots only follow them.
            if unit is not None and unit[1] != 0 and unit[0] < commitlog_offset:
                low = middle + 1
            else:
                high = middle
        return low

    def dispatched_end(self) -> int | None:
        """The commit-log offset past the record of the queue's last written unit, unchecked; None with no unit."""
        if not self.files:
            return None
        end = self._first_written_at_or_after(1 << 63)  # the first unwritten slot
        unit = self.raw_unit(end - 1) if end > self.min_offset else None
        return None if unit is None or unit[1] <= 0 else unit[0] + unit[1]

    def raw_unit(self, queue_offset: int) -> tuple[int, int, int] | None:
        """(commit-log offset, size, tag hash) of the slot, unchecked; None when no mapped file holds it."""
        byte_offset = queue_offset * UNIT_SIZE
        file = find_file(self.files, byte_offset)
        if file is None or byte_offset + UNIT_SIZE > file.end_offset:
            return None
        return _UNIT.unpack_from(file.buffer, byte_offset - file.start_offset)

    def checked_unit(self, queue_offset: int) -> ConsumeQueueUnit:
        """The unit at a checked queue offset; NotFoundError outside [min_offset, max_offset) or just deleted."""
        if not self.min_offset <= queue_offset < self.max_offset:
            raise NotFoundError(
                f"offset {queue_offset} of {self.topic}/{self.queue_id} is outside "
                f"[{self.min_offset}, {self.max_offset})"
            )
        unit = self.raw_unit(queue_offset)
        if unit is None:
            raise NotFoundError(f"offset {queue_offset} of {self.topic}/{self.queue_id} was just deleted")
        return ConsumeQueueUnit(*unit)

    def position_at(self, queue_offset: int) -> tuple[int, int] | None:
        """(commit-log offset, size) of the slot's unit, unchecked; None when no mapped file holds it."""
        unit = self.raw_unit(queue_offset)
        return None if unit is None else (unit[0], unit[1])

    def map_next_file(self) -> bool:
        """Map the file after the last one (the writer rolled over); whether there was one."""
        if not self.files:
            return False
        last = self.files[-1]
        mapping = FollowedFile.open(self.directory / hot_file_name(last.end_offset), last.end_offset)
        if mapping is None:
            return False
        self.files.append(mapping)
        return True

    def close(self) -> None:
        for file in self.files:
            file.close()
        self.files = []


class RebuiltQueue(FollowedQueue):
    """A queue with no consume-queue files: its units are the ones ``CommitLogDispatch`` rebuilt, read as a file."""

    def __init__(self, topic: str, queue_id: int, directory: Path, units: RebuiltUnits) -> None:
        super().__init__(topic, queue_id, directory)
        self.units = units

    def refresh(self, log_min_offset: int, now: float) -> None:
        """Take the units the dispatch added, less those whose records retention deleted."""
        self.refreshed_at = now
        units = self.units
        units.drop_below(log_min_offset)
        self.min_offset, self.max_offset = units.first, units.end
        size = units.count * UNIT_SIZE
        self.files = [FollowedFile(self.directory, units.first * UNIT_SIZE, units.buffer, (0, 0, size))] if size else []

    def map_next_file(self) -> bool:
        return False

    def close(self) -> None:
        """The units are the dispatch's to release."""


def rebuild_queues(
    dispatch: CommitLogDispatch,
    followed: dict[tuple[str, int], FollowedQueue],
    log_: FollowedLog,
    flushed: FlushedBound,
    base: Path,
    now: float,
) -> None:
    """Dispatch the records flushed since the last call to the queues without consume-queue files under ``base``,
    following each such queue as a RebuiltQueue in ``followed``."""
    if dispatch.position is None:
        # RocketMQ's own recovery dispatches from where its consume queues end; so does this first scan,
        # so that a broker's start is not a read of its whole commit log (a store without any consume
        # queue is scanned from its first file).
        ends = [end for queue in followed.values() if (end := queue.dispatched_end()) is not None]
        dispatch.position = max(ends, default=None)
    for key in dispatch.advance(log_.files, flushed):
        queue = followed.get(key)
        if not isinstance(queue, RebuiltQueue):
            if queue is not None:
                queue.close()  # its directory was there, without a file
            followed[key] = RebuiltQueue(*key, base / key[0] / str(key[1]), dispatch.queues[key])
    for queue in followed.values():
        if isinstance(queue, RebuiltQueue):
            queue.refresh(log_.min_offset, now)  # the dispatch may have moved its units
