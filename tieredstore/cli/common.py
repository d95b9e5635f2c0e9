"""What the commands share besides the library's read side (``tieredstore.read``): the async edge, refusing
to run beside an archiver, checked arguments, times.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import re
import signal
import threading
from collections.abc import Coroutine, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

from tieredstore.basics import now_ms
from tieredstore.config import TieredStoreConfig
from tieredstore.errors import ArchiverRunningError, ValidationError
from tieredstore.formats.naming import validate_topic
from tieredstore.leases import SingleArchiverLock
from tieredstore.metadata import MetadataStore

T = TypeVar("T")


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """The async edge of a command: Ctrl-C cancels ``coroutine`` and the command ends in KeyboardInterrupt.

    A command that polls (``tail --follow``, ``status --watch``) runs its whole loop in one call.
    """
    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        return asyncio.run(coroutine)  # SIGINT is ignored (a background job) or the embedding program's
    interrupted = False
    tasks: list[asyncio.Task[T]] = []

    # The first Ctrl-C only takes note and cancels: a KeyboardInterrupt raised wherever the main thread is can
    # land in a finalizer (the event loop's own, as asyncio.run ends), which reports it as ignored and goes on.
    def on_sigint(signum: int, frame: FrameType | None) -> None:
        nonlocal interrupted
        if interrupted:
            raise KeyboardInterrupt  # a second Ctrl-C: now, whatever the cancelled command is still doing
        interrupted = True
        if tasks and not tasks[0].done():
            tasks[0].get_loop().call_soon_threadsafe(tasks[0].cancel)

    async def command() -> T:
        task = asyncio.current_task()
        assert task is not None
        tasks.append(task)
        if interrupted:  # before the loop was running: there was nothing to cancel yet
            coroutine.close()
            raise asyncio.CancelledError
        return await coroutine

    signal.signal(signal.SIGINT, on_sigint)
    try:
        result = asyncio.run(command())
    except asyncio.CancelledError:
        if not interrupted:
            raise
        raise KeyboardInterrupt from None
    finally:
        tasks.clear()
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if interrupted:  # the coroutine had finished, or swallowed its cancellation, when the signal came
        raise KeyboardInterrupt
    return result


# ---- beside an archiver --------------------------------------------------------------------------


@contextmanager
def no_archiver_running(config: TieredStoreConfig, action: str) -> Iterator[None]:
    """Refuse to change cold storage beside a running archiver (its queues are open; it would write them
    again): with SQLite, hold its lock file meanwhile, so none can start either; with any database,
    refuse while an archiver's heartbeat is live (scale-out archivers hold leases, not the lock).

    Checked before anything else is opened (retention's runtime recovers, and so writes, cold files).
    """
    with ExitStack() as stack:
        lock = SingleArchiverLock.for_url(config.effective_metadata_url, action=action)
        if lock is not None:
            stack.enter_context(lock)
        with MetadataStore.open(config.effective_metadata_url, create=False) as metadata:
            live = metadata.leases.live_archivers()
        if live:
            raise ArchiverRunningError(
                f"{len(live)} archiver(s) running on this metadata database: {', '.join(live)}; stop them "
                f"before {action} (a stopped archiver's heartbeat expires within its lease duration)"
            )
        yield


def archivers_seen_running(config: TieredStoreConfig, metadata: MetadataStore) -> list[str]:
    """The archivers that look alive on this metadata, found without taking their lock (a read-only
    command must not keep one from starting): live heartbeats, and with SQLite the lock file's last
    holder when that process still exists."""
    seen = metadata.leases.live_archivers()
    lock = SingleArchiverLock.for_url(config.effective_metadata_url)
    if lock is None:
        return seen
    try:
        pid = int(lock.path.read_text(encoding="ascii").strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return seen  # no lock file, or its holder is gone (PermissionError: another user's, rare: ignored)
    return [*seen, f"pid {pid} on the SQLite lock"]


# ---- arguments -----------------------------------------------------------------------------------


def checked_topic(topic: str) -> str:
    """The topic if RocketMQ's rule allows it (this also refuses path tricks like ``../x``)."""
    return validate_topic(topic)


# ---- time -----------------------------------------------------------------------------------------

_RELATIVE = re.compile(r"^-?(\d+(?:\.\d+)?)([smhd])(?:\s*ago)?$")
_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_time(text: str, *, now: int | None = None) -> int:
    """Epoch milliseconds from ``1700000000000``, ISO-8601 (``2024-05-01T12:00:00Z``; naive is UTC),
    ``now``, or a time before now: ``15m``, ``2h``, ``1d`` (also written ``-15m`` or ``15m ago``)."""
    value = text.strip()
    current = now_ms() if now is None else now
    if value == "now":
        return current
    if value.isdigit():
        return int(value)
    relative = _RELATIVE.match(value)
    if relative:
        return current - int(float(relative.group(1)) * _UNIT_MS[relative.group(2)])
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00") if value.endswith("Z") else value)
    except ValueError as exc:
        raise ValidationError(
            f"{text!r} is not a time: use epoch milliseconds, ISO-8601 (2024-05-01T12:00:00Z), now, or 15m/2h/1d (ago)"
        ) from exc
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return int(parsed.timestamp() * 1000)


_DURATION = re.compile(r"^(\d+)([smhd]?)$")


def parse_duration(text: str) -> int:
    """Seconds from ``30s``, ``15m``, ``72h`` or ``7d``; a bare number is hours. ValidationError below 1 s."""
    match = _DURATION.match(text.strip().lower())
    seconds = int(match.group(1)) * _UNIT_MS[match.group(2) or "h"] // 1000 if match else 0
    if seconds < 1:
        raise ValidationError(
            f"{text!r} is not a duration: use a positive whole number of s, m, h or d (30s, 15m, 72h, 7d)"
        )
    return seconds


def ensure_directory(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path
