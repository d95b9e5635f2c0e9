"""A ``table sync`` SIGKILLed during its catalog commit leaves a metadata file, a manifest list, manifests and
data files that nothing references; the next sync deletes them once older than ``orphan_grace``, never before,
and leaves the table's folder holding exactly what its metadata references."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.table.conftest import TOPIC, messages, table_node_on, table_rows
from tests.table.killed_sync import catalog_held, folder_files, kill_when, referenced_files, start_sync

PAIRS = ["posix-sqlite", pytest.param("s3-postgres", marks=pytest.mark.postgres)]


def metadata_kinds(names: set[str]) -> dict[str, int]:
    """How many metadata files, manifest lists and manifests ``names`` hold (the rest under ``data/``)."""
    inside = [name.removeprefix("metadata/") for name in names if name.startswith("metadata/")]
    return {
        "metadata": sum(name.endswith(".metadata.json") for name in inside),
        "manifest list": sum(name.startswith("snap-") and name.endswith(".avro") for name in inside),
        "manifest": sum(not name.startswith("snap-") and name.endswith(".avro") for name in inside),
        "data": sum(name.startswith("data/") for name in names),
    }


@pytest.mark.parametrize("pair", PAIRS)
def test_a_sync_killed_in_its_commit_leaves_metadata_orphans_that_the_next_sweep_deletes(
    pair: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    node = table_node_on(pair, request, tmp_path)
    node.put({(TOPIC, q): messages(q, range(40)) for q in range(2)})
    assert node("table", "sync").exit_code == 0
    node.put({(TOPIC, q): messages(q, range(40, 90), day=1) for q in range(2)})
    before = folder_files(node)
    stderr = tmp_path / "killed.txt"

    # The catalog row held: the sync writes its files and its metadata file, then waits on the commit.
    with catalog_held(node):
        syncing = start_sync(node, stderr, {})
        kill_when(syncing, stderr, lambda: metadata_kinds(folder_files(node) - before)["metadata"] > 0)

    orphans = folder_files(node) - referenced_files(node)
    assert orphans == folder_files(node) - before
    assert metadata_kinds(orphans) == {"metadata": 1, "manifest list": 1, "manifest": 1, "data": 1}, orphans
    assert len(table_rows(node.table())) == 80  # the killed sync committed nothing

    kept = node("table", "sync", output="json")  # the default grace (1 h): each may be a commit in flight
    assert kept.exit_code == 0, kept.stderr
    (report,) = kept.json()["topics"]
    assert (report["rows_added"], report["orphans_deleted"], report["metadata_orphans_deleted"]) == (100, 0, 0)
    assert orphans <= folder_files(node)

    node.node.env["TIEREDSTORE_TABLE__ORPHAN_GRACE"] = "0"
    swept = node("table", "sync", output="json")
    assert swept.exit_code == 0, swept.stderr
    (report,) = swept.json()["topics"]
    assert (report["rows_added"], report["orphans_deleted"], report["metadata_orphans_deleted"]) == (0, 1, 3)
    assert folder_files(node) == referenced_files(node)
    rows = table_rows(node.table())
    assert rows == node.expected()  # every row once, in (queue, offset) order
    assert len({(row["queue_id"], row["queue_offset"]) for row in rows}) == 180


def test_the_sweep_names_what_it_deleted_and_leaves_other_files_alone(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    node = table_node_on("posix-sqlite", request, tmp_path)
    node.put({(TOPIC, 0): messages(0, range(10))})
    assert node("table", "sync").exit_code == 0
    node.put({(TOPIC, 0): messages(0, range(10, 20))})
    before = folder_files(node)
    stderr = tmp_path / "killed.txt"
    with catalog_held(node):
        syncing = start_sync(node, stderr, {})
        kill_when(syncing, stderr, lambda: metadata_kinds(folder_files(node) - before)["metadata"] > 0)
    table = node.table()
    # Unreferenced too, but not the sweep's: other files in the folder, in a folder named like metadata/, and
    # in another table's folder whose name starts with this one's.
    others = [
        f"{table.location()}/metadata/version-hint.text",
        f"{table.location()}/notes.txt",
        f"{table.location()}/metadata-old/snap-2-0-old.avro",
        f"{table.location()}-old/metadata/snap-1-0-old.avro",
        f"{table.location()}-old/data/old.parquet",
    ]
    for path in others:
        with table.io.new_output(path).create() as out:
            out.write(b"not this table's")
    node.node.env["TIEREDSTORE_TABLE__ORPHAN_GRACE"] = "0"

    swept = node("table", "sync", TOPIC)

    assert swept.exit_code == 0, swept.stderr
    assert "10 rows added" in swept.stdout
    assert "1 orphan files deleted, 3 orphan metadata files deleted" in swept.stdout
    assert all(table.io.new_input(path).exists() for path in others)
    assert folder_files(node) == referenced_files(node) | {
        "metadata/version-hint.text",
        "notes.txt",
        "metadata-old/snap-2-0-old.avro",
    }
