"""Parts of one archiver for dispatcher tests: a small-file hot store, SQLite metadata, a cold provider, a key index."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.archiver.helpers import Archive, open_archive
from tieredstore.local import LocalStoreConfig


@pytest.fixture
async def archive(tmp_path: Path) -> AsyncIterator[Archive]:
    """A fresh archive on a memory provider; ``archive.dispatcher(...)`` builds a dispatcher over it."""
    hot_config = LocalStoreConfig(
        commit_log_file_size=1 << 20, max_message_size=256 << 10, consume_queue_units_per_file=64
    )
    async with open_archive(tmp_path, hot_config) as parts:
        yield parts
