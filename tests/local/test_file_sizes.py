"""Commit-log and consume-queue file sizes come from the files on disk, not from configuration: a store written
with non-default sizes (a broker's mappedFileSizeCommitLog / mappedFileSizeConsumeQueue) is read, followed and
written on as it is, by a hot store configured with the defaults."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from tests.read.helpers import make_config
from tieredstore.errors import ConfigError
from tieredstore.formats.message import decode
from tieredstore.local import HotStoreFollower, LocalMessageStore, LocalStoreConfig, PutRequest, PutResult
from tieredstore.local.file_sizes import StoreFileSizes
from tieredstore.store import AsyncTieredMessageStore

from .conftest import FIXTURES, small_config

SMALL = small_config()  # 64 KiB commit-log files, 10-unit (200-byte) consume-queue files
DEFAULT = LocalStoreConfig()


def body(queue_id: int, n: int) -> bytes:
    return f"{queue_id}:{n}|".encode() * (100 + n % 50)


def write_small(directory: Path, count: int = 400) -> list[PutResult]:
    with LocalMessageStore(directory, config=SMALL) as store:
        return store.put_messages(
            PutRequest("Orders", n % 2, body(n % 2, n // 2), keys=(f"k{n}",), tags=f"t{n % 3}") for n in range(count)
        )


def snapshot(directory: Path) -> dict[str, str]:
    return {
        str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


def disagreements(logs: list[dict[str, object]]) -> dict[object, tuple[object, object]]:
    return {
        entry["setting"]: (entry["configured_bytes"], entry["on_disk_bytes"])
        for entry in logs
        if entry["event"] == "the hot store's files are not the size configuration says; going by the files"
    }


def test_a_store_of_small_files_reads_and_follows_with_the_default_configuration(tmp_path: Path) -> None:
    puts = write_small(tmp_path)
    assert len(list((tmp_path / "commitlog").iterdir())) >= 3
    expected = {
        "commit_log_file_size": (DEFAULT.commit_log_file_size, 64 << 10),
        "consume_queue_units_per_file": (DEFAULT.consume_queue_file_size, 200),
    }
    for open_store in (
        lambda: LocalMessageStore(tmp_path, read_only=True),
        lambda: HotStoreFollower(tmp_path),
    ):
        with capture_logs() as logs, open_store() as store:
            assert store.file_sizes == StoreFileSizes(commit_log=64 << 10, consume_queue=200)
            assert disagreements(logs) == expected, "disk wins, and a log line says so"
            for queue_id in (0, 1):
                messages = store.read_batch("Orders", queue_id, 0, 1000, 1 << 30)
                assert [decode(messages.record(i)).body for i in range(len(messages))] == [
                    body(queue_id, n) for n in range(200)
                ]
            last = puts[-1]
            assert decode(store.record_at(last.commitlog_offset)).body == body(last.queue_id, 199)


def test_a_writer_reopened_with_the_defaults_goes_on_in_files_of_the_size_on_disk(tmp_path: Path) -> None:
    write_small(tmp_path)
    # The default file sizes; messages up to 16 KiB, which a 64 KiB file holds.
    with LocalMessageStore(tmp_path, config=LocalStoreConfig(max_message_size=16 << 10)) as writer:
        assert writer.file_sizes == StoreFileSizes(commit_log=64 << 10, consume_queue=200)
        for n in range(400, 600):
            writer.put_message("Orders", n % 2, body(n % 2, n // 2))
        writer.put_message("Payments", 0, b"a queue the store had no file for")
    commit_log = sorted((tmp_path / "commitlog").iterdir())
    assert len(commit_log) >= 6
    assert {path.stat().st_size for path in commit_log} == {64 << 10}
    assert [int(path.name) for path in commit_log] == [n * (64 << 10) for n in range(len(commit_log))]
    for queue_dir in (tmp_path / "consumequeue").glob("*/*"):
        assert {path.stat().st_size for path in queue_dir.iterdir()} == {200}, queue_dir
    with LocalMessageStore(tmp_path, read_only=True) as reader:
        assert reader.max_offset("Orders", 0) == reader.max_offset("Orders", 1) == 300
        assert reader.get_message("Orders", 1, 299).body == body(1, 299)


def test_a_writer_refuses_files_on_disk_too_small_for_its_largest_message(tmp_path: Path) -> None:
    write_small(tmp_path)
    before = snapshot(tmp_path)
    with pytest.raises(ConfigError, match="commit-log files of 65536 bytes"):
        LocalMessageStore(tmp_path, config=LocalStoreConfig(max_message_size=1 << 20))
    assert snapshot(tmp_path) == before


def test_a_store_without_files_yet_goes_by_its_configuration(tmp_path: Path) -> None:
    with capture_logs() as logs, LocalMessageStore(tmp_path, config=SMALL) as store:
        assert store.file_sizes == StoreFileSizes(commit_log=64 << 10, consume_queue=200)
        store.put_message("Orders", 0, b"first")
    assert disagreements(logs) == {}
    assert [path.stat().st_size for path in (tmp_path / "commitlog").iterdir()] == [64 << 10]


async def test_a_message_is_found_by_its_offset_id_in_any_file_of_a_non_default_store(tmp_path: Path) -> None:
    config = make_config(tmp_path, hot={"max_message_size": 16 << 10})  # and the default 1 GiB commit-log files
    puts = write_small(config.hot_dir)
    later = [put for put in puts if put.commitlog_offset >= 2 * (64 << 10)]
    assert later, "some messages lie in the third commit-log file or later"
    async with AsyncTieredMessageStore.open(config) as store:
        hot = store.runtime.hot
        assert hot is not None
        for put in (puts[0], later[0], later[-1]):
            found = await store.look_message_by_offset(hot.offset_msg_id(put.commitlog_offset))
            assert (found.tier, found.queue_id, found.queue_offset) == ("hot", put.queue_id, put.queue_offset)
            assert found.body == body(put.queue_id, put.queue_offset)


def test_the_rocketmq_fixtures_read_with_the_default_configuration(tmp_path: Path) -> None:
    rust = Path(shutil.copytree(Path(FIXTURES) / "rust-0.9.0-writer", tmp_path / "rust"))
    java = Path(shutil.copytree(Path(FIXTURES) / "java-4x-consumequeuetest", tmp_path / "java"))
    with HotStoreFollower(rust) as follower:
        # A 4 KiB commit-log file and a 200-byte consume-queue file.
        assert follower.file_sizes == StoreFileSizes(commit_log=4096, consume_queue=200)
        assert [follower.get_message("V1UpgradeTopic", 0, n).body for n in range(2)] == [
            b"v0.9.0-message-0",
            b"v0.9.0-message-1",
        ]
    with LocalMessageStore(java, read_only=True) as reader:
        assert reader.file_sizes == StoreFileSizes(commit_log=8192, consume_queue=DEFAULT.consume_queue_file_size)
        assert reader.max_offset("abc", 0) == 47
