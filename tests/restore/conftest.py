"""The restore engine is tested on the CLI tests' POSIX + SQLite node, archived by the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.conftest import posix_node
from tests.cli.helpers import Node


@pytest.fixture
def posix(tmp_path: Path) -> Node:
    return posix_node(tmp_path)
