"""A migrated MetadataStore on each engine."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tieredstore.metadata import MetadataStore, upgrade


@pytest.fixture
def store(metadata_url: str) -> Iterator[MetadataStore]:
    upgrade(metadata_url)
    with MetadataStore(metadata_url) as opened:
        yield opened
