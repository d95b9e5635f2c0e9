"""Process and socket tuning: glibc's allocator for each process role, and the receive buffer of GET sockets.

A leaf module (it imports nothing of tieredstore), so providers may use it too.

**The allocator.** glibc's malloc is process-wide, so it is tuned only where this package owns the process
(``tieredstore run``, ``tieredstore restore``) and, setting by setting, never where the user set the matching
``MALLOC_*`` variable (glibc applied that value at start-up). The two roles set it in opposite directions,
because they hold their buffers differently:

- the archiver (``tune_for_archiver``) makes and frees a batch buffer of up to ``group_commit_size`` for
  every commit, a few at a time, from different worker threads: it keeps blocks up to
  ``ARCHIVER_THRESHOLD_BYTES`` in the heap and the freed space at an arena's top up to that size, over at
  most ``ARCHIVER_ARENAS`` arenas, so a batch reuses the pages the last one freed instead of faulting in
  new ones;
- a restore (``tune_for_restore``) holds batches of every size across many queues in parallel under a
  byte budget: it maps every block of ``RESTORE_MMAP_THRESHOLD_BYTES`` or more on its own, so that freeing
  it unmaps it, since glibc's sliding threshold would otherwise serve later batches from thread heaps that
  fragment and keep free memory resident.

Both are no-ops off glibc. Call them before the event loop and its worker threads exist: arenas made
earlier are kept as they are.

**Sockets.** ``receive_buffer_socket_options`` is what an S3 GET connection asks for: a receive buffer that
holds a whole chunk object, so the server keeps sending while the thread reading it waits for the GIL;
asked only where the kernel grants it whole (``net.core.rmem_max``), since a socket given ``SO_RCVBUF``
is no longer autotuned and would otherwise end up with less.
"""

from __future__ import annotations

import ctypes
import os
import platform
import socket
from collections.abc import Callable
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

MIB = 1 << 20
ARCHIVER_ARENAS = 2
ARCHIVER_THRESHOLD_BYTES = 32 * MIB
RESTORE_MMAP_THRESHOLD_BYTES = 1 * MIB
# The largest object one GET reads: a commit-log chunk of a default group commit.
RECEIVE_BUFFER_BYTES = 4 * MIB

# mallopt(3) parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
# Each setting as the environment variable that sets it at start-up, its mallopt parameter and its value.
_ARCHIVER = (
    ("MALLOC_TRIM_THRESHOLD_", _M_TRIM_THRESHOLD, ARCHIVER_THRESHOLD_BYTES),
    ("MALLOC_MMAP_THRESHOLD_", _M_MMAP_THRESHOLD, ARCHIVER_THRESHOLD_BYTES),
    ("MALLOC_ARENA_MAX", _M_ARENA_MAX, ARCHIVER_ARENAS),
)
_RESTORE = (("MALLOC_MMAP_THRESHOLD_", _M_MMAP_THRESHOLD, RESTORE_MMAP_THRESHOLD_BYTES),)
_RMEM_MAX = Path("/proc/sys/net/core/rmem_max")

_tuned_for: dict[str, dict[str, int]] = {}


def tune_for_archiver() -> dict[str, int]:
    """Tune glibc's malloc for the archiver's process; what was set, by variable name (empty if nothing)."""
    return _tune("archiver", _ARCHIVER)


def tune_for_restore() -> dict[str, int]:
    """Tune glibc's malloc for a restore's process; what was set, by variable name (empty if nothing)."""
    return _tune("restore", _RESTORE)


def _tune(role: str, settings: tuple[tuple[str, int, int], ...]) -> dict[str, int]:
    # Idempotent per role, so that a second call reports what the first one set.
    if role in _tuned_for:
        return dict(_tuned_for[role])
    applied: dict[str, int] = {}
    mallopt = _glibc_mallopt()
    if mallopt is not None:
        for variable, parameter, value in settings:
            if variable in os.environ:
                continue
            if mallopt(parameter, value) == 1:
                applied[variable] = value
            else:
                log.warning("mallopt refused a setting", setting=variable, value=value)
    _tuned_for[role] = applied
    return dict(applied)


def _glibc_mallopt() -> Callable[[int, int], int] | None:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library this interpreter runs on
    except (OSError, AttributeError):
        return None
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    function: Callable[[int, int], int] = mallopt
    return function


def receive_buffer_granted(size: int) -> bool:
    """Whether the kernel gives a socket a receive buffer of ``size`` bytes whole (Linux: ``net.core.rmem_max``)."""
    try:
        return int(_RMEM_MAX.read_text(encoding="ascii")) >= size
    except (OSError, ValueError):
        return False  # not Linux, or not readable here: leave the buffer to the kernel


def receive_buffer_socket_options() -> list[tuple[int, int, int]]:
    """The socket options of a connection that GETs objects: none unless the kernel grants the buffer whole."""
    if not receive_buffer_granted(RECEIVE_BUFFER_BYTES):
        return []
    return [(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER_BYTES)]
