"""Readers that share no code with ours: pyiceberg scanning S3 over HTTP with pruning filters, DuckDB reading the
data files, Spark's own Parquet reader against the ``tieredstore`` source."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import duckdb
import pytest

from tests.spark.helpers import spark_row
from tests.table.conftest import DAY_MS, FIRST_DAY_MS, TOPIC, TableNode, messages, table_node_on, table_rows
from tieredstore.spark import register


def two_syncs_over_three_days(node: TableNode) -> None:
    """Queue 0 over days 0-2, synced; then queue 1 over the same days, synced: six files, one queue each."""
    node.put({(TOPIC, 0): messages(0, range(0, 30), day=0) + messages(0, range(30, 60), day=1)})
    node.put({(TOPIC, 0): messages(0, range(60, 90), day=2)})
    assert node("table", "sync").exit_code == 0
    node.put({(TOPIC, 1): messages(1, range(0, 20), day=0) + messages(1, range(20, 40), day=1)})
    node.put({(TOPIC, 1): messages(1, range(40, 60), day=2)})
    assert node("table", "sync").exit_code == 0


def current_files(node: TableNode) -> list[str]:
    return [task.file.file_path for task in node.table().scan().plan_files()]


def day(n: int) -> str:
    return datetime.datetime.fromtimestamp((FIRST_DAY_MS + n * DAY_MS) / 1000, tz=datetime.UTC).isoformat()


@pytest.mark.parametrize("pair", ["s3-sqlite", pytest.param("s3-postgres", marks=pytest.mark.postgres)])
def test_pyiceberg_scans_s3_and_filters_on_time_and_queue_prune_files(
    pair: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    from pyiceberg.expressions import And, EqualTo, GreaterThanOrEqual, LessThan

    node = table_node_on(pair, request, tmp_path)
    two_syncs_over_three_days(node)
    table = node.table()
    assert all(path.startswith(node.archive.cold_url + "/iceberg/") for path in current_files(node))

    day_1 = And(GreaterThanOrEqual("store_timestamp", day(1)), LessThan("store_timestamp", day(2)))
    queue_1 = EqualTo("queue_id", 1)
    counts = {
        "all": len(list(table.scan().plan_files())),
        "day": len(list(table.scan(row_filter=day_1).plan_files())),
        "queue": len(list(table.scan(row_filter=queue_1).plan_files())),
        "both": len(list(table.scan(row_filter=And(day_1, queue_1)).plan_files())),
    }
    assert counts == {"all": 6, "day": 2, "queue": 3, "both": 1}
    rows = table_rows(table, And(day_1, queue_1))
    assert [row["queue_offset"] for row in rows] == list(range(20, 40))
    assert rows == [row for row in node.expected() if row["queue_id"] == 1 and 20 <= row["queue_offset"] < 40]


def test_duckdb_reads_the_current_snapshots_parquet_files(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    node = table_node_on("posix-sqlite", request, tmp_path)
    two_syncs_over_three_days(node)
    files = [path.removeprefix("file://") for path in current_files(node)]
    expected = node.expected()
    (counted,) = duckdb.sql(
        "select count(*), sum(queue_offset), sum(octet_length(body)), count(distinct (queue_id, queue_offset)) "
        f"from read_parquet({files!r})"
    ).fetchall()
    assert counted == (
        len(expected),
        sum(row["queue_offset"] for row in expected),
        sum(len(row["body"]) for row in expected),
        len(expected),
    )
    per_day = duckdb.sql(
        f"select cast(store_timestamp as date)::varchar d, count(*) from read_parquet({files!r}) group by d order by d"
    ).fetchall()
    assert per_day == [("2026-05-01", 50), ("2026-05-02", 50), ("2026-05-03", 50)]


@pytest.mark.spark
def test_sparks_parquet_reader_returns_the_rows_of_the_tieredstore_source(
    spark: Any, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    node = table_node_on("posix-sqlite", request, tmp_path)
    two_syncs_over_three_days(node)
    files = current_files(node)
    from_table = sorted(
        (spark_row(row) for row in spark.read.parquet(*files).collect()),
        key=lambda r: (r["queue_id"], r["queue_offset"]),
    )
    register(spark)
    source = (
        spark.read.format("tieredstore")
        .option("cold_url", node.archive.cold_url)
        .option("metadata_url", node.archive.metadata_url)
        .option("table", "false")  # the archive alone: not read back through the table under test
        .load(TOPIC)
    )
    from_source = sorted((spark_row(row) for row in source.collect()), key=lambda r: (r["queue_id"], r["queue_offset"]))
    assert len(from_table) == 150
    assert from_table == from_source
