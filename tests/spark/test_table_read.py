"""Reading through a topic's Iceberg table (option ``table``) returns exactly what the archive alone returns, on a
real local[2] session over POSIX + SQLite and S3 (moto over HTTP) + PostgreSQL."""

from __future__ import annotations

import asyncio
import dataclasses
import pickle
import re
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession

from tests.spark.helpers import BROKER, CLUSTER, SETTINGS, Row, spark_row
from tests.table.conftest import DAY_MS, FIRST_DAY_MS, TOPIC, TableNode, messages, table_node_on
from tieredstore.errors import ConfigError
from tieredstore.flat import FlatFileStore
from tieredstore.metadata import MetadataStore
from tieredstore.providers.registry import open_provider
from tieredstore.scan import PartitionPlan, ScanFilter, ScanOptions, TableMode
from tieredstore.spark.source import TieredStorePartition
from tieredstore.table.catalog import open_catalog
from tieredstore.table.read_plan import ReadPlan, TableFilePlan, open_tables, plan_read_partitions, row_group_ranges
from tieredstore.table.sync import TableSyncer, create_table

pytestmark = pytest.mark.spark

PAIRS = ["posix-sqlite", pytest.param("s3-postgres", marks=pytest.mark.postgres)]
DAY_1_US, DAY_2_US = (FIRST_DAY_MS + DAY_MS) * 1000, (FIRST_DAY_MS + 2 * DAY_MS) * 1000


def sync(node: TableNode) -> None:
    config = node.config()
    metadata = MetadataStore(config.effective_metadata_url)
    try:
        TableSyncer(config, metadata, open_catalog(config)).sync_topic(TOPIC)
    finally:
        metadata.close()


def partly_synced(node: TableNode) -> None:
    """Four table files (queues 0 and 1, days 0 and 1, one queue each), table offsets {0: 60, 1: 40}; then
    queues 0 and 1 go on in the archive alone (day 2) and queue 2 (day 1) is in no table at all."""
    node.put({(TOPIC, 0): messages(0, range(0, 30), day=0) + messages(0, range(30, 60), day=1)})
    sync(node)
    node.put({(TOPIC, 1): messages(1, range(0, 20), day=0) + messages(1, range(20, 40), day=1)})
    sync(node)
    node.put(
        {
            (TOPIC, 0): messages(0, range(60, 90), day=2),
            (TOPIC, 1): messages(1, range(40, 60), day=2),
            (TOPIC, 2): messages(2, range(0, 30), day=1),
        }
    )


@pytest.fixture(params=PAIRS)
def synced(request: pytest.FixtureRequest, tmp_path: Path) -> TableNode:
    """A node on each backend pair in turn, its topic partly synced (``partly_synced``)."""
    node = table_node_on(request.param, request, tmp_path)
    partly_synced(node)
    return node


def options(node: TableNode, table: str, topics: str = TOPIC, **more: str) -> dict[str, str]:
    s3 = {name: str(value) for name, value in node.provider_options.items()}
    return {
        "path": topics,
        "cold_url": node.archive.cold_url,
        "metadata_url": node.archive.metadata_url,
        "table": table,
        **s3,
        **more,
    }


def read(spark: SparkSession, node: TableNode, table: str, topics: str = TOPIC, **more: str) -> DataFrame:
    chosen = options(node, table, topics, **more)
    path = chosen.pop("path")
    return spark.read.format("tieredstore").options(**chosen).load(path)


def collect(frame: DataFrame) -> list[Row]:
    return sorted((spark_row(row) for row in frame.collect()), key=lambda r: (r["queue_id"], r["queue_offset"]))


def plans(node: TableNode, scan_filter: ScanFilter | None = None, **more: str) -> list[ReadPlan]:
    return plan_read_partitions(ScanOptions.parse(options(node, "true", **more)), scan_filter)


def table_files(planned: list[ReadPlan]) -> list[TableFilePlan]:
    return [plan for plan in planned if isinstance(plan, TableFilePlan)]


def archive_starts(planned: list[ReadPlan]) -> dict[int, int]:
    """The first offset each queue's archive partitions start at."""
    starts: dict[int, int] = {}
    for plan in planned:
        if isinstance(plan, PartitionPlan):
            starts[plan.queue_id] = min(starts.get(plan.queue_id, plan.queue_start), plan.queue_start)
    return starts


def test_a_partly_synced_topic_reads_the_same_through_the_table(spark: SparkSession, synced: TableNode) -> None:
    node = synced
    through_table = read(spark, node, "true")
    rows = collect(through_table)
    assert rows == collect(read(spark, node, "false"))
    assert rows == node.expected()
    assert {q: len([r for r in rows if r["queue_id"] == q]) for q in (0, 1, 2)} == {0: 90, 1: 60, 2: 30}

    planned = plans(node)
    assert through_table.rdd.getNumPartitions() == len(planned)
    assert (
        sorted((f.queue_ranges, f.row_groups) for f in table_files(planned)) == [(((0, 0, 60), (1, 0, 40)), None)] * 4
    )
    # The archive is planned only from each queue's table offset on; queue 2, in no table, from its start.
    assert archive_starts(planned) == {0: 60, 1: 40, 2: 0}
    partitions = [TieredStorePartition(plan) for plan in planned]
    assert [partition.plan for partition in pickle.loads(pickle.dumps(partitions))] == planned
    secret = node.provider_options.get("secret_access_key")  # on S3: the table's files are read with it
    assert node.archive.name == "posix-sqlite" or (secret and secret.encode() not in pickle.dumps(partitions))
    # The default (auto) reads through the table too, and the same rows.
    assert collect(read(spark, node, "auto")) == rows


def pairs_of(frame: DataFrame) -> list[tuple[int, bytes]]:
    return sorted((row["queue_id"], bytes(row["body"])) for row in frame.collect())


def test_two_columns_are_read_through_the_table(spark: SparkSession, synced: TableNode) -> None:
    node = synced
    expected = sorted((row["queue_id"], row["body"]) for row in node.expected())
    chosen = options(node, "true")
    path = chosen.pop("path")
    # A schema of two columns is how a query has the source build only those (from Parquet: read only those).
    narrow = spark.read.format("tieredstore").schema("queue_id int, body binary").options(**chosen).load(path)
    assert narrow.columns == ["queue_id", "body"]
    assert pairs_of(narrow) == expected
    assert pairs_of(read(spark, node, "true").select("queue_id", "body")) == expected


FILTERS = {
    # SQL, the ScanFilter Spark pushes for it, and how many of the four table files it leaves.
    "day 1": (
        f"store_timestamp >= timestamp_micros({DAY_1_US}) and store_timestamp < timestamp_micros({DAY_2_US})",
        ScanFilter(timestamp_start_us=DAY_1_US, timestamp_end_us=DAY_2_US),
        2,
    ),
    "queue 1": ("queue_id = 1", ScanFilter(queue_id_start=1, queue_id_end=2), 2),
    "offsets across the table offset": (
        "queue_offset >= 50 and queue_offset < 70",
        ScanFilter(queue_offset_start=50, queue_offset_end=70),
        1,
    ),
}


def test_filters_give_the_same_rows_both_ways_and_prune_table_files(spark: SparkSession, synced: TableNode) -> None:
    node = synced
    assert len(table_files(plans(node))) == 4
    for name, (condition, scan_filter, files) in FILTERS.items():
        through_table = read(spark, node, "true").where(condition)
        rows = collect(through_table)
        assert rows == collect(read(spark, node, "false").where(condition)), name
        assert rows, name
        planned = plans(node, scan_filter)
        assert len(table_files(planned)) == files, name
        assert through_table.rdd.getNumPartitions() == len(planned), name
    day_1 = collect(read(spark, node, "true").where(FILTERS["day 1"][0]))
    assert {(r["queue_id"], r["queue_offset"]) for r in day_1} == {
        *((0, o) for o in range(30, 60)),
        *((1, o) for o in range(20, 40)),
        *((2, o) for o in range(30)),
    }
    across = collect(read(spark, node, "true").where(FILTERS["offsets across the table offset"][0]))
    assert [(r["queue_id"], r["queue_offset"]) for r in across] == [(0, o) for o in range(50, 70)] + [
        (1, o) for o in range(50, 60)
    ]


async def _expire_before(node: TableNode, queue_id: int, before_ms: int) -> int:
    metadata = MetadataStore.open(node.archive.metadata_url)
    try:
        async with open_provider(node.archive.cold_url, **node.provider_options) as provider:
            store = FlatFileStore(provider, metadata, cluster=CLUSTER, broker=BROKER, settings=SETTINGS)
            flat_file = await store.get_or_create(TOPIC, queue_id)
            await flat_file.destroy_expired(before_ms)
            return flat_file.min_offset
    finally:
        metadata.close()


def test_offsets_retention_removed_from_the_archive_are_not_read_from_the_table(
    spark: SparkSession, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    node = table_node_on("posix-sqlite", request, tmp_path)
    partly_synced(node)
    first_left = asyncio.run(_expire_before(node, 0, FIRST_DAY_MS + DAY_MS))
    assert 0 < first_left <= 30  # day 0 left the archive (a segment or more); the table still holds it
    rows = collect(read(spark, node, "true"))
    assert rows == collect(read(spark, node, "false"))
    assert min(r["queue_offset"] for r in rows if r["queue_id"] == 0) == first_left
    assert len(rows) == 90 - first_left + 60 + 30


def test_table_true_without_a_table_fails_with_one_line(
    spark: SparkSession, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    node = table_node_on("posix-sqlite", request, tmp_path)
    partly_synced(node)
    node.put({("payments", 0): [dataclasses.replace(m, topic="payments") for m in messages(0, range(5))]})
    message = "option table=true but topic(s) ['payments'] have no Iceberg table in namespace 'tieredstore'"
    with pytest.raises(Exception, match=re.escape(message)):
        read(spark, node, "true", "payments").collect()
    with pytest.raises(ConfigError, match=re.escape(message)):
        plan_read_partitions(ScanOptions.parse(options(node, "true", "payments")))
    # auto reads that topic from the archive alone, and false never looks for a table.
    assert len(collect(read(spark, node, "auto", "payments"))) == 5
    assert len(collect(read(spark, node, "false", "payments"))) == 5


def test_a_file_bigger_than_a_partition_is_read_as_ranges_of_row_groups(
    spark: SparkSession, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    node = table_node_on("posix-sqlite", request, tmp_path)
    MetadataStore.open(node.archive.metadata_url).close()  # the schema, where the catalog's tables go too
    config = node.config()
    with create_table(open_catalog(config), config, TOPIC).transaction() as transaction:
        transaction.set_properties({"write.parquet.row-group-limit": "8"})
    partly_synced(node)
    planned = plans(node, max_partition_bytes="4096")
    files = table_files(planned)
    split = [plan for plan in files if plan.row_groups is not None]
    assert split and len(files) > 4
    rows = collect(read(spark, node, "true", max_partition_bytes="4096"))
    assert rows == collect(read(spark, node, "false"))
    assert rows == node.expected()


def test_table_true_without_a_catalog_is_a_config_error(tmp_path: Path) -> None:
    listed = ScanOptions.parse({"path": TOPIC, "cold_url": f"file://{tmp_path}", "metadata": "none", "table": "true"})
    with pytest.raises(ConfigError, match="option table=true but no catalog is given"):
        open_tables(listed, [TOPIC])
    assert open_tables(dataclasses.replace(listed, table=TableMode.AUTO), [TOPIC]) == {}
    with pytest.raises(ConfigError, match="option table must be auto, true or false, not 'yes'"):
        ScanOptions.parse({"path": TOPIC, "cold_url": f"file://{tmp_path}", "metadata": "none", "table": "yes"})


def test_row_groups_are_cut_at_the_budget() -> None:
    assert row_group_ranges(None, 10_000, 100) == [None]
    assert row_group_ranges([4, 50, 90], 120, 1000) == [None]
    assert row_group_ranges([4, 50, 90, 160], 200, 80) == [(0, 2), (2, 4)]
    assert row_group_ranges([4, 500, 900], 1000, 80) == [(0, 1), (1, 2), (2, 3)]
