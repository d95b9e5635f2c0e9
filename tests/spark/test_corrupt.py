"""Corrupt commit-log records: a task fails naming the object and offset, or (on_corrupt=skip) skips and counts."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from pyspark.errors import PythonException
from pyspark.sql import SparkSession

from tests.spark.helpers import BROKER, CLUSTER, Archive, archive_messages, make_message, sort_key, spark_row
from tieredstore.errors import CorruptRecordError
from tieredstore.formats.naming import FileType, queue_path, segment_key
from tieredstore.scan import ReadStats, ScanOptions, plan_partitions, read_partition

pytestmark = pytest.mark.spark

TOPIC = "damaged"
CRC_BROKEN = 4  # a v1 record with IPv4 hosts: its body starts 88 bytes in
MAGIC_BROKEN = 9


@pytest.fixture(scope="module")
def damaged(tmp_path_factory: pytest.TempPathFactory) -> tuple[Archive, str]:
    """An archive of 30 small messages in one segment, two of them damaged on disk; and that segment's key."""
    root = tmp_path_factory.mktemp("spark-damaged")
    archive = Archive("posix", str(root / "cold"), f"sqlite:///{root / 'metadata.db'}")
    messages = [make_message(TOPIC, 0, offset, body_size=100) for offset in range(30)]
    asyncio.run(archive_messages(archive, {}, {(TOPIC, 0): messages}))
    key = segment_key(queue_path(CLUSTER, BROKER, TOPIC, 0), FileType.COMMIT_LOG, 0)
    offsets = {row["queue_offset"]: row["commitlog_offset"] for row in archive.rows[TOPIC]}
    with open(Path(archive.cold_url, key), "r+b") as segment_file:
        segment_file.seek(offsets[CRC_BROKEN] + 88)
        first = segment_file.read(1)
        segment_file.seek(offsets[CRC_BROKEN] + 88)
        segment_file.write(bytes([first[0] ^ 0xFF]))
        segment_file.seek(offsets[MAGIC_BROKEN] + 4)
        segment_file.write(b"\x00\x00\x00\x00")
    return archive, key


def test_default_fails_the_task_naming_object_and_offset(spark: SparkSession, damaged: tuple[Archive, str]) -> None:
    archive, key = damaged
    offset = next(row["commitlog_offset"] for row in archive.rows[TOPIC] if row["queue_offset"] == CRC_BROKEN)
    frame = spark.read.format("tieredstore").options(**archive.options()).load(TOPIC)
    with pytest.raises(PythonException) as failure:
        frame.collect()
    message = str(failure.value)
    assert "CorruptRecordError" in message
    assert "body CRC mismatch" in message
    assert f"{key} at offset {offset}" in message
    assert f"queue offset {CRC_BROKEN}" in message


def test_skip_returns_every_sound_record(spark: SparkSession, damaged: tuple[Archive, str]) -> None:
    archive, _ = damaged
    frame = spark.read.format("tieredstore").options(**archive.options(on_corrupt="skip")).load(TOPIC)
    expected = [row for row in archive.expected(TOPIC) if row["queue_offset"] not in (CRC_BROKEN, MAGIC_BROKEN)]
    assert sorted((spark_row(row) for row in frame.collect()), key=sort_key) == expected


def test_skip_counts_in_stats_and_the_log(damaged: tuple[Archive, str], caplog: pytest.LogCaptureFixture) -> None:
    archive, key = damaged
    options = ScanOptions.parse({"path": TOPIC, **archive.options(on_corrupt="skip")})
    stats = ReadStats()
    with caplog.at_level(logging.WARNING, logger="tieredstore.scan"):
        rows = [
            row
            for plan in plan_partitions(options)
            for batch in read_partition(plan, options, stats)
            for row in batch.to_pylist()
        ]
    assert [row["queue_offset"] for row in rows] == [q for q in range(30) if q not in (CRC_BROKEN, MAGIC_BROKEN)]
    assert (stats.skipped, stats.records, stats.rows) == (2, 28, 28)
    assert any("skipped 2 corrupt record(s) of 30" in record.getMessage() for record in caplog.records)
    assert sum(key in record.getMessage() and "bad magic" in record.getMessage() for record in caplog.records) == 1


def test_fail_mode_outside_spark_raises_the_typed_error(damaged: tuple[Archive, str]) -> None:
    archive, key = damaged
    options = ScanOptions.parse({"path": TOPIC, **archive.options()})
    (plan,) = plan_partitions(options)
    with pytest.raises(CorruptRecordError) as failure:
        list(read_partition(plan, options))
    assert failure.value.location is not None and failure.value.location.endswith(key)
