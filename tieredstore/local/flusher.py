"""Group commit for sync puts, and the flush thread that periodically flushes everything and writes the checkpoint.

A sync put waits in ``wait_durable`` for the commit-log offset it needs durable, and is woken once,
when a sync covering it has ended. If no commit-log sync is running, the waiter leads one itself (no
hand-off to another thread): it takes everything written so far as the sync's target. Waiters
arriving while a sync runs follow it if it covers their bytes; the others join the next round, which
waits to start until the running sync ends, then takes as its target everything written by then: one
disk sync for every put that landed while the previous one ran. The first to join the next round
leads it. Each sync wakes only the waiters of that round, never a shared crowd. The disk sync runs
with the GIL released, so producers keep appending (and joining the next round) while it runs.

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
    """One commit-log sync to ``target`` (None until it starts); ``failure`` is what it raised.

    Its gate is a bare lock the leader holds until the sync ends. Each follower takes it and passes
    it straight on, so the followers wake one after another, each needing the GIL only in its turn,
    instead of all at once (a Condition's notify_all makes every waiter fight for its lock and the GIL).
    A round queued behind a running sync has a start gate too, on which its leader waits for that sync.
    """

    __slots__ = ("failure", "gate", "start", "target")

    def __init__(self, target: int | None, *, queued: bool = False) -> None:
        self.target = target
        self.gate = _held_lock()
        self.start = _held_lock() if queued else None
        self.failure: OSError | ValueError | None = None

    def covers(self, end_offset: int) -> bool:
        """Whether this round's sync makes ``end_offset`` durable: a round not started yet covers every byte written."""
        return self.target is None or end_offset <= self.target

    def wait(self) -> None:
        with self.gate:
            pass

    def finish(self) -> None:
        self.gate.release()


def _held_lock() -> threading.Lock:
    lock = threading.Lock()
    lock.acquire()
    return lock


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
        self._round: _SyncRound | None = None  # the sync running (or about to start)
        self._queued: _SyncRound | None = None  # the one that starts when it ends
        self._stop = threading.Event()
        self.stats = FlushStats()
        self._thread = threading.Thread(target=self._run, name="tieredstore-hot-flush", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wait_durable(self, end_offset: int) -> None:
        """Block until the commit log is durable up to ``end_offset``; re-raises the failure of the sync it needed."""
        with self._round_lock:
            self.stats.sync_waits += 1
            if self._flushed_offset() >= end_offset:
                return
            current = self._round
            leading = current is None
            if current is None:
                current = self._round = _SyncRound(self._write_offset())
            elif not current.covers(end_offset):
                # Written while the running sync was under way: the next round, which starts when it ends.
                queued = self._queued
                leading = queued is None
                if queued is None:
                    queued = self._queued = _SyncRound(None, queued=True)
                current = queued
        if leading:
            if current.start is not None:
                with current.start:
                    pass
                with self._round_lock:
                    current.target = self._write_offset()
            self._lead(current)
        else:
            current.wait()
        if current.failure is not None:
            raise current.failure

    def _lead(self, sync_round: _SyncRound) -> None:
        assert sync_round.target is not None
        try:
            self._flush_commit_log(sync_round.target)
            self.stats.commit_log_syncs += 1
        except (OSError, ValueError) as exc:  # ValueError: a file closed under us
            log.error("hot store commit-log sync failed", error=str(exc))
            sync_round.failure = exc
        finally:
            with self._round_lock:
                successor = self._round = self._queued
                self._queued = None
            # The next sync first: its disk work overlaps this round's followers waking.
            if successor is not None and successor.start is not None:
                successor.start.release()
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
