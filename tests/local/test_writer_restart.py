"""A writer restarted after a crash in file creation: an empty or all-zero file is not yet created, not data."""

from __future__ import annotations

from pathlib import Path

import pytest
from structlog.testing import capture_logs

from tests.local.conftest import abandon, small_config
from tests.local.test_restore import TOPIC, produce, rebased
from tieredstore.errors import CorruptRecordError
from tieredstore.formats.consume_queue import UNIT_SIZE
from tieredstore.formats.message import decode
from tieredstore.formats.naming import hot_file_name
from tieredstore.local import LocalMessageStore, LocalStoreConfig
from tieredstore.local.mapped_file import MappedFile

CQ_FILE_SIZE = 10 * UNIT_SIZE


def crashed_store(path: Path, config: LocalStoreConfig, count: int, body_size: int = 100) -> list[bytes]:
    """A store holding ``count`` messages of queue 0, abandoned the way a crash would; returns the bodies."""
    store = LocalMessageStore(path, config=config)
    bodies = [bytes([65 + index % 26]) * body_size for index in range(count)]
    for body in bodies:
        store.put_message(TOPIC, 0, body, tags="t")
    store.flush()
    abandon(store)
    return bodies


def bodies_of(store: LocalMessageStore, queue_id: int = 0, topic: str = TOPIC) -> list[bytes]:
    start = store.min_offset(topic, queue_id)
    messages = store.read_messages(topic, queue_id, start, max_count=1000, max_bytes=1 << 30)
    assert [m.queue_offset for m in messages] == list(range(start, start + len(messages)))
    return [decode(m.raw).body for m in messages]


def sized_warnings(logs: list[dict[str, object]]) -> list[str]:
    return [str(entry["path"]) for entry in logs if entry["event"] == "sized a store file a crash left short"]


def test_an_empty_next_commit_log_file_is_sized_and_written(tmp_path: Path) -> None:
    config = small_config()
    bodies = crashed_store(tmp_path, config, 3, body_size=10_000)
    empty = tmp_path / "commitlog" / hot_file_name(64 << 10)
    empty.touch()  # killed between O_CREAT and ftruncate
    with capture_logs() as logs, LocalMessageStore(tmp_path, config=config) as store:
        for index in range(10):
            body = b"y" * 10_000 + bytes([index])
            assert store.put_message(TOPIC, 0, body).queue_offset == 3 + index
            bodies.append(body)
        assert bodies_of(store) == bodies
    assert sized_warnings(logs) == [str(empty)]
    assert empty.stat().st_size == config.commit_log_file_size
    with LocalMessageStore(tmp_path, config=config) as reopened:
        assert bodies_of(reopened) == bodies


def test_an_empty_first_commit_log_file_is_sized_and_written(tmp_path: Path) -> None:
    config = small_config()
    (tmp_path / "commitlog").mkdir(parents=True)
    (tmp_path / "commitlog" / hot_file_name(0)).touch()
    with capture_logs() as logs, LocalMessageStore(tmp_path, config=config) as store:
        assert store.put_message(TOPIC, 0, b"first").commitlog_offset == 0
        assert bodies_of(store) == [b"first"]
    assert len(sized_warnings(logs)) == 1


def test_an_empty_next_consume_queue_file_is_sized_and_written(tmp_path: Path) -> None:
    config = small_config()
    bodies = crashed_store(tmp_path, config, 10)
    empty = tmp_path / "consumequeue" / TOPIC / "0" / hot_file_name(CQ_FILE_SIZE)
    empty.touch()
    with capture_logs() as logs, LocalMessageStore(tmp_path, config=config) as store:
        for index in range(15):
            assert store.put_message(TOPIC, 0, b"z%d" % index).queue_offset == 10 + index
            bodies.append(b"z%d" % index)
        assert bodies_of(store) == bodies
        assert store.min_offset(TOPIC, 0) == 0
    assert sized_warnings(logs) == [str(empty)]
    assert empty.stat().st_size == CQ_FILE_SIZE


def test_an_empty_first_consume_queue_file_is_sized_and_written(tmp_path: Path) -> None:
    config = small_config()
    bodies = crashed_store(tmp_path, config, 2)
    directory = tmp_path / "consumequeue" / "Other" / "3"
    directory.mkdir(parents=True)
    (directory / hot_file_name(0)).touch()
    with capture_logs() as logs, LocalMessageStore(tmp_path, config=config) as store:
        assert store.put_message("Other", 3, b"other").queue_offset == 0
        assert store.put_message(TOPIC, 0, b"more").queue_offset == 2
        assert bodies_of(store, 3, "Other") == [b"other"]
        assert bodies_of(store) == [*bodies, b"more"]
    assert sized_warnings(logs) == [str(directory / hot_file_name(0))]


def test_a_short_consume_queue_file_holding_data_is_corrupt_and_kept(tmp_path: Path) -> None:
    config = small_config()
    crashed_store(tmp_path, config, 10)
    short = tmp_path / "consumequeue" / TOPIC / "0" / hot_file_name(CQ_FILE_SIZE)
    short.write_bytes(b"\x00\x00\x07data")
    with LocalMessageStore(tmp_path, config=config) as store:
        with pytest.raises(CorruptRecordError, match="holds data but has 7 bytes") as caught:
            store.put_message(TOPIC, 0, b"w")
        assert str(short) in str(caught.value)
        assert store.max_offset(TOPIC, 0) == 10
    assert short.read_bytes() == b"\x00\x00\x07data"


@pytest.mark.parametrize(
    "found",
    [b"", bytes(100), b"\x00" * 99 + b"\x01", bytes(1 << 21) + b"\x01"],
    ids=["empty", "zeros", "data-at-end", "data-past-the-first-chunk"],
)
def test_create_or_resume_sizes_only_a_short_file_of_zeros(tmp_path: Path, found: bytes) -> None:
    path = tmp_path / hot_file_name(4096)
    path.write_bytes(found)
    size = 3 << 20
    if any(found):
        with pytest.raises(CorruptRecordError, match=f"offset 4096 holds data but has {len(found)} bytes"):
            MappedFile.create_or_resume(path, 4096, size)
        assert path.read_bytes() == found
        return
    file = MappedFile.create_or_resume(path, 4096, size)
    try:
        assert (file.start_offset, file.size, file.end_offset) == (4096, size, 4096 + size)
        file.write(0, b"abc")
        file.flush()
    finally:
        file.close()
    assert path.read_bytes()[:4] == b"abc\x00"
    assert path.stat().st_size == size


def test_create_or_resume_creates_and_keeps_a_full_file(tmp_path: Path) -> None:
    path = tmp_path / hot_file_name(0)
    file = MappedFile.create_or_resume(path, 0, 1000)
    file.write(10, b"kept")
    file.close()
    again = MappedFile.create_or_resume(path, 0, 1000)
    try:
        assert again.read(10, 4) == b"kept"
        assert again.size == 1000
    finally:
        again.close()


@pytest.mark.parametrize("files", [1, 2])
@pytest.mark.parametrize("crash", [True, False])
def test_consume_queue_files_with_no_unit_yet_start_the_queue_at_zero(tmp_path: Path, files: int, crash: bool) -> None:
    """Sized but never written (a batch crossing a file boundary creates two): the queue is empty at 0."""
    config = small_config()
    bodies = crashed_store(tmp_path, config, 2)
    if not crash:
        LocalMessageStore(tmp_path, config=config).close()  # a clean checkpoint this time
    directory = tmp_path / "consumequeue" / "Other" / "0"
    directory.mkdir(parents=True)
    for index in range(files):
        (directory / hot_file_name(index * CQ_FILE_SIZE)).write_bytes(bytes(CQ_FILE_SIZE))
    with LocalMessageStore(tmp_path, config=config) as store:
        assert (store.min_offset("Other", 0), store.max_offset("Other", 0)) == (0, 0)
        assert store.put_message("Other", 0, b"first").queue_offset == 0
        assert store.put_message("Other", 0, b"second").queue_offset == 1
        assert store.min_offset("Other", 0) == 0
        assert bodies_of(store, 0, "Other") == [b"first", b"second"]
        assert bodies_of(store) == bodies
    with LocalMessageStore(tmp_path, config=config) as reopened:
        assert (reopened.min_offset("Other", 0), reopened.max_offset("Other", 0)) == (0, 2)
        assert bodies_of(reopened, 0, "Other") == [b"first", b"second"]


@pytest.mark.parametrize("crash", [True, False])
@pytest.mark.parametrize("count", [2, 5], ids=["within-one-file", "across-files"])
def test_a_restored_queue_starting_mid_file_keeps_its_bounds(tmp_path: Path, crash: bool, count: int) -> None:
    """A queue restored from offset 37: slots 0-6 of its first file stay zeros, its units follow."""
    config = small_config()
    records = rebased(produce(tmp_path / "source", config, count), 37)
    target = LocalMessageStore(tmp_path / "target", config=config)
    target.restore_messages(TOPIC, 0, records)
    assert (target.min_offset(TOPIC, 0), target.max_offset(TOPIC, 0)) == (37, 37 + count)
    if crash:
        abandon(target)
    else:
        target.close()
    with LocalMessageStore(tmp_path / "target", config=config) as reopened:
        assert (reopened.min_offset(TOPIC, 0), reopened.max_offset(TOPIC, 0)) == (37, 37 + count)
        assert [m.raw for m in reopened.read_messages(TOPIC, 0, 37, max_count=10)] == records
        assert reopened.put_message(TOPIC, 0, b"next").queue_offset == 37 + count
