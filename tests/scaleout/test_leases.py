"""The lease manager on SQLite and PostgreSQL: acquire, renew, expire, takeover, fencing and fair shares."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tieredstore.errors import ConfigError, LeaseLostError
from tieredstore.leases import LeaseChanges, LeaseManager, SingleArchiverLock
from tieredstore.metadata import MetadataStore, upgrade

TIEREDSTORE = [sys.executable, "-c", "from tieredstore.cli import run_main; run_main()"]
TOPIC = "Orders"
QUEUES = 6


@pytest.fixture
def url(metadata_url: str) -> str:
    upgrade(metadata_url)
    with MetadataStore(metadata_url) as store:
        for queue_id in range(QUEUES):
            store.get_or_create_queue(TOPIC, queue_id)
    return metadata_url


@pytest.fixture
def stores(url: str) -> Iterator[list[MetadataStore]]:
    """One store per simulated archiver process (each with its own connections, like separate processes)."""
    opened = [MetadataStore(url) for _ in range(3)]
    yield opened
    for store in opened:
        store.close()


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_lone_archiver_acquires_every_queue_at_epoch_one(stores: list[MetadataStore]) -> None:
    archiver = LeaseManager(stores[0], owner="a", lease_duration=3.0, renew_interval=1.0)
    changes = archiver.round()
    assert sorted(changes.acquired) == [(TOPIC, q) for q in range(QUEUES)]
    assert changes.fair_share == QUEUES
    assert all(archiver.holds((TOPIC, q)) for q in range(QUEUES))
    rows = stores[1].list_queues(TOPIC)
    assert {(r.owner, r.epoch) for r in rows} == {("a", 1)}
    assert all(r.lease_expiry is not None for r in rows)


def test_renewal_extends_the_expiry_without_changing_the_epoch(stores: list[MetadataStore]) -> None:
    archiver = LeaseManager(stores[0], owner="a", lease_duration=3.0, renew_interval=1.0)
    archiver.round()
    before = {r.queue_id: r for r in stores[1].list_queues(TOPIC)}
    time.sleep(0.05)
    changes = archiver.round()
    after = {r.queue_id: r for r in stores[1].list_queues(TOPIC)}
    assert changes.acquired == [] and changes.lost == []
    for queue_id, row in after.items():
        assert row.epoch == before[queue_id].epoch == 1
        assert row.lease_expiry is not None and row.lease_expiry > (before[queue_id].lease_expiry or 0)


@pytest.mark.usefixtures("no_idle_transaction_limit")
def test_an_expired_lease_is_taken_over_with_a_bumped_epoch_and_the_old_owner_learns_it_lost_it(
    stores: list[MetadataStore],
) -> None:
    old = LeaseManager(stores[0], owner="old", lease_duration=1.5, renew_interval=0.5)
    new = LeaseManager(stores[1], owner="new", lease_duration=1.5, renew_interval=0.5)
    old.round()
    assert new.round().acquired == []  # all held and alive: nothing to take yet
    time.sleep(1.7)  # old stops renewing (paused, dead, cut off) past its lease
    taken = new.round()
    assert sorted(taken.acquired) == [(TOPIC, q) for q in range(QUEUES)]
    assert {(r.owner, r.epoch) for r in stores[2].list_queues(TOPIC)} == {("new", 2)}
    resumed = old.round()
    assert sorted(resumed.lost) == [(TOPIC, q) for q in range(QUEUES)]
    assert not any(old.holds((TOPIC, q)) for q in range(QUEUES))


def test_a_stale_epoch_cannot_record_positions(stores: list[MetadataStore]) -> None:
    zombie = LeaseManager(stores[0], owner="zombie", lease_duration=1.5, renew_interval=0.5)
    zombie.round()
    hold = zombie.hold((TOPIC, 0))
    epoch = hold.epoch()
    position = stores[0].get_queue(TOPIC, 0)
    # While it holds the lease.
    stores[0].record_commit(TOPIC, 0, expected_version=position.version, max_offset=10, expected_epoch=epoch)
    time.sleep(1.7)
    # The successor's own lease may be long: what it takes over is the zombie's, expired. A short one would also
    # have PostgreSQL end any transaction of its store idle for 1 s, which a loaded machine can pause it for.
    LeaseManager(stores[1], owner="successor", lease_duration=30.0, renew_interval=10.0).round()
    position = stores[0].get_queue(TOPIC, 0)
    # The zombie has not noticed yet: it still believes it holds epoch 1; the database says 2.
    with pytest.raises(LeaseLostError, match="epoch 2"):
        stores[0].record_commit(TOPIC, 0, expected_version=position.version, max_offset=20, expected_epoch=hold.epoch())
    with pytest.raises(LeaseLostError):
        stores[2].record_commit(TOPIC, 0, expected_version=position.version, max_offset=20, expected_epoch=1)
    assert stores[2].get_queue(TOPIC, 0).max_offset == 10
    zombie.round()  # now it knows: its hold refuses before the database is even asked
    with pytest.raises(LeaseLostError, match="holds no lease"):
        stores[0].record_commit(TOPIC, 0, expected_version=position.version, max_offset=20, expected_epoch=hold.epoch())
    assert stores[2].get_queue(TOPIC, 0).max_offset == 10


def test_an_archiver_that_cannot_renew_stops_writing_before_its_lease_can_be_taken(stores: list[MetadataStore]) -> None:
    clock = FakeClock()
    archiver = LeaseManager(stores[0], owner="a", lease_duration=3.0, renew_interval=1.0, clock=clock)
    archiver.round()
    clock.now += 1.9
    assert archiver.holds((TOPIC, 0))
    clock.now += 0.2  # past lease_duration minus the safety margin (a third): no new batch may start
    assert not archiver.holds((TOPIC, 0))
    archiver.round()  # renewed (nobody took it): usable again, same epoch
    assert archiver.holds((TOPIC, 0)) and archiver.epoch_of(TOPIC, 0) == 1


@pytest.mark.postgres
def test_a_transaction_stalled_past_the_usable_lease_is_ended_by_postgresql(postgres_url: str) -> None:
    """A paused archiver's open transaction must not outlive the window in which it may use a lease."""
    upgrade(postgres_url)
    with MetadataStore(postgres_url) as store:
        LeaseManager(store, owner="a", lease_duration=3.0, renew_interval=1.0)
        with store.engine.connect() as connection:
            # lease_duration minus the safety margin: it has stopped writing by then anyway.
            assert connection.exec_driver_sql("SHOW idle_in_transaction_session_timeout").scalar() == "2s"


@pytest.mark.usefixtures("no_idle_transaction_limit")
def test_fair_shares_rebalance_when_archivers_join_and_leave(stores: list[MetadataStore]) -> None:
    a, b, c = (
        LeaseManager(s, owner=n, lease_duration=1.5, renew_interval=0.5) for s, n in zip(stores, "abc", strict=True)
    )
    a.round()
    assert len(a.held()) == QUEUES
    assert b.round().acquired == []  # b joined: share 3 each, but a still holds everything
    surplus = a.round().surplus
    assert len(surplus) == 3
    assert not any(a.holds(key) for key in surplus)  # being released: no new batches on them
    a.release(surplus)
    assert sorted(b.round().acquired) == sorted(surplus)
    c.round()
    for manager in (a, b):
        manager.release(manager.round().surplus)
    c.round()
    held = [set(m.held()) for m in (a, b, c)]
    assert [len(h) for h in held] == [2, 2, 2]
    assert set().union(*held) == {(TOPIC, q) for q in range(QUEUES)}
    # c leaves without a word (killed): once its heartbeat and leases expire, a and b share its queues.
    deadline = time.monotonic() + 2.5
    while time.monotonic() < deadline:  # a and b keep renewing (releasing any surplus) while c stays silent
        for manager in (a, b):
            manager.release(manager.round().surplus)
        time.sleep(0.3)
    assert len(a.held()) == len(b.held()) == 3
    assert {r.owner for r in stores[0].list_queues(TOPIC)} == {"a", "b"}


def test_close_hands_every_lease_back_at_once(stores: list[MetadataStore]) -> None:
    a = LeaseManager(stores[0], owner="a", lease_duration=3.0, renew_interval=1.0)
    a.round()
    a.close()
    assert {r.owner for r in stores[1].list_queues(TOPIC)} == {None}
    b = LeaseManager(stores[1], owner="b", lease_duration=3.0, renew_interval=1.0)
    assert len(b.round().acquired) == QUEUES  # a left the membership too: b's share is everything


def test_close_waits_for_a_round_in_flight_and_no_round_takes_a_lease_after_it(
    stores: list[MetadataStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    # At shutdown the dispatcher cancels its lease loop, but a round already running in its worker
    # thread goes on: it must not take leases back after close() handed them all back.
    archiver = LeaseManager(stores[0], owner="a", lease_duration=3.0, renew_interval=1.0)
    in_round, go_on = threading.Event(), threading.Event()
    acquire = stores[0].leases.acquire_leases

    def slow_acquire(*args: Any, **kwargs: Any) -> Any:
        in_round.set()
        go_on.wait(10)
        return acquire(*args, **kwargs)

    monkeypatch.setattr(stores[0].leases, "acquire_leases", slow_acquire)
    round_thread = threading.Thread(target=archiver.round)
    round_thread.start()
    assert in_round.wait(10)
    close_thread = threading.Thread(target=archiver.close)
    close_thread.start()
    close_thread.join(0.3)
    assert close_thread.is_alive(), "close() waits for the round in flight"
    go_on.set()
    round_thread.join(10)
    close_thread.join(10)
    assert {row.owner for row in stores[1].list_queues(TOPIC)} == {None}
    assert archiver.round() == LeaseChanges()  # closed: no heartbeat, nothing acquired
    assert {row.owner for row in stores[1].list_queues(TOPIC)} == {None}


def test_second_archiver_lock_on_one_sqlite_database_is_refused(tmp_path: Path) -> None:
    database = tmp_path / "metadata.db"
    first = SingleArchiverLock(database)
    first.acquire()
    with pytest.raises(ConfigError, match="already running") as refused:
        SingleArchiverLock(database).acquire()
    assert "\n" not in str(refused.value)
    first.release()
    SingleArchiverLock(database).acquire()  # free again once the first one is gone


def test_tieredstore_run_refuses_a_second_archiver_on_one_sqlite_database(tmp_path: Path) -> None:
    lock = SingleArchiverLock(tmp_path / "metadata.db")
    lock.acquire()
    try:
        result = subprocess.run(
            [*TIEREDSTORE, "--data-dir", str(tmp_path), "run", "--once", "--no-demo"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        lock.release()
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "already running on the SQLite metadata database" in lines[0]
    assert not (tmp_path / "hot").exists()  # refused before opening anything
