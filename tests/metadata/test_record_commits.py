"""record_commits: several queues' commits in one transaction, each with its own checks and result, on both engines."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import pytest
from sqlalchemy import Connection, event, text

from tieredstore.errors import ConcurrentUpdateError, LeaseLostError, NotFoundError, ValidationError
from tieredstore.formats.naming import FileType
from tieredstore.metadata import CommitRecord, MetadataStore, QueuePosition, SegmentUpdate, upgrade

TOPIC = "TopicB"
QUEUES = 6


def _path(queue_id: int) -> str:
    return f"abcd1234_cluster/broker/{TOPIC}/{queue_id}"


@pytest.fixture
def queues(store: MetadataStore) -> list[QueuePosition]:
    for queue_id in range(QUEUES):
        store.add_segment(_path(queue_id), FileType.COMMIT_LOG, 0, begin_timestamp=5)
        store.add_segment(_path(queue_id), FileType.CONSUME_QUEUE, 0, begin_timestamp=5)
    return [store.get_or_create_queue(TOPIC, queue_id) for queue_id in range(QUEUES)]


@pytest.fixture
def transactions(store: MetadataStore) -> Iterator[list[object]]:
    """One entry per transaction committed on the store's engine (reads included)."""
    seen: list[object] = []

    def count(connection: object) -> None:
        seen.append(connection)

    event.listen(store.engine, "commit", count)
    yield seen
    event.remove(store.engine, "commit", count)


def _commit(
    position: QueuePosition, offset: int, *, min_offset: int | None = None, expected_epoch: int | None = None
) -> CommitRecord:
    path = _path(position.queue_id)
    segments = (
        SegmentUpdate(path, FileType.COMMIT_LOG, 0, size=offset * 100, end_timestamp=offset),
        SegmentUpdate(path, FileType.CONSUME_QUEUE, 0, size=offset * 20, end_timestamp=offset),
    )
    return CommitRecord(
        position.topic,
        position.queue_id,
        expected_version=position.version,
        min_offset=min_offset,
        max_offset=offset,
        segments=segments,
        expected_epoch=expected_epoch,
    )


def _sizes(store: MetadataStore, queue_id: int) -> tuple[int, int]:
    return (
        store.get_segment(_path(queue_id), FileType.COMMIT_LOG, 0).size,
        store.get_segment(_path(queue_id), FileType.CONSUME_QUEUE, 0).size,
    )


def test_a_batch_is_one_transaction_and_records_every_queue(
    store: MetadataStore, queues: list[QueuePosition], transactions: list[object]
) -> None:
    results = store.record_commits([_commit(position, 10 + position.queue_id) for position in queues])
    assert len(transactions) == 1
    assert results == [store.get_queue(TOPIC, position.queue_id) for position in queues]
    for position, result in zip(queues, results, strict=True):
        assert isinstance(result, QueuePosition)
        assert (result.max_offset, result.version) == (10 + position.queue_id, position.version + 1)
        assert _sizes(store, position.queue_id) == ((10 + position.queue_id) * 100, (10 + position.queue_id) * 20)


def test_a_stale_epoch_is_refused_alone_and_the_others_are_recorded(
    store: MetadataStore, queues: list[QueuePosition], transactions: list[object]
) -> None:
    [lease] = store.leases.acquire_leases("archiver-a", ttl_ms=60_000, limit=1)
    leased = store.get_queue(*lease.key)
    others = [position for position in queues if position.queue_id != leased.queue_id]
    batch = [_commit(leased, 7, expected_epoch=lease.epoch - 1)] + [_commit(p, 9) for p in others]
    transactions.clear()
    results = store.record_commits(batch)
    assert len(transactions) == 1
    assert isinstance(results[0], LeaseLostError)
    assert f"epoch {lease.epoch} (owner archiver-a), not {lease.epoch - 1}" in str(results[0])
    assert store.get_queue(*lease.key) == leased
    assert _sizes(store, leased.queue_id) == (0, 0)
    for position, result in zip(others, results[1:], strict=True):
        assert isinstance(result, QueuePosition) and result.max_offset == 9
        assert store.get_queue(TOPIC, position.queue_id) == result
        assert _sizes(store, position.queue_id) == (900, 180)


def test_each_refusal_is_the_error_record_commit_raises_and_undoes_only_its_own_commit(
    store: MetadataStore, queues: list[QueuePosition]
) -> None:
    first, stale, missing_segment, bad_value, _, last = queues
    store.record_commit(TOPIC, stale.queue_id, expected_version=stale.version, max_offset=1)
    # Its queue row matches, then its second segment does not exist: the savepoint undoes the queue row too.
    commit_log, _ = _commit(missing_segment, 4).segments
    no_such_segment = SegmentUpdate(_path(missing_segment.queue_id), FileType.CONSUME_QUEUE, 64, size=20)
    missing = CommitRecord(
        TOPIC,
        missing_segment.queue_id,
        expected_version=missing_segment.version,
        max_offset=4,
        segments=(commit_log, no_such_segment),
    )
    results = store.record_commits(
        [
            _commit(last, 3),
            _commit(stale, 3),
            missing,
            _commit(bad_value, 5, min_offset=6),
            CommitRecord(TOPIC, 99, expected_version=0, max_offset=1),
            _commit(first, 2),
        ]
    )
    assert isinstance(results[0], QueuePosition) and results[0].max_offset == 3
    assert isinstance(results[1], ConcurrentUpdateError)
    assert isinstance(results[2], NotFoundError) and "CONSUME_QUEUE@64" in str(results[2])
    assert isinstance(results[3], ValidationError) and "min offset 6 is above max offset 5" in str(results[3])
    assert isinstance(results[4], NotFoundError) and f"queue {TOPIC}/99" in str(results[4])
    assert isinstance(results[5], QueuePosition) and results[5].max_offset == 2
    assert store.get_queue(TOPIC, missing_segment.queue_id) == missing_segment
    assert _sizes(store, missing_segment.queue_id) == (0, 0)
    assert store.get_queue(TOPIC, bad_value.queue_id) == bad_value
    assert (_sizes(store, first.queue_id), _sizes(store, last.queue_id)) == ((200, 40), (300, 60))


def test_a_batch_of_one_is_record_commit(
    store: MetadataStore, queues: list[QueuePosition], transactions: list[object]
) -> None:
    [done] = store.record_commits([_commit(queues[0], 5)])
    assert len(transactions) == 1
    assert done == store.get_queue(TOPIC, 0)
    with pytest.raises(ConcurrentUpdateError):
        store.record_commit(TOPIC, 0, expected_version=queues[0].version, max_offset=6)
    assert store.record_commits([]) == []


@pytest.mark.postgres
def test_a_lease_renewal_beside_a_batch_waits_for_it_instead_of_deadlocking(postgres_url: str) -> None:
    """A batch holds the queue rows it has written until it commits; a renewal of the same owner's leases
    must not take rows the batch has yet to write while it waits for one the batch holds."""
    upgrade(postgres_url)
    with MetadataStore(postgres_url) as store:
        for queue_id in range(QUEUES):
            store.get_or_create_queue(TOPIC, queue_id)
        store.leases.acquire_leases("archiver-a", ttl_ms=60_000, limit=QUEUES)
        # Queue 0 taken again last, so an update of the owner's rows by the owner index meets it last.
        store.leases.release_leases("archiver-a", [(TOPIC, 0)])
        assert [lease.queue_id for lease in store.leases.acquire_leases("archiver-a", ttl_ms=60_000, limit=1)] == [0]
        # The pool is left last: a failure rolls the batch back before the pool waits for the renewal.
        with ThreadPoolExecutor(1) as pool, store.engine.connect() as batch, store.engine.connect() as watcher:
            watcher = watcher.execution_options(isolation_level="AUTOCOMMIT")
            with batch.begin() as transaction:
                batch.exec_driver_sql("SET LOCAL lock_timeout = '20s'")
                # The batch has written queue 0 (first in its order) and has the last queue still to write.
                batch.execute(text("UPDATE queues SET updated = updated WHERE queue_id = 0"))
                renewal = pool.submit(store.leases.renew_leases, "archiver-a", ttl_ms=60_000)
                _wait_until_blocked(watcher, renewal)
                batch.execute(text(f"UPDATE queues SET updated = updated WHERE queue_id = {QUEUES - 1}"))
                transaction.commit()
            assert len(renewal.result(timeout=30)) == QUEUES


def _wait_until_blocked(connection: Connection, renewal: Future[object]) -> None:
    """Until another session of this database waits on a row lock (the renewal, waiting for the batch)."""
    deadline = time.monotonic() + 20
    query = text(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
    )
    while not connection.execute(query).scalar():
        assert not renewal.done() and time.monotonic() < deadline, "the renewal never waited for the batch"
