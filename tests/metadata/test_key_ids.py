"""Which key wraps each segment and index file: recorded with the row, counted and found per key id, on both engines."""

from __future__ import annotations

from tieredstore.formats.naming import FileType
from tieredstore.metadata import IndexFileStatus, MetadataStore, SegmentStatus, SegmentUpdate

QUEUE_PATH = "c/b/Orders/0"


def test_a_segment_records_its_key_id_from_the_start_and_keeps_it_through_its_life(store: MetadataStore) -> None:
    assert store.add_segment(QUEUE_PATH, FileType.COMMIT_LOG, 0, key_id="k1").key_id == "k1"
    assert store.add_segment(QUEUE_PATH, FileType.CONSUME_QUEUE, 0).key_id is None  # written unencrypted
    sealed = store.update_segment(
        SegmentUpdate(QUEUE_PATH, FileType.COMMIT_LOG, 0, size=10, status=SegmentStatus.SEALED)
    )
    assert (sealed.key_id, sealed.size) == ("k1", 10)  # an update that does not name it leaves it
    rewrapped = store.update_segment(SegmentUpdate(QUEUE_PATH, FileType.COMMIT_LOG, 0, key_id="k2"))
    assert (rewrapped.key_id, rewrapped.status) == ("k2", SegmentStatus.SEALED)
    assert store.list_segments(QUEUE_PATH, FileType.COMMIT_LOG)[0].key_id == "k2"


def test_live_segments_are_counted_and_found_by_key_and_deleted_ones_are_not(store: MetadataStore) -> None:
    for base_offset, key_id in ((0, "k1"), (100, "k1"), (200, "k2"), (300, None)):
        store.add_segment(QUEUE_PATH, FileType.COMMIT_LOG, base_offset, key_id=key_id)
    store.add_segment("c/b/Orders/1", FileType.CONSUME_QUEUE, 0, key_id="k3")
    store.update_segment(SegmentUpdate(QUEUE_PATH, FileType.COMMIT_LOG, 0, status=SegmentStatus.DELETED))
    assert store.count_segments_by_key() == {"k1": 1, "k2": 1, "k3": 1}
    outside = store.list_segments_wrapped_outside(["k2"])
    assert [(row.path, row.base_offset, row.key_id) for row in outside] == [
        ("c/b/Orders/0", 100, "k1"),
        ("c/b/Orders/1", 0, "k3"),
    ]
    assert [row.key_id for row in store.list_segments_wrapped_outside([])] == ["k1", "k2", "k3"]
    assert store.list_segments_wrapped_outside(["k1", "k2", "k3"]) == []


def test_an_index_file_records_the_key_its_upload_was_wrapped_by(store: MetadataStore) -> None:
    assert store.add_index_file("c/b/rmq_sys_INDEX/0/00000000000000000001").key_id is None
    uploaded = store.update_index_file(
        "c/b/rmq_sys_INDEX/0/00000000000000000001", status=IndexFileStatus.UPLOAD, size=99, key_id="k1"
    )
    assert uploaded.key_id == "k1"
    again = store.update_index_file("c/b/rmq_sys_INDEX/0/00000000000000000001", item_count=3)
    assert (again.key_id, again.item_count) == ("k1", 3)
    assert [row.key_id for row in store.list_index_files(statuses=[IndexFileStatus.UPLOAD])] == ["k1"]
