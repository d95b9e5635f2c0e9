"""The flush thread: group commit for sync puts, and the periodic flush plus checkpoint for both modes.

A sync put registers the commit-log offset it needs durable and waits. The thread flushes up to
the current write position in one msync, which covers every put that arrived in the meantime, and
wakes them all: one disk sync for many puts. Every ``flush_interval`` it also flushes the consume
queues and writes the checkpoint.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

log = structlog.get_logger(__name__)


@dataclass(slots=True)
class FlushStats:
    """Counters a benchmark reads to show what group commit saved."""

    commit_log_syncs: int = 0
    periodic_flushes: int = 0
    sync_waits: int = 0


class Flusher:
    """Owns the thread; ``flush_commit_log(upto)`` and ``flush_all()`` are the store's, called here only."""

    def __init__(
        self,
        *,
        interval: float,
        write_offset: Callable[[], int],
        flushed_offset: Callable[[], int],
        flush_commit_log: Callable[[int], None],
        flush_all: Callable[[], None],
    ) -> None:
        self._interval = interval
        self._write_offset = write_offset
        self._flushed_offset = flushed_offset
        self._flush_commit_log = flush_commit_log
        self._flush_all = flush_all
        self._condition = threading.Condition()
        self._requested = 0
        self._stopping = False
        self._failure: OSError | ValueError | None = None
        self.stats = FlushStats()
        self._thread = threading.Thread(target=self._run, name="tieredstore-hot-flush", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wait_durable(self, end_offset: int) -> None:
        """Block until the commit log is flushed to ``end_offset``; re-raises a flush failure."""
        with self._condition:
            self.stats.sync_waits += 1
            if end_offset > self._requested:
                self._requested = end_offset
                self._condition.notify_all()
            while self._flushed_offset() < end_offset:
                if self._failure is not None:
                    raise self._failure
                if self._stopping and not self._thread.is_alive():
                    break
                self._condition.wait()

    def _run(self) -> None:
        next_periodic = time.monotonic() + self._interval
        while True:
            with self._condition:
                while not self._stopping and self._requested <= self._flushed_offset():
                    remaining = next_periodic - time.monotonic()
                    if remaining <= 0:
                        break
                    self._condition.wait(remaining)
                stopping = self._stopping
            try:
                if self._requested > self._flushed_offset():
                    self._flush_commit_log(self._write_offset())
                    self.stats.commit_log_syncs += 1
                if time.monotonic() >= next_periodic:
                    self._flush_all()
                    self.stats.periodic_flushes += 1
                    next_periodic = time.monotonic() + self._interval
                self._failure = None
            except (OSError, ValueError) as exc:  # ValueError: an mmap closed under us
                log.error("hot store flush failed", error=str(exc))
                self._failure = exc
            with self._condition:
                self._condition.notify_all()
                if self._failure is not None and not stopping:
                    # Back off instead of spinning on a failing disk; waiters have been told.
                    self._condition.wait(self._interval)
            if stopping:
                return

    def stop(self) -> None:
        with self._condition:
            self._stopping = True
            self._condition.notify_all()
        self._thread.join()
