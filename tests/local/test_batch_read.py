"""read_batch: the archiver's batch read of one hot queue, from the writer's store and from a follower.

It must serve exactly what ``read_messages`` serves (records, units, store timestamps; max_count,
max_bytes and first-always), refuse a corrupt record with a CorruptRecordError naming the queue
offset, and turn a file that retention removed under it into NotFoundError, never a crash.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tieredstore.errors import CorruptRecordError, NotFoundError
from tieredstore.formats.message import POS_BORN_HOST, POS_MAGIC, POS_QUEUE_OFFSET, store_timestamp_of
from tieredstore.local import LocalMessageStore
from tieredstore.local import batch as batch_module
from tieredstore.local.batch import HotBatch
from tieredstore.local.follower import HotStoreFollower
from tieredstore.local.store import PutRequest, StoredMessage

from .conftest import mapped_rss, small_config

TOPIC = "batch"
QUEUES = 3
MESSAGES = 240


def fill(directory: Path) -> None:
    """Records of varying size over three queues, some tagged, some keyed: they cross many hot files."""
    with LocalMessageStore(directory, config=small_config()) as store:
        store.put_messages(
            PutRequest(
                TOPIC,
                n % QUEUES,
                bytes([n % 251]) * (60 + n * 7 % 900),
                keys=(f"k{n}",) if n % 4 == 0 else (),
                tags=f"tag{n % 5}" if n % 3 == 0 else None,
            )
            for n in range(MESSAGES)
        )


@contextmanager
def opened(directory: Path, kind: str) -> Iterator[LocalMessageStore]:
    store: LocalMessageStore
    if kind == "writer":
        store = LocalMessageStore(directory, config=small_config())
    else:
        store = HotStoreFollower(directory, config=small_config(), refresh_interval=0.0)
    try:
        yield store
    finally:
        store.close()


def same(batch: HotBatch, messages: list[StoredMessage]) -> None:
    assert len(batch) == len(messages)
    assert batch.first_offset == (messages[0].queue_offset if messages else batch.first_offset)
    assert bytes(batch.data) == b"".join(m.raw for m in messages)
    assert [batch.record(i) for i in range(len(batch))] == [m.raw for m in messages]
    assert batch.units.tolist() == [(m.unit.commitlog_offset, m.unit.size, m.unit.tag_hash) for m in messages]
    assert batch.store_timestamps.tolist() == [store_timestamp_of(m.raw) for m in messages]


@pytest.mark.parametrize("unmap", [False, True], ids=["mapped", "unmapping"])
@pytest.mark.parametrize("kind", ["writer", "follower"])
@pytest.mark.parametrize(
    ("start", "max_count", "max_bytes"),
    [(0, 1000, 1 << 30), (5, 17, 1 << 30), (3, 1000, 2500), (7, 1000, 1), (79, 10, 1 << 20), (80, 10, 1 << 20)],
    ids=["all", "count", "bytes", "first-always", "last", "at-end"],
)
def test_a_batch_is_what_read_messages_serves(
    tmp_path: Path, kind: str, start: int, max_count: int, max_bytes: int, unmap: bool
) -> None:
    fill(tmp_path)
    with opened(tmp_path, kind) as store:
        for queue_id in range(QUEUES):
            messages = store.read_messages(TOPIC, queue_id, start, max_count, max_bytes)
            batch = store.read_batch(TOPIC, queue_id, start, max_count, max_bytes, unmap=unmap)
            same(batch, messages)
            assert batch.next_offset == start + len(messages)
    if max_bytes == 1:
        assert len(messages) == 1  # the first message comes however large


@pytest.mark.parametrize("kind", ["writer", "follower"])
def test_a_batch_below_the_min_offset_or_of_an_unknown_queue(tmp_path: Path, kind: str) -> None:
    fill(tmp_path)
    with opened(tmp_path, kind) as store:
        assert len(store.read_batch(TOPIC, 7, 0)) == 0
        assert len(store.read_batch("nothing-here", 0, 0)) == 0
        if kind == "writer":
            store.put_messages([PutRequest("late", 0, b"x")])
            store._queues[("late", 0)].min_offset = 1  # as hot retention leaves a queue
            with pytest.raises(NotFoundError, match="below the hot store's min offset"):
                store.read_batch("late", 0, 0)


def record_position(directory: Path, queue_id: int, queue_offset: int) -> tuple[Path, int]:
    """The commit-log file and position in it of a record."""
    with LocalMessageStore(directory, config=small_config(), read_only=True) as store:
        unit = store.cq_unit(TOPIC, queue_id, queue_offset)
    files = sorted((directory / "commitlog").iterdir())
    starts = [int(path.name) for path in files]
    index = max(i for i, start in enumerate(starts) if start <= unit.commitlog_offset)
    return files[index], unit.commitlog_offset - starts[index]


def overwrite(path: Path, position: int, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, data, position)
    finally:
        os.close(fd)


@pytest.mark.parametrize("kind", ["writer", "follower"])
def test_a_record_whose_magic_changed_is_refused_naming_its_offset(tmp_path: Path, kind: str) -> None:
    fill(tmp_path)
    path, position = record_position(tmp_path, 1, 6)
    with opened(tmp_path, kind) as store:
        assert len(store.read_batch(TOPIC, 1, 0, 100, 1 << 30)) == MESSAGES // QUEUES
        overwrite(path, position + POS_MAGIC, b"\xde\xad\xbe\xef")
        with pytest.raises(CorruptRecordError, match=f"{TOPIC}/1 offset 6") as caught:
            store.read_batch(TOPIC, 1, 0, 100, 1 << 30)
        assert caught.value.location == "commitlog"
        # Records before the damaged one are still served on their own.
        assert len(store.read_batch(TOPIC, 1, 0, 6, 1 << 30)) == 6


@pytest.mark.parametrize(
    ("where", "data", "problem"),
    [
        (POS_QUEUE_OFFSET, (999).to_bytes(8, "big"), "offset 999"),
        (-1, b"\x00", "do not end in 0x02"),
        (POS_BORN_HOST + 36, b"\x7f", "body length"),  # IPv4 hosts: BODYLEN is at 84, the body at 88
        (POS_BORN_HOST + 40, b"\xff", "body CRC"),
    ],
    ids=["queue-offset", "properties-tail", "body-length", "body"],
)
def test_a_follower_refuses_a_record_that_changed_after_it_was_checked(
    tmp_path: Path, where: int, data: bytes, problem: str
) -> None:
    fill(tmp_path)
    path, position = record_position(tmp_path, 2, 6)  # message 20: it has properties (a key)
    with opened(tmp_path, "follower") as follower:
        size = follower.cq_unit(TOPIC, 2, 6).size
        assert len(follower.read_batch(TOPIC, 2, 0, 100, 1 << 30)) == MESSAGES // QUEUES
        overwrite(path, position + (where if where >= 0 else size + where), data)
        with pytest.raises(CorruptRecordError, match=f"{TOPIC}/2 offset 6 changed after it was checked") as caught:
            follower.read_batch(TOPIC, 2, 0, 100, 1 << 30)
        assert caught.match(problem)


def test_the_writer_turns_a_file_retention_just_unmapped_into_not_found(tmp_path: Path) -> None:
    fill(tmp_path)
    with opened(tmp_path, "writer") as store:
        first = store._commit_log.files[0]
        first.close()  # what retention does to a file while a read runs in another thread
        with pytest.raises(NotFoundError):
            store.read_batch(TOPIC, 0, 0, 100, 1 << 30)


def test_a_follower_sees_retention_as_not_found_then_serves_from_the_new_min(tmp_path: Path) -> None:
    fill(tmp_path)
    with opened(tmp_path, "follower") as follower:
        assert follower.read_batch(TOPIC, 0, 0, 100, 1 << 30).first_offset == 0
        oldest = sorted((tmp_path / "commitlog").iterdir())[0]
        oldest.unlink()  # the writer's retention deleted the oldest commit-log file
        with pytest.raises(NotFoundError):  # relisted at once (refresh_interval 0)
            follower.read_batch(TOPIC, 0, 0, 100, 1 << 30)
        new_min = follower.min_offset(TOPIC, 0)
        assert new_min > 0
        batch = follower.read_batch(TOPIC, 0, new_min, 100, 1 << 30)
        same(batch, follower.read_messages(TOPIC, 0, new_min, 100, 1 << 30))
        assert len(batch) == MESSAGES // QUEUES - new_min


@pytest.mark.parametrize("kind", ["writer", "follower"])
def test_records_back_to_back_in_the_commit_log_are_served_whole(tmp_path: Path, kind: str) -> None:
    """A producer's batch to one queue lies back to back (copied as one run) up to where a file ends."""
    with LocalMessageStore(tmp_path, config=small_config()) as store:
        store.put_messages(PutRequest(TOPIC, 0, bytes([n]) * (300 + n * 11)) for n in range(150))
        store.put_messages([PutRequest(TOPIC, 1, b"between"), PutRequest(TOPIC, 0, b"after")])
    with opened(tmp_path, kind) as store:
        assert len({int(path.name) for path in (tmp_path / "commitlog").iterdir()}) > 2
        for start, count in ((0, 1000), (37, 60), (149, 5)):
            same(
                store.read_batch(TOPIC, 0, start, count, 1 << 30), store.read_messages(TOPIC, 0, start, count, 1 << 30)
            )


def test_a_follower_refuses_a_record_whose_tags_no_longer_match_its_unit(tmp_path: Path) -> None:
    fill(tmp_path)
    path, position = record_position(tmp_path, 0, 1)  # message 3: TAGS tag3
    with opened(tmp_path, "follower") as follower:
        raw = follower.read_messages(TOPIC, 0, 1, 1)[0].raw
        overwrite(path, position + raw.index(b"TAGS\x01tag3") + 8, b"9")
        with pytest.raises(CorruptRecordError, match="offset 1 changed after it was checked: unit tag hash"):
            follower.read_batch(TOPIC, 0, 0, 100, 1 << 30)
        assert len(follower.read_batch(TOPIC, 0, 0, 1, 1 << 30)) == 1


@pytest.mark.parametrize("kind", ["writer", "follower"])
def test_an_unmapping_batch_read_holds_only_a_step_of_the_commit_log_mapped(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One queue among four interleaved: its 3.2 MiB of records are spread over 12.8 MiB of commit log.
    The archiver's read maps a step of that at most, and leaves nothing of it mapped afterwards."""
    monkeypatch.setattr(batch_module, "UNMAP_STEP", 1 << 20)
    config = small_config(commit_log_file_size=4 << 20)
    with LocalMessageStore(tmp_path, config=config) as store:
        for n in range(800):
            store.put_messages(PutRequest(TOPIC, queue_id, bytes([n % 251]) * 4000) for queue_id in range(4))
    commit_log = tmp_path / "commitlog"
    peak = 0
    release = batch_module.release_mapped_pages

    def measured_release(*args: object) -> int:
        nonlocal peak
        peak = max(peak, mapped_rss(commit_log))  # what the read holds mapped just before it lets a step go
        return release(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(batch_module, "release_mapped_pages", measured_release)
    store = (
        LocalMessageStore(tmp_path, config=config)
        if kind == "writer"
        else HotStoreFollower(tmp_path, config=config, refresh_interval=0.0)
    )
    with store:
        assert store.max_offset(TOPIC, 2) == 800  # (a follower checks a queue's records when first asked)
        store.release_pages(1 << 40)  # what opening mapped (a follower's check; a writer keeps its tail)
        before = mapped_rss(commit_log)
        assert before <= 64 << 10
        batch = store.read_batch(TOPIC, 2, 0, 1000, 1 << 30, unmap=True)
        assert len(batch) == 800
        assert before < peak <= before + (1 << 20) + (256 << 10)
        # At most what a fault maps around the last record of each of the four files stays mapped.
        assert mapped_rss(commit_log) <= before + (256 << 10)
        # Unmapped is not gone: the same records read again, mapped this time, spread over the whole log.
        again = store.read_batch(TOPIC, 2, 0, 1000, 1 << 30)
        assert bytes(again.data) == bytes(batch.data)
        assert mapped_rss(commit_log) >= 10 << 20
        same(batch, store.read_messages(TOPIC, 2, 0, 1000, 1 << 30))
