"""Fixtures of the reliability scenarios: small real file systems and a migrated SQLite metadata store."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.reliability.workload import Tmpfs
from tieredstore.metadata import MetadataStore


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[[str, int], Tmpfs]]:
    """Mounts tmpfs file systems of a given size under the test's temp dir; unmounted afterwards."""
    mounted: list[Tmpfs] = []

    def mount(name: str, size: int) -> Tmpfs:
        mounted.append(Tmpfs(tmp_path / name, size))
        return mounted[-1]

    yield mount
    for fs in reversed(mounted):
        fs.unmount()


@pytest.fixture
def metadata(tmp_path: Path) -> Iterator[MetadataStore]:
    with MetadataStore.open(f"sqlite:///{tmp_path / 'metadata.db'}") as store:
        yield store
