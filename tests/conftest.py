"""Root of the test suite: isolation from the user's environment and the shared backend fixtures."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import structlog

# Real backends, one plugin module each: a moto S3 server over HTTP, the PostgreSQL server, a REST catalog.
pytest_plugins = [
    "tests.fixtures.s3",
    "tests.fixtures.postgres",
    "tests.fixtures.backends",
    "tests.fixtures.rest_catalog",
]


@pytest.fixture(autouse=True)
def _isolate_tieredstore_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """No TIEREDSTORE_* or AWS_* variable of the developer's shell reaches a test; HOME is a temp dir. Nor does
    COLUMNS or LINES: a pytest-xdist worker has COLUMNS=80, which the CLI rightly obeys, folding the tables that
    tests read as a pipe (wider by default) would show."""
    for name in list(os.environ):
        if name.startswith(("TIEREDSTORE_", "AWS_")) or name in ("COLUMNS", "LINES"):
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path_factory.mktemp("home")))
    return


@pytest.fixture(autouse=True)
def _isolate_logging_configuration() -> Iterator[None]:
    """A CLI test configures structlog for its process (level, renderer); later tests start from what was before,
    so ``capture_logs`` sees every level whatever ran first."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)
