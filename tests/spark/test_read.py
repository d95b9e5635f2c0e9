"""spark.read.format("tieredstore") on a real local[2] session over archives on POSIX and S3 (moto over HTTP)."""

from __future__ import annotations

import pickle
from collections import Counter

import pytest
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession

from tests.spark.conftest import BIG_BODY, ORDER_QUEUES
from tests.spark.helpers import Archive, Row, sort_key, spark_row, store_timestamp
from tieredstore.scan import ScanOptions, plan_partitions
from tieredstore.spark.source import TieredStorePartition, TieredStoreReader

pytestmark = pytest.mark.spark


def load(spark: SparkSession, archive: Archive, topics: str, **options: str) -> DataFrame:
    metadata = options.pop("metadata", "yes") != "none"
    return spark.read.format("tieredstore").options(**archive.options(metadata=metadata, **options)).load(topics)


def collect(frame: DataFrame) -> list[Row]:
    return sorted((spark_row(row) for row in frame.collect()), key=sort_key)


def plans(archive: Archive, topics: str, **options: str) -> list:  # type: ignore[type-arg]
    return plan_partitions(ScanOptions.parse({"path": topics, **archive.options(**options)}))


def test_every_row_comes_back_as_archived(spark: SparkSession, archive: Archive) -> None:
    frame = load(spark, archive, "orders")
    assert collect(frame) == archive.expected("orders")
    planned = plans(archive, "orders")
    assert frame.rdd.getNumPartitions() == len(planned)
    # Several commit-log segments per queue, so one partition per segment means more partitions than queues.
    assert len(planned) > 2 * len(ORDER_QUEUES)


def test_counts_per_queue(spark: SparkSession, archive: Archive) -> None:
    counts = {
        row["queue_id"]: row["count"] for row in load(spark, archive, "orders").groupBy("queue_id").count().collect()
    }
    assert counts == ORDER_QUEUES


def test_queue_id_filter_prunes_to_that_queue(spark: SparkSession, posix_archive: Archive) -> None:
    archive = posix_archive
    frame = load(spark, archive, "orders").where("queue_id = 1")
    assert collect(frame) == [row for row in archive.expected("orders") if row["queue_id"] == 1]
    queue_plans = [plan for plan in plans(archive, "orders") if plan.queue_id == 1]
    assert frame.rdd.getNumPartitions() == len(queue_plans)

    frame = load(spark, archive, "orders").where("queue_id in (0, 2)")
    assert collect(frame) == [row for row in archive.expected("orders") if row["queue_id"] in (0, 2)]
    assert frame.rdd.getNumPartitions() == len([plan for plan in plans(archive, "orders") if plan.queue_id != 1])


def test_queue_offset_range_reads_only_the_segments_holding_it(spark: SparkSession, s3_archive: Archive) -> None:
    archive = s3_archive
    frame = load(spark, archive, "orders").where("queue_id = 0 and queue_offset >= 100 and queue_offset < 130")
    assert [row["queue_offset"] for row in collect(frame)] == list(range(100, 130))
    assert collect(frame) == [
        row for row in archive.expected("orders") if row["queue_id"] == 0 and 100 <= row["queue_offset"] < 130
    ]
    whole_queue = [plan for plan in plans(archive, "orders") if plan.queue_id == 0]
    holding = [plan for plan in whole_queue if plan.queue_start < 130 and plan.queue_end > 100]
    assert 0 < frame.rdd.getNumPartitions() == len(holding) < len(whole_queue)


def test_store_timestamp_range_is_exact_and_prunes(spark: SparkSession, s3_archive: Archive) -> None:
    archive = s3_archive
    start, end = store_timestamp(0, 50), store_timestamp(0, 80)
    frame = load(spark, archive, "orders").where(
        f"store_timestamp >= timestamp_millis({start}) and store_timestamp <= timestamp_millis({end})"
    )
    expected = [row for row in archive.expected("orders") if start <= row["store_timestamp"] <= end]
    assert {row["queue_id"] for row in expected} == {0, 1, 2}
    assert collect(frame) == expected
    assert frame.rdd.getNumPartitions() < len(plans(archive, "orders"))


def test_topic_filter_and_several_topics(spark: SparkSession, posix_archive: Archive) -> None:
    archive = posix_archive
    both = load(spark, archive, "orders,big")
    assert collect(both) == archive.expected("big", "orders")
    only_big = both.where("topic = 'big'")
    assert collect(only_big) == archive.expected("big")
    assert only_big.rdd.getNumPartitions() == len(plans(archive, "big"))


def test_unsupported_filters_are_left_to_spark(spark: SparkSession, posix_archive: Archive) -> None:
    archive = posix_archive
    frame = load(spark, archive, "orders").where("tags = 'tag1' and size(keys) = 2 and queue_offset % 2 = 1")
    expected = [
        row
        for row in archive.expected("orders")
        if row["tags"] == "tag1" and len(row["keys"]) == 2 and row["queue_offset"] % 2 == 1
    ]
    assert expected
    assert collect(frame) == expected


def test_contradictory_filters_read_nothing(spark: SparkSession, posix_archive: Archive) -> None:
    frame = load(spark, posix_archive, "orders").where("queue_offset > 10 and queue_offset < 5")
    assert frame.count() == 0
    assert frame.rdd.getNumPartitions() == 1  # Spark's placeholder when a source plans none


def test_consume_queue_holes_are_stepped_over(spark: SparkSession, archive: Archive) -> None:
    assert collect(load(spark, archive, "holes")) == archive.expected("holes")
    frame = load(spark, archive, "holes").where(
        f"queue_offset >= 30 and store_timestamp <= timestamp_millis({store_timestamp(0, 65)})"
    )
    assert [row["queue_offset"] for row in collect(frame)] == [30, 31, 32, 60, 61, 62, 63, 64, 65]
    small = load(spark, archive, "holes", max_partition_bytes="8000")
    assert collect(small) == archive.expected("holes")


def test_empty_topic(spark: SparkSession, archive: Archive) -> None:
    frame = load(spark, archive, "empty")
    assert frame.count() == 0
    assert frame.where("queue_id = 0").collect() == []


def test_message_larger_than_a_read_block(spark: SparkSession, archive: Archive) -> None:
    frame = load(spark, archive, "big", read_block_bytes="65536", batch_rows="1")
    rows = collect(frame)
    assert rows == archive.expected("big")
    assert len(rows[1]["body"]) == BIG_BODY


def test_metadata_free_mode_lists_the_cold_url(spark: SparkSession, archive: Archive) -> None:
    frame = load(spark, archive, "orders,big,holes", metadata="none")
    assert collect(frame) == archive.expected("big", "holes", "orders")
    filtered = load(spark, archive, "orders", metadata="none").where("queue_id = 2 and queue_offset >= 30")
    assert collect(filtered) == [
        row for row in archive.expected("orders") if row["queue_id"] == 2 and row["queue_offset"] >= 30
    ]
    assert filtered.rdd.getNumPartitions() < len(plans(archive, "orders", metadata=False))
    # Without metadata a topic that never archived anything has no folder: indistinguishable from a typo.
    with pytest.raises(AnalysisException, match=r"no archive folder for topic\(s\) \['empty'\]"):
        load(spark, archive, "empty", metadata="none").count()


def test_bytes_a_recovery_under_leases_left_in_place_are_never_read(spark: SparkSession, archive: Archive) -> None:
    """Other versions of messages 40..49 lie past the sealed end of a commit-log segment; neither mode
    may return them (metadata records the cut; a listing must bound the segment by the next one)."""
    expected = archive.expected("abandoned")
    assert [row["queue_offset"] for row in expected] == list(range(90))
    assert collect(load(spark, archive, "abandoned")) == expected
    assert collect(load(spark, archive, "abandoned", metadata="none")) == expected


def test_partitions_respect_max_partition_bytes(spark: SparkSession, posix_archive: Archive) -> None:
    budget = 16 * 1024
    small = plans(posix_archive, "orders", max_partition_bytes=str(budget))
    whole = plans(posix_archive, "orders")
    assert len(small) > len(whole)
    assert all(plan.size <= budget or plan.queue_end - plan.queue_start == 1 for plan in small)
    frame = load(spark, posix_archive, "orders", max_partition_bytes=str(budget))
    assert frame.rdd.getNumPartitions() == len(small)
    assert collect(frame) == posix_archive.expected("orders")
    per_queue = Counter(plan.queue_id for plan in small)
    assert set(per_queue) == set(ORDER_QUEUES)


def test_unknown_topic_and_bad_options_fail_clearly(spark: SparkSession, posix_archive: Archive) -> None:
    with pytest.raises(AnalysisException, match="'nosuchtopic' is not in the metadata store"):
        load(spark, posix_archive, "nosuchtopic").count()
    with pytest.raises(AnalysisException, match="unknown tieredstore option"):
        load(spark, posix_archive, "orders", cold_uri="typo")
    with pytest.raises(AnalysisException, match="metadata=none"):
        spark.read.format("tieredstore").option("cold_url", posix_archive.cold_url).load("orders")
    # The keyring is loaded at load() on the driver, before any task could fail for want of it.
    with pytest.raises(AnalysisException, match=r"keyring file /nonexistent/keys\.toml does not exist"):
        load(spark, posix_archive, "orders", keyring_file="/nonexistent/keys.toml")


def test_credentials_stay_out_of_partitions_plans_and_reprs(spark: SparkSession, s3_archive: Archive) -> None:
    secret = s3_archive.storage_options["secret_access_key"]
    options = ScanOptions.parse({"path": "orders", **s3_archive.options()})
    planned = plan_partitions(options)
    partitions = [TieredStorePartition(plan) for plan in planned]
    assert secret.encode() not in pickle.dumps(partitions)
    assert all(secret not in repr(p) and secret not in str(p.plan) for p in partitions)
    assert secret not in repr(TieredStoreReader(options)) and secret not in str(options)
    frame = load(spark, s3_archive, "orders").where("queue_id = 1")
    assert secret not in frame._jdf.queryExecution().toString()
