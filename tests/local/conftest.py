"""Small-file store configs, a helper that abandons a store the way a crash would, and a store laid out
like a RocketMQ broker's (records stored at chosen times, the broker's own checkpoint)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from tests.fixtures.paths import ROCKETMQ_FIXTURES
from tieredstore.formats.message import MessageRecord
from tieredstore.local import LocalMessageStore, LocalStoreConfig

FIXTURES = ROCKETMQ_FIXTURES


def small_config(**overrides: object) -> LocalStoreConfig:
    """64 KiB commit-log files and 10-unit consume-queue files, so tests cross file boundaries quickly."""
    settings: dict[str, object] = {
        "commit_log_file_size": 64 << 10,
        "max_message_size": 16 << 10,
        "consume_queue_units_per_file": 10,
        "flush_interval": 3600.0,
    }
    settings.update(overrides)
    return LocalStoreConfig(**settings)  # type: ignore[arg-type]


def mapped_rss(directory: Path) -> int:
    """Bytes of this process's RSS in mappings of files under ``directory`` (Linux: /proc/self/smaps)."""
    total, inside = 0, False
    prefix = f"{directory.resolve()}/"
    with open("/proc/self/smaps", encoding="utf-8") as smaps:
        for line in smaps:
            fields = line.split()
            if fields and not fields[0].endswith(":"):  # a mapping's header line: range perms offset dev inode [path]
                inside = len(fields) > 5 and fields[5].startswith(prefix)
            elif inside and fields[0] == "Rss:":
                total += int(fields[1]) * 1024
    return total


def abandon(store: LocalMessageStore) -> None:
    """Stop using a store without the clean close: no final flush, checkpoint or abort-file removal."""
    assert store._flusher is not None
    store._flusher.stop()
    store._release()


@pytest.fixture
def config() -> LocalStoreConfig:
    return small_config()


def write_rocketmq_checkpoint(store_dir: Path, *, physic_timestamp: int = 0, confirm_phy_offset: int = 0) -> None:
    """The checkpoint a RocketMQ broker writes: five longs in a 4096-byte file, no CRC (StoreCheckpoint.flush)."""
    fields = struct.pack(">qqqqq", physic_timestamp, physic_timestamp, 0, 0, confirm_phy_offset)
    (store_dir / "checkpoint").write_bytes(fields + bytes(4096 - len(fields)))


def store_at_times(store_dir: Path, topic: str, stamps: list[tuple[int, int]]) -> list[int]:
    """Messages stored in this order as (queue id, store timestamp ms), the way a broker appends them;
    returns where each record ends in the commit log. The store is closed cleanly afterwards."""
    ends: list[int] = []
    next_offset: dict[int, int] = {}
    with LocalMessageStore(store_dir, config=small_config()) as store:
        for queue_id, stamp in stamps:
            queue_offset = next_offset.get(queue_id, 0)
            next_offset[queue_id] = queue_offset + 1
            record = MessageRecord(
                topic, queue_id, f"{queue_id}:{queue_offset}".encode(), queue_offset=queue_offset, store_timestamp=stamp
            )
            (put,) = store.restore_messages(topic, queue_id, [record.encode()])
            ends.append(put.commitlog_offset + put.size)
    return ends
