"""A fixed-size, memory-mapped store file (commit-log or consume-queue), named by its start offset.

Files are created at their full size, as RocketMQ does, so unwritten space reads as zeros and the
first zero header marks the end of the data. Disk blocks are reserved with ``posix_fallocate`` a
chunk ahead of the writer: a full disk then surfaces as StoreFullError before a byte is written,
instead of as SIGBUS on a page fault into a sparse hole.
"""

from __future__ import annotations

import errno
import mmap
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import structlog

from tieredstore.errors import CorruptRecordError, StoreFullError

log = structlog.get_logger(__name__)

ALLOCATION_CHUNK = 4 << 20
_MADV_DONTNEED: int | None = getattr(mmap, "MADV_DONTNEED", None)
_ZERO_CHUNK = bytes(1 << 20)


def fsync_directory(path: Path) -> None:
    """Make a created, renamed or deleted entry of ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def release_mapped_pages(buffer: mmap.mmap, begin: int, end: int) -> int:
    """Unmap from this process the pages of a shared file mapping that hold ``[begin, end)``.

    The bytes stay in the file and the page cache (dirty pages are written back as usual) and a later
    read maps them again: this only stops them counting in this process's RSS. Returns the bytes
    released: 0 on a platform without MADV_DONTNEED or when the mapping was closed meanwhile.
    """
    if _MADV_DONTNEED is None:
        return 0
    begin -= begin % mmap.PAGESIZE
    try:
        end = min(end, len(buffer))
        if end <= begin:
            return 0
        buffer.madvise(_MADV_DONTNEED, begin, end - begin)
    except ValueError:  # closed by retention or a relist in another thread: nothing mapped to release
        return 0
    return end - begin


class ReleasableFile(Protocol):
    """A mapped store file as ``release_files_below`` needs it; ``released_upto`` is its own mark."""

    released_upto: int  # bytes from the file start whose pages were unmapped already

    @property
    def start_offset(self) -> int: ...

    @property
    def end_offset(self) -> int: ...

    @property
    def buffer(self) -> mmap.mmap: ...


def release_files_below(files: Sequence[ReleasableFile], offset: int, *, sweep: bool = False) -> int:
    """Unmap this process's pages of the ``files`` (in offset order) below logical ``offset``, each from
    where the last call left it; returns the bytes released.

    Every call releases everything below its offset, so from the last file below it back, the first
    file already released that far ends the walk: the cost does not grow with the file count.
    ``sweep`` walks every file and releases it from its start, pages mapped again since included.
    """
    released = 0
    for file in reversed(files):
        if file.start_offset >= offset:
            continue
        end = min(offset, file.end_offset) - file.start_offset
        begin = 0 if sweep else file.released_upto
        if end <= begin:
            if sweep:
                continue
            break
        # Marked before unmapping: a shared-window read that still sees the old mark copied before it
        # moved, so this unmap comes after its copy (see batch.SharedWindow).
        file.released_upto = max(file.released_upto, end)
        released += release_mapped_pages(file.buffer, begin, end)
    return released


def _all_zeros(fd: int, length: int) -> bool:
    """Whether the first ``length`` bytes of ``fd`` are all zero."""
    chunk = len(_ZERO_CHUNK)
    for position in range(0, length, chunk):
        data = os.pread(fd, min(chunk, length - position), position)
        if data != _ZERO_CHUNK[: len(data)]:
            return False
    return True


class MappedFile:
    """One file of ``size`` bytes mapped whole; byte ``i`` holds logical offset ``start_offset + i``."""

    def __init__(self, path: Path, start_offset: int, *, writable: bool, create_size: int | None = None) -> None:
        self.path = path
        self.start_offset = start_offset
        self.writable = writable
        flags = os.O_RDWR if writable else os.O_RDONLY
        if create_size is not None:
            flags |= os.O_CREAT | os.O_EXCL
        self._fd = os.open(path, flags, 0o644)
        try:
            if create_size is not None:
                os.ftruncate(self._fd, create_size)
            self.size = os.fstat(self._fd).st_size
            access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
            self._map = mmap.mmap(self._fd, self.size, access=access)
        except BaseException:
            os.close(self._fd)
            if create_size is not None:
                path.unlink(missing_ok=True)
            raise
        # Unknown for an existing file: reserve again from wherever the writer resumes.
        self._allocated_upto = 0
        # Bytes from the file start whose pages ``release_files_below`` unmapped already.
        self.released_upto = 0

    @classmethod
    def create_or_resume(cls, path: Path, start_offset: int, size: int) -> MappedFile:
        """Map ``path`` for writing, creating it at ``size`` bytes (and making the entry durable) if absent.

        Creating takes two steps, ``O_CREAT`` then ``ftruncate``: a writer killed between them leaves
        a file shorter than ``size``, empty. A short file holding only zeros never held data, so it is
        sized now, as its creation would have done, with a warning. A short file with data in it was
        not left by a crash: CorruptRecordError, and nothing in it is touched.
        """
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            file = cls(path, start_offset, writable=True, create_size=size)
            fsync_directory(path.parent)
            return file
        try:
            found = os.fstat(fd).st_size
            if found < size:
                if not _all_zeros(fd, found):
                    raise CorruptRecordError(
                        f"store file starting at offset {start_offset} holds data but has {found} bytes, "
                        f"not {size}; it was not left by a crash and is kept as it is",
                        location=str(path),
                    )
                os.ftruncate(fd, size)
                os.fsync(fd)
                log.warning("sized a store file a crash left short", path=str(path), found=found, size=size)
        finally:
            os.close(fd)
        return cls(path, start_offset, writable=True)

    @property
    def end_offset(self) -> int:
        return self.start_offset + self.size

    @property
    def allocated_upto(self) -> int:
        """Bytes from the file start known to have disk blocks reserved by this process."""
        return self._allocated_upto

    @property
    def buffer(self) -> mmap.mmap:
        """The mapping itself, for zero-copy struct reads; callers must not keep it past close()."""
        return self._map

    def read(self, position: int, length: int) -> bytes:
        return self._map[position : position + length]

    def write(self, position: int, data: bytes) -> None:
        self._map[position : position + len(data)] = data

    def reserve(self, position: int, upto: int) -> None:
        """Have disk blocks for ``[position, upto)`` before writing there; StoreFullError when the disk is full."""
        if upto <= self._allocated_upto:
            return
        start = max(position, self._allocated_upto)
        end = min(self.size, max(upto, start + ALLOCATION_CHUNK))
        try:
            os.posix_fallocate(self._fd, start, end - start)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise StoreFullError(f"no disk space left for {self.path}: {exc.strerror}") from exc
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
        self._allocated_upto = end

    def write_through(self, position: int, data: bytes | bytearray | memoryview) -> None:
        """Write ``data`` at ``position`` through the file descriptor instead of the mapping (``write``).

        The mapping shares the page cache, so it sees the bytes at once, and ``flush`` covers them. The
        kernel copies them with the GIL released and maps none of their pages into this process: a bulk
        writer (a restore) neither stalls the other threads on the copy nor grows its RSS.
        """
        if self._map.closed:
            raise ValueError(f"{self.path} is closed")
        with memoryview(data) as view:
            if position < 0 or position + len(view) > self.size:
                raise ValueError(f"{len(view)} bytes at {position} do not fit in {self.path} ({self.size} bytes)")
            written = 0
            while written < len(view):
                written += os.pwrite(self._fd, view[written:], position + written)

    def release_pages(self, position: int, length: int) -> None:
        """Unmap the pages of ``[position, position + length)`` from this process after writing them.

        They stay in the page cache (dirty ones are written back as usual) and a read maps them
        again, but a bulk writer (a restore of gigabytes) does not keep them in its own RSS.
        """
        release_mapped_pages(self._map, position, position + length)

    def grow(self, size: int) -> None:
        """Extend the file to ``size`` bytes (zeros) and map it again."""
        if size <= self.size:
            return
        self._map.close()
        os.ftruncate(self._fd, size)
        self.size = size
        self._map = mmap.mmap(self._fd, size, access=mmap.ACCESS_WRITE)
        self._allocated_upto = self.released_upto = 0

    def flush(self, start: int = 0, end: int | None = None) -> None:
        """Make the bytes in ``[start, end)`` (whole file by default) durable.

        ``fdatasync`` writes back every dirty page of the file, those dirtied through the mapping
        included, which covers the range. Unlike ``mmap.flush`` (msync), CPython runs it with the
        GIL released, so producers keep appending while the disk syncs.
        """
        if not self.writable:
            return
        if self._map.closed:
            # The descriptor number may already belong to another file: never sync it.
            raise ValueError(f"{self.path} is closed")
        end = self.size if end is None else min(end, self.size)
        if end > start:
            os.fdatasync(self._fd)

    def zero_from(self, position: int) -> int:
        """Zero every byte from ``position`` to the end; returns how many were not zero already."""
        dirty = 0
        chunk = len(_ZERO_CHUNK)
        cursor = position
        while cursor < self.size:
            length = min(chunk, self.size - cursor)
            current = self._map[cursor : cursor + length]
            if current != _ZERO_CHUNK[:length]:
                dirty += length - current.count(0) if length else 0
                self._map[cursor : cursor + length] = _ZERO_CHUNK[:length]
            cursor += length
        return dirty

    def close(self) -> None:
        if not self._map.closed:
            self._map.close()
            os.close(self._fd)

    def delete(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)

    def __repr__(self) -> str:
        return f"MappedFile({str(self.path)!r}, start={self.start_offset}, size={self.size})"
