"""Parts of one archiver for dispatcher tests: a small-file hot store, SQLite metadata, a cold provider, a key index."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.archiver.helpers import Archive
from tieredstore.local import LocalMessageStore, LocalStoreConfig
from tieredstore.metadata import MetadataStore
from tieredstore.providers.memory import MemoryProvider


@pytest.fixture
async def archive(tmp_path: Path) -> AsyncIterator[Archive]:
    """A fresh archive on a memory provider; ``archive.dispatcher(...)`` builds a dispatcher over it."""
    name = f"archiver-{uuid.uuid4().hex}"
    hot = LocalMessageStore(
        tmp_path / "hot",
        config=LocalStoreConfig(
            commit_log_file_size=1 << 20, max_message_size=256 << 10, consume_queue_units_per_file=64
        ),
    )
    metadata = MetadataStore.open(f"sqlite:///{tmp_path / 'metadata.db'}")
    parts = Archive(tmp_path, hot, metadata, MemoryProvider(f"memory://{name}"))
    await parts.open()
    try:
        yield parts
    finally:
        await parts.close()
        MemoryProvider.wipe(name)
