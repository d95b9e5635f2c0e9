"""``tieredstore db rebuild --from-cold``: the metadata database lost, rebuilt from the archive alone.

Every row comes back as it was but for what cold storage cannot tell (asserted as defaulted); the rebuilt
database serves verify, read, query-key and restore, and the archiver continues from the right offsets
without writing anything twice. A non-empty database is refused and left as it was.
"""

from __future__ import annotations

import json
import time
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine, text

from tests.cli.helpers import Node
from tests.cli.test_lost_ranges import BEFORE, END, KEPT, RESUME, archive_with_hole, node_config
from tests.cli.test_restore import TOPIC, archive, produce
from tieredstore.formats.naming import FileType, queue_path, segment_key
from tieredstore.metadata.models import DEFAULT_RESERVE_SECONDS

# Small key-index files, each uploaded by the run that filled it: the rebuilt catalogue has files to find.
UPLOAD_INDEX_AT_ONCE = {
    "TIEREDSTORE_INDEX__INDEX_SEAL_INTERVAL": "0.001",
    "TIEREDSTORE_INDEX__INDEX_MAX_ITEMS": "4096",
    "TIEREDSTORE_INDEX__INDEX_SLOT_COUNT": "256",
}
OTHER_TOPIC = "Accounts"  # listed before Orders, created after it: ids cannot come from listing order
QUEUE_1 = 150


def snapshot(url: str) -> dict[str, Any]:
    """Every row of every table, keyed the way a rebuild must reproduce it (ids are the database's own)."""
    engine = create_engine(url)
    try:
        with engine.connect() as connection:

            def rows(statement: str) -> list[dict[str, Any]]:
                return [dict(row._mapping) for row in connection.execute(text(statement))]

            return {
                "topics": {row.pop("name"): row for row in rows("SELECT * FROM topics")},
                "queues": {
                    (row.pop("topic"), row.pop("queue_id")): row
                    for row in rows("SELECT t.name AS topic, q.* FROM queues q JOIN topics t ON t.id = q.topic_id")
                },
                "segments": {
                    (row.pop("path"), row.pop("file_type"), row.pop("base_offset")): row
                    for row in rows("SELECT * FROM segments")
                },
                "index_files": {row.pop("name"): row for row in rows("SELECT * FROM index_files")},
                "archivers": rows("SELECT * FROM archivers"),
            }
    finally:
        engine.dispose()


def drop_database(node: Node, url: str) -> None:
    """Lose the metadata: the SQLite file and its journal gone, or every PostgreSQL table and type gone."""
    if node.metadata_url is None:
        for path in node.data_dir.glob("metadata.db*"):
            path.unlink()
        return
    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as connection:
        connection.execute("DROP SCHEMA public CASCADE")
        connection.execute("CREATE SCHEMA public")


def cold_objects(node: Node, request: pytest.FixtureRequest) -> dict[str, int]:
    """Every object under the cold root with its size (files on POSIX, chunk objects on S3)."""
    if node.cold_url is None:
        root = node.data_dir / "cold"
        return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}
    bucket, prefix = node.cold_url.removeprefix("s3://").split("/", 1)
    client = request.getfixturevalue("s3_server").client()
    found = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
        for item in page.get("Contents", []):
            found[item["Key"]] = item["Size"]
    return found


def build_archive(node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    """Orders/0: [0, END) with [BEFORE, RESUME) lost; Orders/1 and Payments/0 archived by ``run --once``,
    their keys in uploaded index files; several segments per file (small segment sizes)."""
    node.env.update(UPLOAD_INDEX_AT_ONCE)
    archive_with_hole(node, monkeypatch)
    produce(node, 1, QUEUE_1)
    put = node("put", OTHER_TOPIC, "0", "--key", "pay-1", input="p0\np1\np2\n")
    assert put.exit_code == 0, put.stderr
    archive(node)
    assert node("topic", "set-retention", TOPIC, "7d").exit_code == 0


def assert_rebuilt_like(before: dict[str, Any], after: dict[str, Any], rebuilt_from: int, rebuilt_to: int) -> None:
    """Every row as it was, but for the columns cold storage cannot tell, which hold their documented defaults."""

    def rebuild_time(value: int | None) -> bool:
        return value is not None and rebuilt_from <= value <= rebuilt_to

    assert after["topics"].keys() == before["topics"].keys()
    for name, row in after["topics"].items():
        # The key index names topics by id: the rebuilt ids are the ones its items carry.
        assert (row["id"], row["status"]) == (before["topics"][name]["id"], before["topics"][name]["status"])
        assert row["reserve_seconds"] == DEFAULT_RESERVE_SECONDS  # unknowable: the default
        assert rebuild_time(row["created"]) and rebuild_time(row["updated"])
    assert before["topics"][TOPIC]["reserve_seconds"] == 7 * 86400

    assert after["queues"].keys() == before["queues"].keys()
    for key, row in after["queues"].items():
        was = before["queues"][key]
        assert (row["min_offset"], row["max_offset"]) == (was["min_offset"], was["max_offset"]), key
        assert (row["version"], row["owner"], row["epoch"], row["lease_expiry"]) == (0, None, 0, None)
        assert rebuild_time(row["updated"])

    live = {key: row for key, row in before["segments"].items() if row["status"] in ("NEW", "SEALED")}
    assert live == before["segments"]  # nothing was deleted by retention here
    assert after["segments"].keys() == live.keys()
    for key, row in after["segments"].items():
        was = live[key]
        same = ("size", "status", "begin_timestamp", "end_timestamp")
        assert {c: row[c] for c in same} == {c: was[c] for c in same}, key
        assert rebuild_time(row["created_timestamp"])
        assert rebuild_time(row["sealed_timestamp"]) if row["status"] == "SEALED" else row["sealed_timestamp"] is None

    assert after["index_files"].keys() == before["index_files"].keys() and after["index_files"]
    for name, row in after["index_files"].items():
        was = before["index_files"][name]
        same = ("status", "begin_timestamp", "end_timestamp", "item_count", "size")
        assert {c: row[c] for c in same} == {c: was[c] for c in same}, name
        assert rebuild_time(row["created"]) and rebuild_time(row["updated"])
    assert after["archivers"] == []


def test_rebuild_from_cold_brings_every_row_back_and_the_archive_goes_on(
    node: Node, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    build_archive(node, monkeypatch)
    url = node_config(node, monkeypatch).effective_metadata_url
    before = snapshot(url)
    assert sum(1 for p, t, _ in before["segments"] if t == "COMMIT_LOG" and p.endswith(f"/{TOPIC}/0")) >= 3
    assert sum(1 for p, t, _ in before["segments"] if t == "CONSUME_QUEUE" and p.endswith(f"/{TOPIC}/0")) >= 3

    drop_database(node, url)
    rebuilt_from = time.time_ns() // 1_000_000
    result = node("db", "rebuild", "--from-cold", output="json")
    rebuilt_to = time.time_ns() // 1_000_000
    assert result.exit_code == 0, result.stderr
    summary = result.json()
    queues = {(q["topic"], q["queue_id"]): q for q in summary["queues"]}
    assert queues[(TOPIC, 0)]["lost_ranges"] == [[BEFORE, RESUME]]
    assert (queues[(TOPIC, 0)]["min_offset"], queues[(TOPIC, 0)]["max_offset"]) == (0, END)
    assert queues[(TOPIC, 1)]["lost_ranges"] == [] and queues[(TOPIC, 1)]["max_offset"] == QUEUE_1
    assert summary["skipped"] == [] and summary["index_files"] == len(before["index_files"])
    assert any("retention" in item for item in summary["defaulted"])
    assert_rebuilt_like(before, snapshot(url), rebuilt_from, rebuilt_to)

    deep = node("verify", "--deep", output="json")
    assert deep.exit_code == 0, deep.stdout
    assert deep.json()["records"] == len(KEPT) + QUEUE_1 + 3
    across = node("read", TOPIC, "0", "--offset", "118", "--count", "4", "--tier", "cold", output="json")
    assert across.exit_code == 0, across.stderr
    assert [m["queue_offset"] for m in across.json_lines()] == [118, 119, RESUME, RESUME + 1]
    assert across.json_lines()[2]["lost_before"] == {"from_offset": BEFORE, "to_offset": RESUME}

    # Keys are found through the rebuilt catalogue alone: the hot store is moved away meanwhile.
    away = node.data_dir / "hot-away"
    node.hot_dir.rename(away)
    try:
        found = node("query-key", TOPIC, "order-1-42", output="json")
        assert found.exit_code == 0, found.stderr
        assert [(m["queue_id"], m["queue_offset"], m["tier"]) for m in found.json_lines()] == [(1, 42, "cold")]
        paid = node("query-key", OTHER_TOPIC, "pay-1", output="json")
        assert sorted(m["body"] for m in paid.json_lines()) == ["p0", "p1", "p2"]
    finally:
        away.rename(node.hot_dir)

    out = node.data_dir / "export"
    exported = node("restore", TOPIC, "--to-dir", str(out), output="json")
    assert exported.exit_code == 0, exported.stderr
    assert [json.loads(line)["queue_offset"] for line in (out / TOPIC / "0.jsonl").read_text().splitlines()] == KEPT
    assert len((out / TOPIC / "1.jsonl").read_text().splitlines()) == QUEUE_1

    # Produce more and archive: offsets continue, nothing already archived is written again.
    listed_before = cold_objects(node, request)
    produce(node, 0, 40)
    produce(node, 1, 10)
    assert node("put", "Later", "0", input="new topic\n").exit_code == 0
    archive(node)
    after_run = snapshot(url)
    # A topic created after the rebuild takes a fresh id, none of the rebuilt ones (PostgreSQL's sequence moved).
    assert after_run["topics"]["Later"]["id"] > max(row["id"] for row in before["topics"].values())
    assert after_run["queues"][(TOPIC, 0)]["max_offset"] == END + 40
    assert after_run["queues"][(TOPIC, 1)]["max_offset"] == QUEUE_1 + 10
    listed_after = cold_objects(node, request)
    for key, size in listed_before.items():
        grown = listed_after.get(key)
        # An S3 chunk never changes; on POSIX only a file's last segment grows, by appends.
        assert grown == size or (node.cold_url is None and grown is not None and grown > size), key
    again = node("verify", "--deep", output="json")
    assert again.exit_code == 0, again.stdout
    assert again.json()["records"] == len(KEPT) + QUEUE_1 + 3 + 50 + 1
    tail = node("read", TOPIC, "0", "--offset", str(END), "--count", "40", "--tier", "cold", output="json")
    assert [m["queue_offset"] for m in tail.json_lines()] == list(range(END, END + 40))
    assert tail.json_lines()[1]["body"] == "order 0-1"  # the new message at offset END + 1, not an old one


def test_rebuild_into_a_database_that_is_not_empty_is_refused_and_changes_nothing(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    produce(node, 0, 30)
    archive(node)
    url = node_config(node, monkeypatch).effective_metadata_url
    before = snapshot(url)
    result = node("db", "rebuild", "--from-cold")
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "is not empty" in lines[0] and lines[0].startswith("tieredstore: error: ")
    assert snapshot(url) == before


def test_rebuild_needs_from_cold(posix: Node) -> None:
    result = posix("db", "rebuild")
    assert result.exit_code == 2 and "--from-cold" in result.stderr
    assert not (posix.data_dir / "metadata.db").exists()


def test_commit_log_bytes_of_a_commit_in_flight_are_cut_as_a_restart_cuts_them(
    posix: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    produce(posix, 0, 120)
    archive(posix)
    config = node_config(posix, monkeypatch)
    queue = queue_path(config.cluster, config.broker, TOPIC, 0)
    position = snapshot(config.effective_metadata_url)
    last_log = max(
        (base for path, kind, base in position["segments"] if path == queue and kind == "COMMIT_LOG"), default=0
    )
    segment_file = posix.data_dir / "cold" / segment_key(queue, FileType.COMMIT_LOG, last_log)
    archived_size = segment_file.stat().st_size
    with segment_file.open("ab") as tail:
        tail.write(b"\x00" * 100)  # the commit log's half of a commit whose consume-queue half never landed
    drop_database(posix, config.effective_metadata_url)

    result = posix("db", "rebuild", "--from-cold", output="json")
    assert result.exit_code == 0, result.stderr
    (rebuilt,) = [q for q in result.json()["queues"] if q["topic"] == TOPIC]
    assert (rebuilt["max_offset"], rebuilt["orphan_bytes_removed"], rebuilt["dropped_units"]) == (120, 100, 0)
    assert segment_file.stat().st_size == archived_size
    rows = snapshot(config.effective_metadata_url)["segments"]
    assert rows[(queue, "COMMIT_LOG", last_log)]["size"] == archived_size
    deep = posix("verify", "--deep", output="json")
    assert deep.exit_code == 0 and deep.json()["notes"] == [], deep.stdout


def test_rebuild_with_no_archive_under_the_cold_url_is_not_found(posix: Node) -> None:
    posix.data_dir.mkdir(parents=True)
    result = posix("db", "rebuild", "--from-cold")
    assert result.exit_code == 3
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "nothing to rebuild" in lines[0]
