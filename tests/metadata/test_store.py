"""MetadataStore behaviour, the same on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from tieredstore.errors import ConcurrentUpdateError, NotFoundError, ValidationError
from tieredstore.formats.naming import FileType
from tieredstore.metadata import (
    IndexFileStatus,
    MetadataStore,
    SegmentFileType,
    SegmentStatus,
    SegmentUpdate,
    TopicStatus,
)

QUEUE_PATH = "abcd1234_cluster/broker/TopicA/0"


def test_topic_is_created_once_with_default_retention(store: MetadataStore) -> None:
    first = store.get_or_create_topic("TopicA")
    again = store.get_or_create_topic("TopicA", reserve_hours=5)
    assert first == again
    assert first.reserve_hours == 72
    assert first.status is TopicStatus.ACTIVE
    assert store.get_or_create_topic("TopicB", reserve_hours=5).reserve_hours == 5
    assert [t.name for t in store.list_topics()] == ["TopicA", "TopicB"]


def test_set_retention_and_status(store: MetadataStore) -> None:
    store.get_or_create_topic("TopicA")
    assert store.set_retention("TopicA", 24).reserve_hours == 24
    assert store.get_topic("TopicA").reserve_hours == 24
    assert store.set_topic_status("TopicA", TopicStatus.DELETING).status is TopicStatus.DELETING
    with pytest.raises(ValidationError, match="reserve_hours"):
        store.set_retention("TopicA", 0)
    with pytest.raises(NotFoundError, match="Nope"):
        store.set_retention("Nope", 5)


def test_delete_topic_removes_its_queues(store: MetadataStore) -> None:
    store.get_or_create_queue("TopicA", 0)
    store.get_or_create_queue("TopicA", 1)
    store.get_or_create_queue("TopicB", 0)
    store.delete_topic("TopicA")
    with pytest.raises(NotFoundError):
        store.get_topic("TopicA")
    assert [(q.topic, q.queue_id) for q in store.list_queues()] == [("TopicB", 0)]
    with pytest.raises(NotFoundError):
        store.delete_topic("TopicA")


def test_queue_is_created_with_its_topic_at_the_start_offset(store: MetadataStore) -> None:
    queue = store.get_or_create_queue("TopicA", 2, start_offset=100)
    assert (queue.min_offset, queue.max_offset, queue.version) == (100, 100, 0)
    assert store.get_topic("TopicA").name == "TopicA"
    assert store.get_or_create_queue("TopicA", 2, start_offset=5) == queue
    with pytest.raises(NotFoundError, match="TopicA/3"):
        store.get_queue("TopicA", 3)
    with pytest.raises(ValidationError):
        store.get_or_create_queue("TopicA", -1)


def test_update_queue_checks_the_version_and_bumps_it(store: MetadataStore) -> None:
    queue = store.get_or_create_queue("TopicA", 0)
    updated = store.update_queue("TopicA", 0, expected_version=queue.version, max_offset=10)
    assert (updated.max_offset, updated.version) == (10, queue.version + 1)
    with pytest.raises(ConcurrentUpdateError, match="another writer"):
        store.update_queue("TopicA", 0, expected_version=queue.version, max_offset=20)
    assert store.get_queue("TopicA", 0).max_offset == 10  # the stale write changed nothing
    with pytest.raises(ValidationError, match="above"):
        store.update_queue("TopicA", 0, expected_version=updated.version, min_offset=30, max_offset=20)
    with pytest.raises(NotFoundError):
        store.update_queue("TopicA", 9, expected_version=0, max_offset=1)


def test_list_queues_of_one_topic_or_all(store: MetadataStore) -> None:
    for topic, queue_id in [("TopicB", 1), ("TopicA", 1), ("TopicA", 0)]:
        store.get_or_create_queue(topic, queue_id)
    assert [(q.topic, q.queue_id) for q in store.list_queues()] == [("TopicA", 0), ("TopicA", 1), ("TopicB", 1)]
    assert [q.queue_id for q in store.list_queues("TopicA")] == [0, 1]


def test_segments_life_cycle(store: MetadataStore) -> None:
    added = store.add_segment(QUEUE_PATH, FileType.COMMIT_LOG, 0, begin_timestamp=1000)
    assert (added.status, added.size, added.file_type) == (SegmentStatus.NEW, 0, SegmentFileType.COMMIT_LOG)
    store.add_segment(QUEUE_PATH, FileType.COMMIT_LOG, 4096)
    store.add_segment(QUEUE_PATH, FileType.CONSUME_QUEUE, 0)
    with pytest.raises(ValidationError, match="already exists"):
        store.add_segment(QUEUE_PATH, FileType.COMMIT_LOG, 0)
    sealed = store.update_segment(
        SegmentUpdate(
            QUEUE_PATH,
            FileType.COMMIT_LOG,
            0,
            size=4096,
            status=SegmentStatus.SEALED,
            end_timestamp=2000,
            sealed_timestamp=3000,
        )
    )
    assert (sealed.size, sealed.status, sealed.begin_timestamp, sealed.end_timestamp) == (
        4096,
        SegmentStatus.SEALED,
        1000,
        2000,
    )
    assert [s.base_offset for s in store.list_segments(QUEUE_PATH, FileType.COMMIT_LOG)] == [0, 4096]
    store.update_segment(SegmentUpdate(QUEUE_PATH, FileType.COMMIT_LOG, 0, status=SegmentStatus.DELETED))
    assert [s.base_offset for s in store.list_segments(QUEUE_PATH, FileType.COMMIT_LOG)] == [4096]
    assert [
        s.base_offset for s in store.list_segments(QUEUE_PATH, FileType.COMMIT_LOG, statuses=[SegmentStatus.DELETED])
    ] == [0]
    # A DELETED row does not block a new segment at the same offset.
    assert store.add_segment(QUEUE_PATH, FileType.COMMIT_LOG, 0).status is SegmentStatus.NEW
    with pytest.raises(ValidationError, match="file type"):
        store.add_segment(QUEUE_PATH, "BOGUS", 0)
    with pytest.raises(NotFoundError):
        store.update_segment(SegmentUpdate(QUEUE_PATH, FileType.INDEX, 0, size=1))


def test_list_all_segments_groups_by_file(store: MetadataStore) -> None:
    other = "abcd1234_cluster/broker/TopicA/1"
    store.add_segment(QUEUE_PATH, FileType.COMMIT_LOG, 100)
    store.add_segment(QUEUE_PATH, FileType.COMMIT_LOG, 0)
    store.add_segment(other, FileType.CONSUME_QUEUE, 0)
    grouped = store.list_all_segments()
    assert [s.base_offset for s in grouped[(QUEUE_PATH, SegmentFileType.COMMIT_LOG)]] == [0, 100]
    assert list(grouped) == [(QUEUE_PATH, SegmentFileType.COMMIT_LOG), (other, SegmentFileType.CONSUME_QUEUE)]
    assert list(store.list_all_segments(file_types=[FileType.CONSUME_QUEUE])) == [
        (other, SegmentFileType.CONSUME_QUEUE)
    ]


def test_a_queue_with_its_segments_is_what_get_queue_and_list_segments_give(store: MetadataStore) -> None:
    store.get_or_create_queue("TopicA", 0, start_offset=7)
    store.add_segment(QUEUE_PATH, FileType.COMMIT_LOG, 4096)
    store.add_segment(QUEUE_PATH, FileType.COMMIT_LOG, 0)
    store.add_segment(QUEUE_PATH, FileType.CONSUME_QUEUE, 0)
    store.add_segment(QUEUE_PATH, FileType.INDEX, 0)  # a file type not asked for
    store.add_segment("abcd1234_cluster/broker/TopicA/1", FileType.COMMIT_LOG, 0)  # another queue's
    store.add_segment(QUEUE_PATH, FileType.CONSUME_QUEUE, 2000)
    store.update_segment(SegmentUpdate(QUEUE_PATH, FileType.CONSUME_QUEUE, 2000, status=SegmentStatus.DELETED))
    types = (FileType.COMMIT_LOG.value, FileType.CONSUME_QUEUE.value)

    position, segments = store.get_queue_with_segments("TopicA", 0, QUEUE_PATH, types)

    assert position == store.get_queue("TopicA", 0)
    assert position.min_offset == 7
    assert segments == {name: store.list_segments(QUEUE_PATH, name) for name in types}
    assert [s.base_offset for s in segments[FileType.COMMIT_LOG.value]] == [0, 4096]
    assert [s.base_offset for s in segments[FileType.CONSUME_QUEUE.value]] == [0]  # the DELETED one left out
    with pytest.raises(NotFoundError, match="TopicA/5"):
        store.get_queue_with_segments("TopicA", 5, QUEUE_PATH, types)


def test_a_queue_whose_row_has_not_changed_is_not_read_again_with_its_segments(store: MetadataStore) -> None:
    """What a read-only view polling at a queue's end asks: anything since this position? One statement if not."""
    from sqlalchemy import event

    store.get_or_create_queue("TopicA", 0)
    store.add_segment(QUEUE_PATH, FileType.COMMIT_LOG, 0)
    types = (FileType.COMMIT_LOG.value, FileType.CONSUME_QUEUE.value)
    position, _segments = store.get_queue_with_segments("TopicA", 0, QUEUE_PATH, types)
    statements: list[str] = []
    event.listen(store.engine, "before_cursor_execute", lambda *args: statements.append(args[2]))

    assert store.get_queue_with_segments("TopicA", 0, QUEUE_PATH, types, unless=position) is None
    queries = [text for text in statements if text.lstrip().upper().startswith("SELECT")]
    assert len(queries) == 1 and "FROM queues" in queries[0], "the queue row only"

    store.update_queue("TopicA", 0, expected_version=position.version, max_offset=10)  # a commit
    changed = store.get_queue_with_segments("TopicA", 0, QUEUE_PATH, types, unless=position)
    assert changed is not None
    assert changed[0] == store.get_queue("TopicA", 0) and changed[0].max_offset == 10
    assert [s.base_offset for s in changed[1][FileType.COMMIT_LOG.value]] == [0]
    with pytest.raises(NotFoundError, match="TopicA/5"):
        store.get_queue_with_segments("TopicA", 5, QUEUE_PATH, types, unless=position)


def test_delete_segments_under_a_path_takes_only_that_subtree(store: MetadataStore) -> None:
    # '_' and '%' are legal in topic names and must not act as LIKE wildcards.
    store.add_segment("c/b/Topic_1/0", FileType.COMMIT_LOG, 0)
    store.add_segment("c/b/Topic_1/1", FileType.CONSUME_QUEUE, 0)
    store.add_segment("c/b/TopicX1/0", FileType.COMMIT_LOG, 0)
    store.add_segment("c/b/Topic_10/0", FileType.COMMIT_LOG, 0)
    assert store.delete_segments_under("c/b/Topic_1") == 2
    assert sorted(path for path, _ in store.list_all_segments()) == ["c/b/TopicX1/0", "c/b/Topic_10/0"]
    store.delete_segment("c/b/TopicX1/0", FileType.COMMIT_LOG, 0)
    assert sorted(path for path, _ in store.list_all_segments()) == ["c/b/Topic_10/0"]


def test_record_commit_moves_positions_and_segments_together(store: MetadataStore) -> None:
    queue = store.get_or_create_queue("TopicA", 0)
    store.add_segment(QUEUE_PATH, FileType.COMMIT_LOG, 0)
    store.add_segment(QUEUE_PATH, FileType.CONSUME_QUEUE, 0)
    done = store.record_commit(
        "TopicA",
        0,
        expected_version=queue.version,
        max_offset=3,
        segments=[
            SegmentUpdate(QUEUE_PATH, FileType.COMMIT_LOG, 0, size=300, end_timestamp=9),
            SegmentUpdate(QUEUE_PATH, FileType.CONSUME_QUEUE, 0, size=60, end_timestamp=9),
        ],
    )
    assert done.max_offset == 3
    assert store.get_segment(QUEUE_PATH, FileType.COMMIT_LOG, 0).size == 300
    # A commit naming a missing segment rolls back as a whole: the queue does not move either.
    with pytest.raises(NotFoundError):
        store.record_commit(
            "TopicA",
            0,
            expected_version=done.version,
            max_offset=4,
            segments=[SegmentUpdate(QUEUE_PATH, FileType.COMMIT_LOG, 999, size=1)],
        )
    assert store.get_queue("TopicA", 0) == done


def test_index_files_by_time_overlap(store: MetadataStore) -> None:
    store.add_index_file("idx-1", begin_timestamp=100)
    store.update_index_file("idx-1", end_timestamp=200, item_count=5, size=1000, status=IndexFileStatus.SEALED)
    store.add_index_file("idx-2", begin_timestamp=200)
    store.update_index_file("idx-2", end_timestamp=300)
    store.add_index_file("idx-empty")
    with pytest.raises(ValidationError, match="already exists"):
        store.add_index_file("idx-1")
    record = store.get_index_file("idx-1")
    assert (record.status, record.item_count, record.size) == (IndexFileStatus.SEALED, 5, 1000)
    names = lambda **kw: [f.name for f in store.list_index_files(**kw)]  # noqa: E731
    assert names(begin_timestamp=150, end_timestamp=160) == ["idx-1"]
    assert names(begin_timestamp=200, end_timestamp=200) == ["idx-1", "idx-2"]
    assert names(begin_timestamp=301) == []
    assert names(statuses=[IndexFileStatus.UNSEALED]) == ["idx-2", "idx-empty"]
    # A prefix is literal: '_' and '%' match themselves only (cluster folders contain '_').
    store.add_index_file("a_b/1")
    store.add_index_file("axb/2")
    store.add_index_file("a%b/3")
    assert names(prefix="a_b/") == ["a_b/1"]
    assert names(prefix="a%b/") == ["a%b/3"]
    assert names(prefix="idx-") == ["idx-1", "idx-2", "idx-empty"]
    store.delete_index_file("idx-1")
    with pytest.raises(NotFoundError):
        store.get_index_file("idx-1")
