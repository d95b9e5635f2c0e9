"""Group commit of sync puts: puts written while a commit-log sync runs share the next one."""

from __future__ import annotations

import threading
import time

import pytest

from tieredstore.local.flusher import Flusher

WAITERS = 6


class FakeLog:
    """A commit log whose syncs block until the test lets them go, and may fail."""

    def __init__(self) -> None:
        self.write_offset = 0
        self.flushed_offset = 0
        self.synced: list[int] = []
        self.sync_started = threading.Semaphore(0)
        self.go_on = threading.Semaphore(0)
        self.failures: list[OSError | None] = []

    def sync(self, upto: int) -> None:
        self.sync_started.release()
        assert self.go_on.acquire(timeout=10)
        failure = self.failures.pop(0) if self.failures else None
        if failure is not None:
            raise failure
        self.synced.append(upto)
        self.flushed_offset = max(self.flushed_offset, upto)


def flusher_over(log: FakeLog) -> Flusher:
    return Flusher(
        interval=3600,
        write_offset=lambda: log.write_offset,
        flushed_offset=lambda: log.flushed_offset,
        flush_commit_log=log.sync,
        flush_all=lambda: None,
    )


def put_and_wait(flusher: Flusher, log: FakeLog, end: int, outcomes: dict[int, str]) -> threading.Thread:
    """A producer that wrote up to ``end`` and waits until it is durable, in a thread of its own."""
    log.write_offset = max(log.write_offset, end)

    def wait() -> None:
        try:
            flusher.wait_durable(end)
            outcomes[end] = "durable" if log.flushed_offset >= end else "returned early"
        except OSError as exc:
            outcomes[end] = f"failed: {exc}"

    thread = threading.Thread(target=wait)
    thread.start()
    return thread


def wait_for_waiters(flusher: Flusher, count: int) -> None:
    """Until ``count`` puts have asked for durability (and so wait, or lead, behind the running sync)."""
    deadline = time.monotonic() + 10
    while flusher.stats.sync_waits < count:
        assert time.monotonic() < deadline
        time.sleep(0.001)


def test_puts_written_during_a_sync_share_the_next_one() -> None:
    log = FakeLog()
    outcomes: dict[int, str] = {}
    flusher = flusher_over(log)
    first = put_and_wait(flusher, log, 100, outcomes)
    assert log.sync_started.acquire(timeout=10)  # the first put leads a sync of everything up to 100
    later = [put_and_wait(flusher, log, 100 + 10 * n, outcomes) for n in range(1, WAITERS + 1)]
    wait_for_waiters(flusher, 1 + WAITERS)
    log.go_on.release()
    assert log.sync_started.acquire(timeout=10)  # the next sync starts once the first has ended
    log.go_on.release()
    for thread in [first, *later]:
        thread.join(timeout=10)
    assert outcomes == {end: "durable" for end in [100] + [100 + 10 * n for n in range(1, WAITERS + 1)]}
    assert log.synced == [100, 100 + 10 * WAITERS]  # two syncs for seven puts
    assert flusher.stats.commit_log_syncs == 2


def test_a_failed_sync_fails_only_the_puts_it_covered() -> None:
    log = FakeLog()
    outcomes: dict[int, str] = {}
    log.failures = [OSError("disk gone")]
    flusher = flusher_over(log)
    first = put_and_wait(flusher, log, 100, outcomes)
    assert log.sync_started.acquire(timeout=10)
    later = [put_and_wait(flusher, log, 100 + 10 * n, outcomes) for n in range(1, 3)]
    wait_for_waiters(flusher, 3)
    log.go_on.release()  # the first sync fails; the queued one, covering the later puts, succeeds
    assert log.sync_started.acquire(timeout=10)
    log.go_on.release()
    for thread in [first, *later]:
        thread.join(timeout=10)
    assert outcomes == {100: "failed: disk gone", 110: "durable", 120: "durable"}


@pytest.mark.parametrize("already", [True, False], ids=["durable", "not-durable"])
def test_a_put_already_durable_does_not_sync(already: bool) -> None:
    log = FakeLog()
    outcomes: dict[int, str] = {}
    log.write_offset = 50
    log.flushed_offset = 50 if already else 0
    flusher = flusher_over(log)
    if not already:
        log.go_on.release()
    thread = put_and_wait(flusher, log, 50, outcomes)
    thread.join(timeout=10)
    assert outcomes == {50: "durable"}
    assert log.synced == ([] if already else [50])
