"""Group commit for sync puts, and the flush thread that periodically flushes everything and writes the checkpoint.

A sync put waits in ``wait_durable`` for the commit-log offset it needs durable. If no commit-log
sync is running, the waiter leads one itself (no hand-off to another thread): it takes everything
written so far as the sync's target, so one disk sync covers every put that landed before it
started. Waiters arriving while a sync runs follow it: those whose bytes it covers wait for just
that sync; later ones wait for it to end and then lead or follow the next. Each sync wakes only
the waiters of that sync, never a shared crowd. The disk sync runs with the GIL released, so
producers keep appending (and gathering into the next sync) while it runs.

Every ``flush_interval`` the thread flushes the consume queues and the commit log and writes the
checkpoint, in both flush modes.
"""

from __future__ import annotations

import threading
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


class _SyncRound:
    """One commit-log sync to ``target``: its followers wait on ``done``; ``failure`` is what it raised."""

    __slots__ = ("done", "failure", "target")

    def __init__(self, target: int) -> None:
        self.target = target
        self.done = threading.Event()
        self.failure: OSError | ValueError | None = None


class Flusher:
    """Owns the periodic thread and the group commit; ``flush_commit_log(upto)`` and ``flush_all()`` are the store's."""

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
        self._round_lock = threading.Lock()
        self._round: _SyncRound | None = None
        self._stop = threading.Event()
        self.stats = FlushStats()
        self._thread = threading.Thread(target=self._run, name="tieredstore-hot-flush", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wait_durable(self, end_offset: int) -> None:
        """Block until the commit log is durable up to ``end_offset``; re-raises the failure of a sync it needed."""
        with self._round_lock:
            self.stats.sync_waits += 1
        while True:
            with self._round_lock:
                if self._flushed_offset() >= end_offset:
                    return
                current = self._round
                if current is None:
                    current = self._round = _SyncRound(self._write_offset())
                    leading = True
                else:
                    leading = False
            if leading:
                self._lead(current)
                if current.failure is not None:
                    raise current.failure
                continue
            current.done.wait()
            if current.failure is not None and end_offset <= current.target:
                raise current.failure

    def _lead(self, sync_round: _SyncRound) -> None:
        try:
            self._flush_commit_log(sync_round.target)
            self.stats.commit_log_syncs += 1
        except (OSError, ValueError) as exc:  # ValueError: a file closed under us
            log.error("hot store commit-log sync failed", error=str(exc))
            sync_round.failure = exc
        finally:
            with self._round_lock:
                self._round = None
            sync_round.done.set()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._flush_all()
                self.stats.periodic_flushes += 1
            except (OSError, ValueError) as exc:
                # The next interval retries; sync puts see their own failures in wait_durable.
                log.error("hot store flush failed", error=str(exc))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
