"""Hot retention: whole files go only when old enough and fully archived; min offsets move up."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tieredstore.errors import NotFoundError
from tieredstore.local import LocalMessageStore, LocalStoreConfig
from tieredstore.local.commit_log import CommitLog
from tieredstore.local.mapped_file import MappedFile

from .conftest import abandon, small_config

HOUR_MS = 3_600_000


def fill(store: LocalMessageStore) -> None:
    """Two queues over five 64 KiB commit-log files; queue 1 only gets messages in the first file."""
    store.put_message("b", 1, b"early")
    for _ in range(100):
        store.put_message("a", 0, b"p" * 3000)


def archived_up_to(offsets: dict[tuple[str, int], int]):  # type: ignore[no-untyped-def]
    return lambda topic, queue_id: offsets.get((topic, queue_id), 0)


def test_nothing_is_deleted_until_archived(tmp_path: Path) -> None:
    with LocalMessageStore(tmp_path, config=small_config(hot_retention_hours=0)) as store:
        fill(store)
        files = sorted(os.listdir(tmp_path / "commitlog"))
        assert len(files) == 5
        assert store.delete_expired(archived_up_to({})).commit_log_files == []
        # Queue a fully archived but queue b's one message in the first file is not: still nothing.
        report = store.delete_expired(archived_up_to({("a", 0): 100}))
        assert report.commit_log_files == [] and store.commitlog_min_offset == 0
        assert sorted(os.listdir(tmp_path / "commitlog")) == files


def test_archived_and_old_files_are_deleted_in_order(tmp_path: Path) -> None:
    with LocalMessageStore(tmp_path, config=small_config(hot_retention_hours=1)) as store:
        fill(store)
        files = sorted(os.listdir(tmp_path / "commitlog"))
        everything = archived_up_to({("a", 0): 100, ("b", 1): 1})
        assert store.delete_expired(everything).commit_log_files == []  # archived, but young
        in_first_file = store.offset_for_timestamp("a", 0, 0)  # 0
        second_file_start = 65536
        first_of_second = next(
            m.queue_offset
            for m in store.read_messages("a", 0, in_first_file, 100, 1 << 30)
            if m.unit.commitlog_offset >= second_file_start
        )
        partial = archived_up_to({("a", 0): first_of_second, ("b", 1): 1})
        report = store.delete_expired(partial, now_ms=int(time.time() * 1000) + 2 * HOUR_MS)
        assert report.commit_log_files == [files[0]]
        assert report.commitlog_min_offset == second_file_start
        assert store.min_offset("a", 0) == first_of_second
        assert store.min_offset("b", 1) == store.max_offset("b", 1) == 1
        with pytest.raises(NotFoundError, match="below the hot store's min offset"):
            store.read_messages("a", 0, first_of_second - 1)
        with pytest.raises(NotFoundError):
            store.cq_unit("a", 0, 0)
        assert store.read_messages("a", 0, first_of_second, 1)[0].queue_offset == first_of_second
        cq_before = len(os.listdir(tmp_path / "consumequeue" / "a" / "0"))
        report = store.delete_expired(everything, now_ms=int(time.time() * 1000) + 2 * HOUR_MS)
        assert report.commit_log_files == files[1:4]  # never the file being written
        assert report.consume_queue_files > 0
        assert len(os.listdir(tmp_path / "consumequeue" / "a" / "0")) == cq_before - report.consume_queue_files
        min_a = store.min_offset("a", 0)
        assert store.cq_unit("a", 0, min_a).commitlog_offset >= store.commitlog_min_offset
        assert store.get_message("a", 0, 99).queue_offset == 99
    with LocalMessageStore(tmp_path, config=small_config()) as store:
        assert (store.min_offset("a", 0), store.max_offset("a", 0)) == (min_a, 100)
        abandon_min = store.commitlog_min_offset
        abandon(store)
    with LocalMessageStore(tmp_path, config=small_config()) as store:
        assert (store.min_offset("a", 0), store.max_offset("a", 0)) == (min_a, 100)
        assert store.commitlog_min_offset == abandon_min
        assert store.put_message("a", 0, b"more").queue_offset == 100


def test_config_retention_defaults(tmp_path: Path) -> None:
    assert LocalStoreConfig().hot_retention_hours == 72.0


def test_min_offsets_move_past_a_file_before_it_is_deleted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Another thread (a reader, or an application polling the directory) that sees a commit-log file gone
    # must not see a min offset that still points into it: CI once caught the old order in between.
    seen: list[tuple[int, int, int]] = []
    original = CommitLog.delete_first_file

    def recording_delete(log_: CommitLog) -> MappedFile:
        file_end = log_.files[0].end_offset
        min_a = store.min_offset("a", 0)
        seen.append((file_end, min_a, store.cq_unit("a", 0, min_a).commitlog_offset))
        return original(log_)

    monkeypatch.setattr(CommitLog, "delete_first_file", recording_delete)
    with LocalMessageStore(tmp_path, config=small_config(hot_retention_hours=0)) as store:
        fill(store)
        report = store.delete_expired(archived_up_to({("a", 0): 100, ("b", 1): 1}))
        assert len(report.commit_log_files) == len(seen) == 4
        for file_end, min_a, its_position in seen:
            assert its_position >= file_end, f"min offset {min_a} still pointed into the file being deleted"
        assert store.min_offset("b", 1) == 1
