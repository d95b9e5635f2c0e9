"""Small-file store configs and a helper that abandons a store the way a crash would."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.paths import ROCKETMQ_FIXTURES
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
