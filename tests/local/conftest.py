"""Small-file store configs and a helper that abandons a store the way a crash would."""

from __future__ import annotations

import pytest

from tieredstore.local import LocalMessageStore, LocalStoreConfig

FIXTURES = "/work/shared/fixtures/rocketmq"


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


def abandon(store: LocalMessageStore) -> None:
    """Stop using a store without the clean close: no final flush, checkpoint or abort-file removal."""
    assert store._flusher is not None
    store._flusher.stop()
    store._release()


@pytest.fixture
def config() -> LocalStoreConfig:
    return small_config()
