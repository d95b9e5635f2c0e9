"""File-system helpers of the POSIX provider and its local object store: typed errors, durable
directories, whole reads and writes at a position."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator

from tieredstore.errors import SegmentNotFoundError, StorageAccessError, StorageError, StorageUnavailableError

_ACCESS_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})


@contextlib.contextmanager
def translate_os_errors(what: str) -> Iterator[None]:
    """Turn an OSError from the file system into the typed tree, cause chained; ours pass through."""
    try:
        yield
    except StorageError:
        raise
    except FileNotFoundError as error:
        raise SegmentNotFoundError(f"{what}: no such file") from error
    except OSError as error:
        reason = os.strerror(error.errno) if error.errno is not None else str(error)
        if error.errno in _ACCESS_ERRNOS:
            raise StorageAccessError(f"{what}: {reason}") from error
        # ENOSPC, EDQUOT, EIO and the rest may clear up; the caller keeps its buffer and retries.
        raise StorageUnavailableError(f"{what}: {reason}") from error


def fsync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_directories(directory: str) -> None:
    """``mkdir -p`` that fsyncs each parent in which it created an entry, so the path survives a crash."""
    missing: list[str] = []
    current = directory
    while not os.path.isdir(current):
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    for path in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(path)
        fsync_directory(os.path.dirname(path))


def pread_exactly(fd: int, length: int, position: int) -> bytes:
    parts: list[bytes] = []
    remaining = length
    while remaining > 0:
        chunk = os.pread(fd, remaining, position + length - remaining)
        if not chunk:
            break
        parts.append(chunk)
        remaining -= len(chunk)
    return b"".join(parts)


def pwrite_all(fd: int, data: bytes | bytearray | memoryview, position: int) -> None:
    view = memoryview(data)
    written = 0
    while written < len(view):
        written += os.pwrite(fd, view[written:], position + written)
