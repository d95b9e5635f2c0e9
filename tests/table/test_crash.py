"""SIGKILL of ``tieredstore table sync`` while it writes its first Parquet file, then a restart: every archived
message is in the table exactly once, and the killed sync's unreferenced files are gone (orphan_grace 0); on
POSIX + SQLite and S3 (moto over HTTP) + PostgreSQL."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.table.conftest import TOPIC, TableNode, messages, table_node_on, table_rows
from tests.table.killed_sync import CLI, catalog_held, folder_files, kill_when, referenced_files, start_sync
from tieredstore.table.catalog import open_catalog, table_path
from tieredstore.table.sync import create_table

QUEUES = 4
PER_QUEUE = 200
# 1 MiB commits (the smallest target) of ~4 KiB bodies: several commits, each file written over some time.
SETTINGS = {"TIEREDSTORE_TABLE__TARGET_FILE_SIZE": str(1 << 20), "TIEREDSTORE_TABLE__ORPHAN_GRACE": "0"}
PAIRS = ["posix-sqlite", pytest.param("s3-postgres", marks=pytest.mark.postgres)]


def data_file_written(node: TableNode) -> bool:
    """Whether the first Parquet file is there: on POSIX from its open (so the kill lands mid-write); on S3
    once stored, as an object (a data file goes up in one PUT once encoded: killed before, it leaves nothing).
    """
    if node.s3 is None:
        data = Path(node.archive.cold_url) / "iceberg" / "tieredstore" / TOPIC / "data"
        return data.exists() and any(data.rglob("*.parquet"))
    bucket, _, root = node.archive.cold_url.removeprefix("s3://").partition("/")
    prefix = f"{root}/{table_path(node.config(), TOPIC)}/data/"
    return bool(node.s3_client().list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents"))


@pytest.mark.slow
@pytest.mark.parametrize("pair", PAIRS)
def test_sigkill_mid_write_then_restart_gives_every_row_once_and_removes_the_orphan(
    pair: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    node = table_node_on(pair, request, tmp_path)
    node.put({(TOPIC, q): messages(q, range(PER_QUEUE), body_size=4096) for q in range(QUEUES)})
    create_table(open_catalog(node.config()), node.config(), TOPIC)
    stderr = tmp_path / "killed.txt"

    # The catalog row held, so the kill lands before the first commit however slowly the poll sees the write.
    with catalog_held(node):
        syncing = start_sync(node, stderr, SETTINGS)
        kill_when(syncing, stderr, lambda: data_file_written(node))

    table: Any = node.table()
    assert table.current_snapshot() is None  # nothing committed
    left = folder_files(node) - referenced_files(node)
    assert any(name.startswith("data/") for name in left), f"no Parquet file left by the kill: {left}"

    finished = subprocess.run(
        [CLI, *node.node.flags, "--output", "json", "table", "sync"],
        env={**os.environ, **node.node.env, **SETTINGS},
        capture_output=True,
        check=False,
        timeout=300,
    )
    assert finished.returncode == 0, finished.stderr.decode()
    (report,) = json.loads(finished.stdout)["topics"]
    assert report["orphans_deleted"] == sum(name.startswith("data/") for name in left)
    assert report["commits"] > 2  # bounded memory: a commit per ~1 MiB of rows, not one for the whole topic

    rows = table_rows(node.table())
    keys = [(row["queue_id"], row["queue_offset"]) for row in rows]
    assert len(rows) == QUEUES * PER_QUEUE
    assert len(set(keys)) == len(keys)
    assert rows == node.expected()
    assert not left & folder_files(node)
    assert folder_files(node) == referenced_files(node)


@pytest.mark.parametrize("pair", PAIRS)
def test_a_stray_data_file_goes_once_older_than_the_grace_and_not_before(
    pair: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    node = table_node_on(pair, request, tmp_path)
    node.put({(TOPIC, 0): messages(0, range(20))})
    assert node("table", "sync").exit_code == 0
    table: Any = node.table()
    stray = f"{table.location()}/data/store_timestamp_day=2026-05-01/00000-0-left-by-a-killed-sync.parquet"
    with table.io.new_output(stray).create() as out:
        out.write(b"PAR1 half a file")
    node.put({(TOPIC, 0): messages(0, range(20, 30))})

    kept = node("table", "sync", output="json")  # the default grace (1 h): the file may be a commit in flight
    assert kept.json()["topics"][0]["orphans_deleted"] == 0
    assert table.io.new_input(stray).exists()

    node.node.env["TIEREDSTORE_TABLE__ORPHAN_GRACE"] = "0"
    removed = node("table", "sync", output="json")
    assert removed.exit_code == 0, removed.stderr
    assert removed.json()["topics"][0]["orphans_deleted"] == 1
    assert not table.io.new_input(stray).exists()
    assert len(table_rows(node.table())) == 30  # every referenced file stays
