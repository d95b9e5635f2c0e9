"""Group commit for sync puts, and the flush thread that periodically flushes everything and writes the checkpoint.

A sync put waits in ``wait_durable`` for the commit-log offset it needs durable. If no commit-log
sync is running, the waiter leads one itself (no hand-off to another thread): it takes everything
written so far as the sync's target, so one disk sync covers every put that landed before it
started. Waiters arriving while a sync runs follow it: those whose bytes it covers wait for just
that sync; later ones wait for it to end and then lead or follow the next. Each sync wakes only
the waiters of that sync, never a shared crowd. The disk sync runs with the GIL released, so
producers keep appending (and gathering into the next sync) while it runs.

Every ``flush_interval`` the thread indexes the keys puts recorded, flushes the consume queues, the
commit log and the key index and writes the checkpoint, in both flush modes (the store's ``flush``).
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
    """One commit-log sync to ``target``; ``failure`` is what it raised.

    Its gate is a bare lock the leader holds until the sync ends. Each follower takes it and passes
    it straight on, so the followers wake one after another, each needing the GIL only in its turn,
    instead of all at once (a Condition's notify_all makes every waiter fight for its lock and the GIL).
    """

    __slots__ = ("failure", "gate", "target")

    def __init__(self, target: int) -> None:
        self.target = target
        self.gate = threading.Lock()
        self.gate.acquire()
        self.failure: OSError | ValueError | None = None

    def wait(self) -> None:
        with self.gate:
            pass

    def finish(self) -> None:
        self.gate.release()


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
        counted = False
        while True:
            with self._round_lock:
                if not counted:
                    self.stats.sync_waits += 1
                    counted = True
                if self._flushed_offset() >= end_offset:
                    return
                current = self._round
                leading = current is None
                if current is None:
                    current = self._round = _SyncRound(self._write_offset())
            if leading:
                self._lead(current)
            else:
                current.wait()
            if end_offset <= current.target:
                if current.failure is not None:
                    raise current.failure
                return

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
            sync_round.finish()

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
