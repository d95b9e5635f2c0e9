"""The hot store's writer lock, as our processes and a RocketMQ broker both see it.

Our writers take an ``flock`` on ``<store>/lock``. A RocketMQ broker takes Java's
``FileChannel.tryLock``, a POSIX byte-range lock on the same file, which ``flock`` does not see on
Linux; so a writer takes that range too, and a probe checks both. The range lock is an
open-file-description lock (``F_OFD_SETLK``): it conflicts with the broker's POSIX lock like any other,
but unlike a classic POSIX lock it is not dropped when this process closes some other descriptor of
the same file (a second writer attempt, a probe).
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
from pathlib import Path

from tieredstore.errors import StoreLockedError

LOCK_FILE = "lock"
# struct flock on 64-bit Linux: l_type, l_whence, l_start, l_len, l_pid (0 for OFD locks), padding.
_FLOCK = struct.Struct("hhqqi4x")
# The byte RocketMQ's broker locks (FileChannel.tryLock(0, 1, false)).
_BROKER_RANGE = (0, 1)
_BUSY = (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
# Where the platform has no OFD locks, only our own flock is taken and probed.
_OFD_SETLK: int | None = getattr(fcntl, "F_OFD_SETLK", None)
_OFD_GETLK: int | None = getattr(fcntl, "F_OFD_GETLK", None)


def take_writer_lock(root: Path) -> int:
    """Take the writer lock of the store at ``root``; returns the descriptor that holds it until closed.

    Raises StoreLockedError when another writer of ours or a RocketMQ broker holds it.
    """
    fd = os.open(root / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if _OFD_SETLK is not None:
            fcntl.fcntl(fd, _OFD_SETLK, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, *_BROKER_RANGE, 0))
    except OSError as exc:
        os.close(fd)
        if exc.errno not in _BUSY:
            raise
        raise StoreLockedError(f"{root} is already open by another writer (its lock file is held)") from exc
    return fd


def writer_lock_held(data_dir: str | os.PathLike[str]) -> bool:
    """Whether a process holds the hot store's writer lock now; creates nothing (a missing lock file is free).

    The broker's range is asked about first, without taking a lock: a running broker's lock file is never
    locked by the probe, not even for an instant. Only when no one holds that range is our own flock tried
    (taken and given back at once), for a writer on a platform without OFD locks.
    """
    try:
        fd = os.open(Path(data_dir) / LOCK_FILE, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        if _OFD_GETLK is not None:
            # Asks who would conflict with a write lock, without taking one (the descriptor is read-only).
            query = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, *_BROKER_RANGE, 0)
            (lock_type, *_rest) = _FLOCK.unpack(fcntl.fcntl(fd, _OFD_GETLK, query))
            if lock_type != fcntl.F_UNLCK:
                return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in _BUSY:
                return True
            raise
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)
