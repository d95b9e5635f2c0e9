"""A CLI node archiving to the moto S3 server (directly or through a fault proxy), metadata migrated first."""

from __future__ import annotations

from pathlib import Path

from tests.cli.conftest import SMALL_FILES
from tests.cli.helpers import Node
from tests.fixtures.s3 import S3Server


def s3_node(tmp_path: Path, s3: S3Server, cold_url: str, metadata_url: str, endpoint_url: str | None = None) -> Node:
    """A node on ``cold_url`` and ``metadata_url`` (migrated here), reaching S3 at ``endpoint_url`` or moto's own."""
    env = {
        **SMALL_FILES,
        "TIEREDSTORE_S3__ENDPOINT_URL": endpoint_url or s3.endpoint_url,
        "TIEREDSTORE_S3__REGION": s3.region,
        "TIEREDSTORE_S3__ACCESS_KEY_ID": s3.access_key_id,
        "TIEREDSTORE_S3__SECRET_ACCESS_KEY": s3.secret_access_key,
        "TIEREDSTORE_S3__MAX_ATTEMPTS": "2",
    }
    node = Node("s3", tmp_path / "node", cold_url=cold_url, metadata_url=metadata_url, env=env)
    upgraded = node("db", "upgrade", output="json")
    assert upgraded.exit_code == 0, upgraded.stderr
    return node


def stored_keys(s3: S3Server, bucket: str) -> list[str]:
    """Every key in ``bucket``."""
    client = s3.client()
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return [item["Key"] for page in pages for item in page.get("Contents", [])]
