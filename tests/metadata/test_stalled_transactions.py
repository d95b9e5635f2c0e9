"""A process stalled in the middle of a metadata transaction cannot keep its queues from a peer's takeover.

Takeovers skip rows another transaction has locked (``FOR UPDATE SKIP LOCKED``), so a paused archiver
(SIGSTOP, a long GC, a frozen VM) whose open transaction had updated a queue row would keep that queue
until it resumed. ``limit_idle_transactions`` has PostgreSQL end such a transaction instead.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import event

from tieredstore.errors import LeaseLostError, MetadataError, ValidationError
from tieredstore.metadata import Membership, MetadataStore, QueueLease, SegmentUpdate, upgrade

TOPIC = "Stalled"
LEASE_MS = 500
LIMIT = 0.5
STALL = 3.0
SEGMENT = f"{TOPIC}/0/commitlog/0"


@pytest.fixture
def two_stores(postgres_url: str) -> Iterator[tuple[MetadataStore, MetadataStore]]:
    """The stores of two archiver processes on one PostgreSQL database."""
    upgrade(postgres_url)
    paused, peer = MetadataStore(postgres_url), MetadataStore(postgres_url)
    yield paused, peer
    paused.close()
    peer.close()


def _show_limit(store: MetadataStore) -> str:
    with store.engine.connect() as connection:
        return str(connection.exec_driver_sql("SHOW idle_in_transaction_session_timeout").scalar())


@pytest.mark.postgres
def test_a_stalled_commit_is_ended_and_its_queue_taken_over_before_the_stall_ends(
    two_stores: tuple[MetadataStore, MetadataStore],
) -> None:
    paused, peer = two_stores
    paused.get_or_create_queue(TOPIC, 0)
    [lease] = paused.leases.acquire_leases("a", ttl_ms=LEASE_MS, limit=1)
    paused.limit_idle_transactions(LIMIT)
    paused.add_segment(SEGMENT, "COMMIT_LOG", 0)
    inside = threading.Event()
    committer: list[int] = []

    def stall(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
        # The committing thread has just updated (and locked) the queue row; its process stops there.
        if threading.get_ident() in committer and statement.lstrip().upper().startswith("UPDATE QUEUES"):
            inside.set()
            time.sleep(STALL)

    event.listen(paused.engine, "after_cursor_execute", stall)
    errors: list[BaseException] = []

    def commit() -> None:
        committer.append(threading.get_ident())
        try:
            paused.record_commit(
                TOPIC,
                0,
                expected_version=0,
                max_offset=10,
                segments=[SegmentUpdate(SEGMENT, "COMMIT_LOG", 0, size=10)],
                expected_epoch=lease.epoch,
            )
        except BaseException as error:  # noqa: BLE001 - asserted below
            errors.append(error)

    worker = threading.Thread(target=commit)
    worker.start()
    assert inside.wait(10), errors
    stalled_at = time.monotonic()
    taken: list[QueueLease] = []
    while not taken and time.monotonic() - stalled_at < STALL + 2:
        taken = list(peer.leases.acquire_leases("b", ttl_ms=30_000, limit=1))
        time.sleep(0.05)
    took_over_after = time.monotonic() - stalled_at
    worker.join(timeout=STALL + 10)

    assert taken, "the peer never took the stalled archiver's queue over"
    # The lease ran out after 0.5 s and the server ended the stalled transaction 0.5 s into the stall:
    # the peer must not have waited for the stalled process to go on.
    assert took_over_after < STALL - 1, f"takeover took {took_over_after:.2f}s, the stall lasted {STALL}s"
    assert len(errors) == 1 and isinstance(errors[0], MetadataError), errors
    queue = peer.get_queue(TOPIC, 0)
    assert (queue.owner, queue.epoch, queue.max_offset, queue.version) == ("b", lease.epoch + 1, 0, 0)
    # The stalled process's store recovers (its dead connection is replaced) and is fenced off the queue.
    event.remove(paused.engine, "after_cursor_execute", stall)
    # The stall is over: from here a pause of this test process (a full garbage collection late in a
    # long pytest run) must not pass for one, so the limit goes up. Applying it at the next checkout
    # still meets the dead connection first.
    paused.limit_idle_transactions(30.0)
    assert [q.owner for q in paused.list_queues(TOPIC)] == ["b"]
    with pytest.raises(LeaseLostError):
        paused.record_commit(TOPIC, 0, expected_version=0, max_offset=10, expected_epoch=lease.epoch)


@pytest.mark.postgres
def test_the_limit_reaches_pooled_connections_and_can_be_lifted(
    two_stores: tuple[MetadataStore, MetadataStore],
) -> None:
    store, _ = two_stores
    default = _show_limit(store)  # also leaves a connection in the pool, made before the limit
    store.limit_idle_transactions(2.0)
    assert _show_limit(store) == "2s"
    store.limit_idle_transactions(None)
    assert _show_limit(store) == default


def test_a_limit_must_be_positive(store: MetadataStore) -> None:
    for seconds in (0.0, -1.0):
        with pytest.raises(ValidationError, match="must be positive"):
            store.limit_idle_transactions(seconds)


@pytest.mark.postgres
def test_a_heartbeat_does_not_wait_for_a_peer_holding_an_expired_archiver_row(
    two_stores: tuple[MetadataStore, MetadataStore],
) -> None:
    paused, peer = two_stores
    paused.leases.heartbeat_archiver("gone", hostname="h", pid=1, ttl_ms=1)
    time.sleep(0.05)
    holder = paused.engine.connect()
    holder.begin()
    # A paused archiver's transaction that had touched the expired row (say, deleting it itself).
    holder.exec_driver_sql("SELECT owner FROM archivers WHERE owner = 'gone' FOR UPDATE")
    memberships: list[Membership] = []
    worker = threading.Thread(
        target=lambda: memberships.append(peer.leases.heartbeat_archiver("b", hostname="h", pid=2, ttl_ms=3000))
    )
    started = time.monotonic()
    try:
        worker.start()
        worker.join(timeout=5)
        took = time.monotonic() - started
    finally:
        holder.close()  # rolls back, so that a heartbeat that did wait finishes before teardown
        worker.join(timeout=10)
    assert took < 2, f"the heartbeat waited {took:.2f}s for the peer's transaction"
    assert [(m.live_archivers, m.queues) for m in memberships] == [(1, 0)]
    peer.leases.heartbeat_archiver("b", hostname="h", pid=2, ttl_ms=3000)  # the row is free now: forgotten
    with peer.engine.connect() as connection:
        assert connection.exec_driver_sql("SELECT owner FROM archivers").scalars().all() == ["b"]
