"""A synced table's files under the cold URL are invisible to every listing of the archive: ``db rebuild``,
``scrub`` and a Spark scan that lists the cold URL instead of reading metadata."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.spark.helpers import sort_key
from tests.table.conftest import TOPIC, TableNode, messages, table_node_on, table_rows
from tieredstore.scan import ScanOptions, plan_partitions, read_partition


@pytest.fixture
def synced(request: pytest.FixtureRequest, tmp_path: Path) -> TableNode:
    node = table_node_on("posix-sqlite", request, tmp_path)
    node.put({(TOPIC, 0): messages(0, range(50)), (TOPIC, 1): messages(1, range(30))})
    assert node("table", "sync").exit_code == 0
    assert len(table_rows(node.table())) == 80
    assert list((Path(node.archive.cold_url) / "iceberg").rglob("*.parquet"))
    return node


def test_scrub_finds_no_orphan_among_the_tables_files(synced: TableNode) -> None:
    result = synced("scrub", output="json")
    assert result.exit_code == 0, result.stderr
    report = result.json()
    assert report["orphans"] == []
    assert "iceberg" not in json.dumps(report)


def test_db_rebuild_from_cold_sees_only_the_archive(synced: TableNode) -> None:
    (synced.node.data_dir / "metadata.db").rename(synced.node.data_dir / "lost.db")
    result = synced("db", "rebuild", "--from-cold", output="json")
    assert result.exit_code == 0, result.stderr
    summary = result.json()
    assert summary["skipped"] == []
    assert sorted((q["topic"], q["queue_id"], q["max_offset"]) for q in summary["queues"]) == [
        (TOPIC, 0, 50),
        (TOPIC, 1, 30),
    ]
    assert "iceberg" not in result.stdout


def test_a_spark_scan_by_listing_reads_only_the_archive(synced: TableNode) -> None:
    options = ScanOptions(topics=(TOPIC,), cold_url=synced.archive.cold_url, metadata_url=None, broker=None)
    plans = plan_partitions(options)
    assert all("iceberg" not in plan.layout.path for plan in plans)
    rows = [row for plan in plans for batch in read_partition(plan, options) for row in batch.to_pylist()]
    assert sorted((row["queue_id"], row["queue_offset"]) for row in rows) == [
        (row["queue_id"], row["queue_offset"]) for row in sorted(synced.expected(), key=sort_key)
    ]
