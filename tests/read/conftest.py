"""Read-path tests: backends restricted to the three providers the read path is specified against."""

from __future__ import annotations

import pytest

from tieredstore.metadata import upgrade

READ_BACKENDS = ["memory", "posix", "s3"]

# Use as ``@over_backends`` on a test taking ``provider_factory``: memory, posix and s3 (moto over HTTP).
over_backends = pytest.mark.parametrize("provider_factory", READ_BACKENDS, indirect=True)


@pytest.fixture
def migrated_metadata_url(metadata_url: str) -> str:
    """``metadata_url`` (SQLite, then PostgreSQL) migrated to head, as ``tieredstore db upgrade`` leaves it."""
    upgrade(metadata_url)
    return metadata_url
