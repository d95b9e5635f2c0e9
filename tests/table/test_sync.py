"""``tieredstore table sync``: a backfill gives exactly the archive, a second sync only what is new, lost
offsets no rows; on all four backend pairs (POSIX or S3 cold, SQLite or PostgreSQL catalog)."""

from __future__ import annotations

import collections
import io
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.cli.framed import BACKEND_PAIRS
from tests.table.conftest import TOPIC, TableNode, messages, table_node_on, table_rows
from tieredstore.table.offsets import OFFSETS_PROPERTY, read_offsets


@pytest.fixture(params=BACKEND_PAIRS)
def pair_node(request: pytest.FixtureRequest, tmp_path: Any) -> TableNode:
    return table_node_on(request.param, request, tmp_path)


def data_files(table: Any) -> list[str]:
    return [task.file.file_path for task in table.scan().plan_files()]


def parquet_of(table: Any, path: str) -> pq.ParquetFile:
    with table.io.new_input(path).open() as stream:
        return pq.ParquetFile(io.BytesIO(stream.read()))


def assert_rows_are_the_archive(node: TableNode) -> None:
    rows = table_rows(node.table())
    expected = node.expected()
    keys = [(row["queue_id"], row["queue_offset"]) for row in rows]
    assert len(keys) == len(set(keys)), [key for key, n in collections.Counter(keys).items() if n > 1][:5]
    assert keys == [(row["queue_id"], row["queue_offset"]) for row in expected]
    assert rows == expected


def test_backfill_gives_the_archive_and_a_second_sync_only_the_new_messages(pair_node: TableNode) -> None:
    # Queue 1 lost offsets [30, 50) before they were archived; queue 0 spans two days.
    pair_node.put(
        {
            (TOPIC, 0): messages(0, range(0, 60), day=0) + messages(0, range(60, 120), day=1),
            (TOPIC, 1): messages(1, [*range(0, 30), *range(50, 80)], day=1),
        }
    )
    synced = pair_node("table", "sync", TOPIC, output="json")
    assert synced.exit_code == 0, synced.stderr
    (report,) = synced.json()["topics"]
    assert report["rows_added"] == 180
    assert report["commits"] == 1  # both days' files in one snapshot, with the offsets
    assert (report["table_offset"], report["archived_offset"], report["lag"]) == (200, 200, 0)
    assert_rows_are_the_archive(pair_node)

    table = pair_node.table()
    assert read_offsets(table) == {0: 120, 1: 80}  # queue 1 moved past its lost range
    files = data_files(table)
    root = pair_node.archive.cold_url.rstrip("/")
    root = root if root.startswith("s3://") else f"file://{root}"
    assert all(path.startswith(f"{root}/iceberg/tieredstore/{TOPIC}/data/store_timestamp_day=") for path in files)
    # One file per day: day 0 holds queue 0's first 60, day 1 the rest of queue 0 and queue 1.
    days = sorted(path.split("store_timestamp_day=")[1].split("/")[0] for path in files)
    assert days == ["2026-05-01", "2026-05-02"]
    # Each file declares the table's (queue_id, queue_offset) order, which its rows are in.
    declared = table.sort_order().order_id
    assert declared != 0  # 0 is "unsorted"
    assert table.inspect.files().column("sort_order_id").to_pylist() == [declared, declared]
    for path in files:
        parquet = parquet_of(table, path)
        assert parquet.metadata.row_group(0).column(0).compression == "ZSTD"
        keys = list(zip(*(parquet.read(columns=["queue_id", "queue_offset"]).to_pydict().values()), strict=True))
        assert keys == sorted(keys)  # within a file, by queue then offset

    # New messages in both queues: the next sync appends those and nothing else.
    pair_node.put({(TOPIC, 0): messages(0, range(120, 150), day=2), (TOPIC, 1): messages(1, range(80, 90), day=2)})
    again = pair_node("table", "sync", output="json")
    assert again.exit_code == 0, again.stderr
    assert [(t["topic"], t["rows_added"], t["lag"]) for t in again.json()["topics"]] == [(TOPIC, 40, 0)]
    assert_rows_are_the_archive(pair_node)
    assert len(table_rows(pair_node.table())) == 220

    # Nothing new: no rows and no snapshot.
    snapshots = len(pair_node.table().snapshots())
    idle = pair_node("table", "sync", TOPIC, output="json")
    assert idle.json()["topics"][0]["rows_added"] == 0
    assert len(pair_node.table().snapshots()) == snapshots
    assert all(OFFSETS_PROPERTY in (s.summary or {}) for s in pair_node.table().snapshots())
