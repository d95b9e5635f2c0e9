"""A node for CLI tests on each real backend pair: POSIX + SQLite, and S3 over HTTP (moto) + PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.helpers import Node

# Small files so a few hundred messages span several cold segments and hot files.
SMALL_FILES = {
    "TIEREDSTORE_HOT__COMMIT_LOG_FILE_SIZE": str(256 << 10),
    "TIEREDSTORE_HOT__MAX_MESSAGE_SIZE": str(64 << 10),
    "TIEREDSTORE_HOT__CONSUME_QUEUE_UNITS_PER_FILE": "100",
    "TIEREDSTORE_SEGMENTS__COMMIT_LOG_MAX_SIZE": str(16 << 10),
    "TIEREDSTORE_SEGMENTS__CONSUME_QUEUE_MAX_SIZE": str(100 * 20),
}


def posix_node(tmp_path: Path) -> Node:
    return Node("posix-sqlite", tmp_path / "node", env=dict(SMALL_FILES))


@pytest.fixture
def posix(tmp_path: Path) -> Node:
    return posix_node(tmp_path)


@pytest.fixture(params=["posix-sqlite", pytest.param("s3-postgres", marks=pytest.mark.postgres)])
def node(request: pytest.FixtureRequest, tmp_path: Path) -> Node:
    """A node on each backend pair; the PostgreSQL schema is migrated with ``db upgrade`` first."""
    if request.param == "posix-sqlite":
        return posix_node(tmp_path)
    s3 = request.getfixturevalue("s3_server")
    env = dict(SMALL_FILES)
    env.update(
        {
            "TIEREDSTORE_S3__ENDPOINT_URL": s3.endpoint_url,
            "TIEREDSTORE_S3__REGION": s3.region,
            "TIEREDSTORE_S3__ACCESS_KEY_ID": s3.access_key_id,
            "TIEREDSTORE_S3__SECRET_ACCESS_KEY": s3.secret_access_key,
        }
    )
    built = Node(
        "s3-postgres",
        tmp_path / "node",
        cold_url=request.getfixturevalue("s3_bucket_url"),
        metadata_url=request.getfixturevalue("postgres_url"),
        env=env,
    )
    upgraded = built("db", "upgrade", output="json")
    assert upgraded.exit_code == 0, upgraded.stderr
    return built
