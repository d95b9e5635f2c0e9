"""Puts and reads of the hot store: layout, blank records, batches, threads, timestamps, flush modes."""

from __future__ import annotations

import os
import struct
import threading
import time
from pathlib import Path

import pytest

from tieredstore.errors import ConfigError, NotFoundError, ValidationError
from tieredstore.formats.consume_queue import ConsumeQueueUnit, iter_units
from tieredstore.formats.message import MAGIC_BLANK, decode, iter_records, tag_hash
from tieredstore.local import LocalMessageStore, LocalStoreConfig, PutRequest
from tieredstore.local import commit_log as commit_log_module

from .conftest import mapped_rss, small_config


def test_put_then_read_back_every_field(tmp_path: Path, config: LocalStoreConfig) -> None:
    with LocalMessageStore(tmp_path, config=config) as store:
        before = int(time.time() * 1000)
        first = store.put_message("orders", 3, b"hello", keys=["k1", "k2"], tags="TagA", properties={"a": "1"})
        second = store.put_message("orders", 3, b"world")
        assert (first.queue_offset, first.commitlog_offset) == (0, 0)
        assert (second.queue_offset, second.commitlog_offset) == (1, first.size)
        assert first.store_timestamp >= before
        message = store.get_message("orders", 3, 0)
        assert message.body == b"hello"
        assert message.keys == ["k1", "k2"] and message.tags == "TagA" and message.properties["a"] == "1"
        assert (message.queue_offset, message.physical_offset, message.store_timestamp) == (0, 0, first.store_timestamp)
        assert str(message.store_host) == "127.0.0.1:10911"
        assert store.cq_unit("orders", 3, 0) == ConsumeQueueUnit(0, first.size, tag_hash("TagA"))
        assert store.cq_unit("orders", 3, 1).tag_hash == 0
        assert (store.min_offset("orders", 3), store.max_offset("orders", 3)) == (0, 2)
        assert store.max_offset("orders", 4) == 0
        assert store.queues() == [("orders", 3)]
        assert store.offset_msg_id(0) == message.offset_msg_id
        with pytest.raises(NotFoundError):
            store.cq_unit("orders", 3, 2)
    assert (tmp_path / "commitlog" / "00000000000000000000").stat().st_size == 64 << 10
    units = list(iter_units((tmp_path / "consumequeue" / "orders" / "3" / "00000000000000000000").read_bytes()))
    assert units[:2] == [
        ConsumeQueueUnit(0, first.size, tag_hash("TagA")),
        ConsumeQueueUnit(first.size, second.size, 0),
    ]


def test_files_roll_over_with_a_blank_record_and_rocketmq_names(tmp_path: Path, config: LocalStoreConfig) -> None:
    body = b"x" * 3000
    with LocalMessageStore(tmp_path, config=config) as store:
        results = [store.put_message("t", 0, body) for _ in range(50)]
    files = sorted(os.listdir(tmp_path / "commitlog"))
    assert files[:3] == ["00000000000000000000", "00000000000000065536", "00000000000000131072"]
    first_file = (tmp_path / "commitlog" / files[0]).read_bytes()
    records = list(iter_records(first_file))
    end = records[-1][0] + results[0].size
    assert len(records) == 65536 // results[0].size - (1 if 65536 % results[0].size < 8 else 0)
    assert struct.unpack_from(">iI", first_file, end) == (65536 - end, MAGIC_BLANK)
    assert results[len(records)].commitlog_offset == 65536
    cq_files = sorted(os.listdir(tmp_path / "consumequeue" / "t" / "0"))
    assert cq_files[:3] == ["00000000000000000000", "00000000000000000200", "00000000000000000400"]
    with LocalMessageStore(tmp_path, config=config) as store:
        assert [m.queue_offset for m in store.read_messages("t", 0, 0, 100, 1 << 30)] == list(range(50))


def test_read_messages_respects_count_and_bytes_but_returns_at_least_one(
    tmp_path: Path, config: LocalStoreConfig
) -> None:
    with LocalMessageStore(tmp_path, config=config) as store:
        store.put_messages([PutRequest("t", 1, bytes([i]) * (100 * (i + 1))) for i in range(10)])
        batch = store.read_messages("t", 1, 2, max_count=5)
        assert [m.queue_offset for m in batch] == [2, 3, 4, 5, 6]
        for message in batch:
            assert decode(message.raw).body == bytes([message.queue_offset]) * (100 * (message.queue_offset + 1))
            assert message.unit == store.cq_unit("t", 1, message.queue_offset)
        exact = sum(store.cq_unit("t", 1, offset).size for offset in range(3))
        assert [m.queue_offset for m in store.read_messages("t", 1, 0, 10, max_bytes=exact)] == [0, 1, 2]
        assert [m.queue_offset for m in store.read_messages("t", 1, 0, 10, max_bytes=exact - 1)] == [0, 1]
        assert len(store.read_messages("t", 1, 9, max_count=10, max_bytes=1)) == 1
        assert store.read_messages("t", 1, 10) == []
        assert store.read_messages("never", 0, 0) == []


def test_batches_interleave_queues_with_contiguous_offsets(tmp_path: Path, config: LocalStoreConfig) -> None:
    with LocalMessageStore(tmp_path, config=config) as store:
        results = store.put_messages([PutRequest("t", i % 3, f"m{i}".encode(), tags="x") for i in range(30)])
        assert [r.queue_offset for r in results if r.queue_id == 2] == list(range(10))
        assert store.get_message("t", 2, 9).body == b"m29"
        assert store.put_messages([]) == []


def test_concurrent_puts_lose_nothing_and_never_share_an_offset(tmp_path: Path, config: LocalStoreConfig) -> None:
    with LocalMessageStore(tmp_path, config=config) as store:

        def produce(worker: int) -> None:
            for i in range(150):
                store.put_message("t", i % 2, f"{worker}-{i}".encode())

        threads = [threading.Thread(target=produce, args=(w,)) for w in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        bodies = [m.raw for q in (0, 1) for m in store.read_messages("t", q, 0, 1000, 1 << 30)]
        assert store.max_offset("t", 0) + store.max_offset("t", 1) == 600
    assert sorted(decode(raw).body.decode() for raw in bodies) == sorted(
        f"{w}-{i}" for w in range(4) for i in range(150)
    )


def test_offset_for_timestamp_boundaries(tmp_path: Path, config: LocalStoreConfig) -> None:
    with LocalMessageStore(tmp_path, config=config) as store:
        stamps = []
        for _ in range(3):
            group = store.put_messages([PutRequest("t", 0, b"m")] * 3)
            stamps.append(group[0].store_timestamp)
            assert {r.store_timestamp for r in group} == {stamps[-1]}
            time.sleep(0.003)
        assert store.offset_for_timestamp("t", 0, stamps[1], "lower") == 3
        assert store.offset_for_timestamp("t", 0, stamps[1], "upper") == 5
        assert store.offset_for_timestamp("t", 0, stamps[1] + 1, "lower") == 6
        assert store.offset_for_timestamp("t", 0, stamps[1] + 1, "upper") == 5
        assert store.offset_for_timestamp("t", 0, 0, "lower") == 0
        assert store.offset_for_timestamp("t", 0, 0, "upper") == 0
        assert store.offset_for_timestamp("t", 0, stamps[2] + 10**6, "lower") == 9
        assert store.offset_for_timestamp("t", 0, stamps[2] + 10**6, "upper") == 8
        assert store.store_timestamp("t", 0, 4) == stamps[1]
        with pytest.raises(ValidationError, match="boundary"):
            store.offset_for_timestamp("t", 0, 0, "middle")  # type: ignore[arg-type]


def test_sync_puts_return_durable_and_share_syncs(tmp_path: Path) -> None:
    config = small_config(flush_mode="sync", commit_log_file_size=8 << 20)
    with LocalMessageStore(tmp_path, config=config) as store:
        flushed_when_returned: list[bool] = []

        def produce() -> None:
            for _ in range(100):
                result = store.put_message("t", 0, b"x" * 1024)
                flushed_when_returned.append(store.commitlog_flushed_offset >= result.commitlog_offset + result.size)

        threads = [threading.Thread(target=produce) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        stats = store.flush_stats
        assert all(flushed_when_returned) and len(flushed_when_returned) == 800
        assert stats.sync_waits == 800
        assert stats.commit_log_syncs < stats.sync_waits


def test_a_failed_sync_fails_the_puts_it_covered_and_the_next_put_syncs_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = small_config(flush_mode="sync", commit_log_file_size=8 << 20)
    with LocalMessageStore(tmp_path, config=config) as store:
        real_fdatasync = os.fdatasync

        def failing_fdatasync(fd: int) -> None:
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(os, "fdatasync", failing_fdatasync)
        with pytest.raises(OSError, match="Input/output error"):
            store.put_message("t", 0, b"unsure")
        assert store.commitlog_flushed_offset < store.commitlog_max_offset
        monkeypatch.setattr(os, "fdatasync", real_fdatasync)
        result = store.put_message("t", 0, b"sure")
        assert store.commitlog_flushed_offset >= result.commitlog_offset + result.size
        # The unconfirmed message stays in the log (as RocketMQ's FLUSH_DISK_TIMEOUT): now durable too.
        assert [store.get_message("t", 0, offset).body for offset in (0, 1)] == [b"unsure", b"sure"]


def test_async_flush_catches_up_within_the_interval(tmp_path: Path) -> None:
    with LocalMessageStore(tmp_path, config=small_config(flush_interval=0.05)) as store:
        result = store.put_message("t", 0, b"x")
        assert store.flush_stats.sync_waits == 0
        deadline = time.monotonic() + 5
        while store.commitlog_flushed_offset < result.commitlog_offset + result.size:
            assert time.monotonic() < deadline, "the background flush never ran"
            time.sleep(0.01)


def test_an_idle_store_does_not_rewrite_its_checkpoint(tmp_path: Path) -> None:
    """Disk writes (and fsyncs) while nothing is put would never stop on an idle node; the next put moves it."""
    checkpoint = tmp_path / "checkpoint"
    with LocalMessageStore(tmp_path, config=small_config(flush_interval=0.02)) as store:
        store.put_message("t", 0, b"x")
        store.flush()
        written = checkpoint.stat().st_mtime_ns, checkpoint.read_bytes()
        time.sleep(0.3)  # ~15 flush intervals
        assert (checkpoint.stat().st_mtime_ns, checkpoint.read_bytes()) == written
        store.put_message("t", 0, b"y")
        store.flush()
        assert checkpoint.read_bytes() != written[1]
    with LocalMessageStore(tmp_path, config=small_config()) as store:
        assert store.recovery.clean and store.max_offset("t", 0) == 2


def test_clean_reopen_scans_nothing_and_a_second_writer_is_refused(tmp_path: Path, config: LocalStoreConfig) -> None:
    with LocalMessageStore(tmp_path, config=config) as store:
        for i in range(40):
            store.put_message("t", i % 4, b"y" * 2000)
        with pytest.raises(ConfigError, match="already open"):
            LocalMessageStore(tmp_path, config=config)
    assert not (tmp_path / "abort").exists()
    with LocalMessageStore(tmp_path, config=config) as store:
        assert store.recovery.clean and store.recovery.records_scanned == 0
        assert [store.max_offset("t", q) for q in range(4)] == [10, 10, 10, 10]
        assert store.put_message("t", 0, b"next").queue_offset == 10


def test_config_is_validated() -> None:
    with pytest.raises(ConfigError, match="flush_mode"):
        LocalStoreConfig(flush_mode="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="commit_log_file_size"):
        LocalStoreConfig(commit_log_file_size=1024)
    with pytest.raises(ConfigError, match="store_host"):
        LocalStoreConfig(store_host="nohost")
    assert str(LocalStoreConfig(store_host="[::1]:9876").store_host_address) == "[::1]:9876"


def test_a_writer_keeps_only_its_recent_flushed_pages_mapped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A put writes through the mapping, so every page written would stay in the producer's RSS until
    retention deletes the file; flushed pages older than the window are unmapped instead."""
    monkeypatch.setattr(commit_log_module, "WRITER_MAPPED_WINDOW", 1 << 20)
    monkeypatch.setattr(commit_log_module, "WRITER_RELEASE_STEP", 256 << 10)
    monkeypatch.setattr(commit_log_module, "WRITER_SWEEP_STEPS", 4)
    config = small_config(commit_log_file_size=1 << 20, consume_queue_units_per_file=1000)
    body = os.urandom(4000)
    with LocalMessageStore(tmp_path, config=config) as store:
        for _ in range(30):
            store.put_messages([PutRequest("recent", 0, body) for _ in range(100)])
            store.flush()
        assert sum(path.stat().st_size for path in (tmp_path / "commitlog").iterdir()) >= 12 << 20
        assert mapped_rss(tmp_path / "commitlog") <= 2 << 20
        # Unmapped is not gone: every message reads back whole, old and new.
        assert [decode(m.raw).body for m in store.read_messages("recent", 0, 0, 5000, 1 << 30)] == [body] * 3000
        # That read (a consumer catching up) mapped the old pages again; a later sweep unmaps them too.
        assert mapped_rss(tmp_path / "commitlog") >= 10 << 20
        for _ in range(4):
            store.put_messages([PutRequest("recent", 0, body) for _ in range(100)])
            store.flush()
        assert mapped_rss(tmp_path / "commitlog") <= 2 << 20
