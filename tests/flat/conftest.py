"""A migrated SQLite metadata store and a memory provider for container-layer tests."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tieredstore.metadata import MetadataStore, upgrade
from tieredstore.providers.memory import MemoryProvider


@pytest.fixture
def metadata(sqlite_url: str) -> Iterator[MetadataStore]:
    upgrade(sqlite_url)
    with MetadataStore(sqlite_url) as store:
        yield store


@pytest.fixture
def memory_provider() -> Iterator[MemoryProvider]:
    name = f"flat-{uuid.uuid4().hex}"
    yield MemoryProvider(f"memory://{name}")
    MemoryProvider.wipe(name)
