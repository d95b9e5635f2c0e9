"""SIGKILL of ``tieredstore table sync`` while it writes its first Parquet file, then a restart: every archived
message is in the table exactly once, and the killed sync's unreferenced file is gone (orphan_grace 0)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.table.conftest import TOPIC, TableNode, messages, table_node_on, table_rows
from tieredstore.table.orphans import referenced_data_files

QUEUES = 8
PER_QUEUE = 200
# 1 MiB commits (the smallest target) of ~4 KiB bodies: several commits, each file written over some time.
SETTINGS = {"TIEREDSTORE_TABLE__TARGET_FILE_SIZE": str(1 << 20), "TIEREDSTORE_TABLE__ORPHAN_GRACE": "0"}


def start_sync(node: TableNode, stderr: Path) -> subprocess.Popen[bytes]:
    command = [str(Path(sys.executable).parent / "tieredstore"), *node.node.flags, "table", "sync", TOPIC]
    env = {**os.environ, **node.node.env, **SETTINGS}
    with stderr.open("wb") as sink:
        return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=sink)


def parquet_files(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.parquet")) if folder.exists() else []


@pytest.mark.slow
def test_sigkill_mid_write_then_restart_gives_every_row_once_and_removes_the_orphan(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    node = table_node_on("posix-sqlite", request, tmp_path)
    node.put({(TOPIC, q): messages(q, range(PER_QUEUE), body_size=4096) for q in range(QUEUES)})
    data = Path(node.archive.cold_url) / "iceberg" / "tieredstore" / TOPIC / "data"

    syncing = start_sync(node, tmp_path / "killed.txt")
    deadline = time.monotonic() + 60
    while not parquet_files(data):
        assert syncing.poll() is None, (tmp_path / "killed.txt").read_text()
        assert time.monotonic() < deadline, "no Parquet file appeared"
        time.sleep(0.001)
    syncing.send_signal(signal.SIGKILL)
    syncing.wait(timeout=30)
    assert syncing.returncode == -signal.SIGKILL

    left = parquet_files(data)
    table: Any = node.table()
    referenced = {path.removeprefix("file://") for path in referenced_data_files(table)}
    orphans = [path for path in left if str(path) not in referenced]
    assert orphans, f"the first file was committed before the kill: {left}"

    finished = subprocess.run(
        [str(Path(sys.executable).parent / "tieredstore"), *node.node.flags, "--output", "json", "table", "sync"],
        env={**os.environ, **node.node.env, **SETTINGS},
        capture_output=True,
        check=False,
        timeout=300,
    )
    assert finished.returncode == 0, finished.stderr.decode()
    (report,) = json.loads(finished.stdout)["topics"]
    assert report["commits"] > 2  # bounded memory: a commit per ~1 MiB of rows, not one for the whole topic

    rows = table_rows(node.table())
    keys = [(row["queue_id"], row["queue_offset"]) for row in rows]
    assert len(rows) == QUEUES * PER_QUEUE
    assert len(set(keys)) == len(keys)
    assert rows == node.expected()
    assert not any(path.exists() for path in orphans)
    referenced = {path.removeprefix("file://") for path in referenced_data_files(node.table())}
    assert {str(path) for path in parquet_files(data)} == referenced


@pytest.mark.parametrize("pair", ["posix-sqlite", pytest.param("s3-postgres", marks=pytest.mark.postgres)])
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
