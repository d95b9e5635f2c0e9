"""``s3.storage_class`` through ``tieredstore run``: commit-log chunks in it, consume-queue and index chunks STANDARD
(or ``s3.index_storage_class``), everything still readable; a class that needs a restore is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.helpers import Node
from tests.cli.s3_nodes import s3_node, stored_keys
from tests.cli.test_restore import TOPIC, produce
from tests.fixtures.s3 import S3Server


def indexed_node(tmp_path: Path, s3: S3Server, cold_url: str, metadata_url: str) -> Node:
    node = s3_node(tmp_path, s3, cold_url, metadata_url)
    # Small key-index files, so that some are sealed and uploaded as INDEX segments.
    node.env.update({"TIEREDSTORE_INDEX__INDEX_MAX_ITEMS": "64", "TIEREDSTORE_INDEX__INDEX_SLOT_COUNT": "16"})
    return node


def classes_by_type(s3: S3Server, bucket: str) -> dict[str, set[str]]:
    client = s3.client()
    found: dict[str, set[str]] = {}
    for key in stored_keys(s3, bucket):
        kind = "marker" if key.endswith("/.created") else key.split("/")[-3]
        found.setdefault(kind, set()).add(client.head_object(Bucket=bucket, Key=key).get("StorageClass", "STANDARD"))
    return found


@pytest.mark.parametrize(
    ("settings", "commit_log", "others"),
    [
        ({}, "STANDARD", "STANDARD"),
        ({"TIEREDSTORE_S3__STORAGE_CLASS": "STANDARD_IA"}, "STANDARD_IA", "STANDARD"),
        (
            {"TIEREDSTORE_S3__STORAGE_CLASS": "GLACIER_IR", "TIEREDSTORE_S3__INDEX_STORAGE_CLASS": "STANDARD_IA"},
            "GLACIER_IR",
            "STANDARD_IA",
        ),
    ],
)
def test_archived_objects_are_stored_in_the_class_of_their_type_and_read_back(
    tmp_path: Path,
    s3_server: S3Server,
    s3_bucket: str,
    s3_bucket_url: str,
    metadata_url: str,
    settings: dict[str, str],
    commit_log: str,
    others: str,
) -> None:
    node = indexed_node(tmp_path, s3_server, s3_bucket_url, metadata_url)
    node.env.update(settings)
    produce(node, 0, 200)
    result = node("run", "--once")
    assert result.exit_code == 0, result.stderr
    found = classes_by_type(s3_server, s3_bucket)
    assert found.pop("marker", {"STANDARD"}) == {"STANDARD"}
    assert found == {"COMMIT_LOG": {commit_log}, "CONSUME_QUEUE": {others}, "INDEX": {others}}
    segments = node("segments", TOPIC, "0", output="json").json()["rows"]
    assert len({row["base_offset"] for row in segments if row["file_type"] == "COMMIT_LOG"}) >= 2
    assert node("verify", "--deep").exit_code == 0
    read = node("read", TOPIC, "0", "--offset", "0", "--count", "200", "--tier", "cold", output="json")
    assert read.exit_code == 0, read.stderr
    assert len(read.json_lines()) == 200
    found = node("query-key", TOPIC, "order-0-150", output="json")
    assert found.exit_code == 0 and len(found.json_lines()) == 1


@pytest.mark.parametrize("setting", ["STORAGE_CLASS", "INDEX_STORAGE_CLASS"])
def test_a_class_that_needs_a_restore_is_refused_with_one_line_and_nothing_changes(
    tmp_path: Path, s3_server: S3Server, s3_bucket: str, s3_bucket_url: str, sqlite_url: str, setting: str
) -> None:
    node = s3_node(tmp_path, s3_server, s3_bucket_url, sqlite_url)
    produce(node, 0, 20)
    node.env[f"TIEREDSTORE_S3__{setting}"] = "DEEP_ARCHIVE"
    result = node("run", "--once")
    assert result.exit_code == 7
    (line,) = result.stderr.strip().splitlines()
    assert f"s3.{setting.lower()}" in line and "DEEP_ARCHIVE" in line and "restored" in line
    assert stored_keys(s3_server, s3_bucket) == []
