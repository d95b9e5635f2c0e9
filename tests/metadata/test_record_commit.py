"""record_commit, the archiver's per-batch metadata write: its checks, its errors and its cost, on both engines."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import event

from tieredstore.errors import ConcurrentUpdateError, LeaseLostError, NotFoundError, ValidationError
from tieredstore.formats.naming import FileType
from tieredstore.metadata import MetadataStore, QueuePosition, SegmentStatus, SegmentUpdate

TOPIC = "TopicR"
PATH = "abcd1234_cluster/broker/TopicR/0"


@pytest.fixture
def queue(store: MetadataStore) -> QueuePosition:
    store.add_segment(PATH, FileType.COMMIT_LOG, 0, begin_timestamp=5)
    store.add_segment(PATH, FileType.CONSUME_QUEUE, 0, begin_timestamp=5)
    return store.get_or_create_queue(TOPIC, 0)


def _commit(store: MetadataStore, version: int, offset: int, **kwargs: Any) -> QueuePosition:
    return store.record_commit(
        TOPIC,
        0,
        expected_version=version,
        max_offset=offset,
        segments=[
            SegmentUpdate(PATH, FileType.COMMIT_LOG, 0, size=offset * 100, end_timestamp=offset),
            SegmentUpdate(PATH, FileType.CONSUME_QUEUE, 0, size=offset * 20, end_timestamp=offset),
        ],
        **kwargs,
    )


def _segment_sizes(store: MetadataStore) -> tuple[int, int]:
    return (
        store.get_segment(PATH, FileType.COMMIT_LOG, 0).size,
        store.get_segment(PATH, FileType.CONSUME_QUEUE, 0).size,
    )


def test_returns_the_row_as_stored_and_leaves_unnamed_columns(store: MetadataStore, queue: QueuePosition) -> None:
    done = _commit(store, queue.version, 7)
    assert done == store.get_queue(TOPIC, 0)
    assert (done.min_offset, done.max_offset, done.version) == (0, 7, queue.version + 1)
    assert _segment_sizes(store) == (700, 140)
    commit_log = store.get_segment(PATH, FileType.COMMIT_LOG, 0)
    # Columns the update leaves as None keep their values.
    assert (commit_log.status, commit_log.begin_timestamp, commit_log.end_timestamp) == (SegmentStatus.NEW, 5, 7)
    sealed = store.record_commit(
        TOPIC,
        0,
        expected_version=done.version,
        min_offset=2,
        segments=[SegmentUpdate(PATH, FileType.COMMIT_LOG, 0, status=SegmentStatus.SEALED, sealed_timestamp=9)],
    )
    assert (sealed.min_offset, sealed.max_offset) == (2, 7)
    commit_log = store.get_segment(PATH, FileType.COMMIT_LOG, 0)
    assert (commit_log.size, commit_log.status, commit_log.sealed_timestamp) == (700, SegmentStatus.SEALED, 9)


def test_a_stale_version_records_nothing(store: MetadataStore, queue: QueuePosition) -> None:
    done = _commit(store, queue.version, 3)
    with pytest.raises(ConcurrentUpdateError, match=f"{TOPIC}/0 is at version {done.version}, not {queue.version}"):
        _commit(store, queue.version, 4)
    assert store.get_queue(TOPIC, 0) == done
    assert _segment_sizes(store) == (300, 60)


def test_a_lost_lease_records_nothing(store: MetadataStore, queue: QueuePosition) -> None:
    [lease] = store.leases.acquire_leases("archiver-a", ttl_ms=60_000, limit=1)
    done = _commit(store, queue.version, 3, expected_epoch=lease.epoch)
    with pytest.raises(LeaseLostError, match=f"epoch {lease.epoch} \\(owner archiver-a\\), not {lease.epoch - 1}"):
        _commit(store, done.version, 4, expected_epoch=lease.epoch - 1)
    with pytest.raises(LeaseLostError):
        _commit(store, done.version, 4, expected_epoch=lease.epoch + 1)
    assert store.get_queue(TOPIC, 0) == done
    assert _segment_sizes(store) == (300, 60)
    assert _commit(store, done.version, 4, expected_epoch=lease.epoch).max_offset == 4


def test_unknown_topic_queue_or_segment_is_not_found(store: MetadataStore, queue: QueuePosition) -> None:
    with pytest.raises(NotFoundError, match="topic 'Nope'"):
        store.record_commit("Nope", 0, expected_version=0, max_offset=1)
    with pytest.raises(NotFoundError, match=f"queue {TOPIC}/5"):
        store.record_commit(TOPIC, 5, expected_version=0, max_offset=1)
    with pytest.raises(NotFoundError, match=f"segment {PATH}/CONSUME_QUEUE@64"):
        store.record_commit(
            TOPIC,
            0,
            expected_version=queue.version,
            max_offset=1,
            segments=[
                SegmentUpdate(PATH, FileType.COMMIT_LOG, 0, size=100),
                SegmentUpdate(PATH, FileType.CONSUME_QUEUE, 64, size=20),
            ],
        )
    # All or nothing: neither the queue nor the segment that exists moved.
    assert store.get_queue(TOPIC, 0) == queue
    assert _segment_sizes(store) == (0, 0)


def test_bad_values_are_refused_before_anything_is_written(store: MetadataStore, queue: QueuePosition) -> None:
    with pytest.raises(ValidationError, match="segment size -1"):
        store.record_commit(
            TOPIC,
            0,
            expected_version=queue.version,
            max_offset=1,
            segments=[SegmentUpdate(PATH, FileType.COMMIT_LOG, 0, size=-1)],
        )
    with pytest.raises(ValidationError, match="not a segment file type"):
        store.record_commit(
            TOPIC, 0, expected_version=queue.version, segments=[SegmentUpdate(PATH, "BOGUS", 0, size=1)]
        )
    assert store.get_queue(TOPIC, 0) == queue


def test_a_topic_created_again_is_not_confused_with_the_old_one(store: MetadataStore, queue: QueuePosition) -> None:
    _commit(store, queue.version, 3)
    store.delete_topic(TOPIC)
    store.get_or_create_topic(TOPIC)
    with pytest.raises(NotFoundError, match=f"queue {TOPIC}/0"):
        _commit(store, queue.version + 1, 4)
    again = store.get_or_create_queue(TOPIC, 0, start_offset=10)
    assert _commit(store, again.version, 11).max_offset == 11


@pytest.fixture
def statements(store: MetadataStore) -> Iterator[list[str]]:
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    event.listen(store.engine, "before_cursor_execute", record)
    yield seen
    event.remove(store.engine, "before_cursor_execute", record)


def test_one_statement_for_the_queue_and_one_per_segment(
    store: MetadataStore, queue: QueuePosition, statements: list[str]
) -> None:
    position = queue
    for offset in range(1, 4):
        statements.clear()
        position = _commit(store, position.version, offset, expected_epoch=0)
        # No SELECT and no ORM load: the queue UPDATE ... RETURNING, then each segment's UPDATE.
        work = [s for s in statements if not s.startswith("BEGIN")]
        assert [s.split()[0] for s in work] == ["UPDATE", "UPDATE", "UPDATE"]


def test_a_stale_epoch_is_refused_by_the_updates_row_count_and_changes_nothing(
    store: MetadataStore, queue: QueuePosition, statements: list[str]
) -> None:
    """A zombie archiver names the epoch it held before a peer took the queue over: the queue UPDATE,
    which requires that epoch, matches no row, so neither the row nor its segments change."""
    [first] = store.leases.acquire_leases("zombie", ttl_ms=1, limit=1)
    done = _commit(store, queue.version, 3, expected_epoch=first.epoch)
    time.sleep(0.01)  # the zombie's lease expires: a peer takes the queue over, bumping its epoch
    [taken] = store.leases.acquire_leases("successor", ttl_ms=60_000, limit=1)
    assert taken.epoch == first.epoch + 1
    taken_over = store.get_queue(TOPIC, 0)
    statements.clear()
    with pytest.raises(LeaseLostError, match=f"epoch {taken.epoch} \\(owner successor\\), not {first.epoch}"):
        _commit(store, taken_over.version, 4, expected_epoch=first.epoch)
    # The refusal is the queue UPDATE itself (no read of the epoch before it), and no segment UPDATE follows.
    work = [s.split()[0] for s in statements if not s.startswith("BEGIN")]
    assert work[0] == "UPDATE" and work.count("UPDATE") == 1
    assert store.get_queue(TOPIC, 0) == taken_over
    assert (taken_over.max_offset, taken_over.owner, taken_over.epoch) == (done.max_offset, "successor", taken.epoch)
    assert _segment_sizes(store) == (300, 60)


def test_sqlite_commits_are_durable_against_power_loss(sqlite_url: str) -> None:
    # WAL with synchronous=FULL syncs the log at every commit; NORMAL could lose the last commits.
    with MetadataStore.open(sqlite_url) as store, store.engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert connection.exec_driver_sql("PRAGMA synchronous").scalar() == 2
