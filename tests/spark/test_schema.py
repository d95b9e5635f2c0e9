"""A query that gives its own schema gets (and makes the source build) only those columns, on local[2]."""

from __future__ import annotations

import pytest
from pyspark.errors import AnalysisException, PythonException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import LongType, StructField, StructType

from tests.spark.helpers import Archive
from tieredstore.errors import ConfigError
from tieredstore.spark.schema import requested_columns, spark_schema

pytestmark = pytest.mark.spark


def load(spark: SparkSession, archive: Archive, schema: str | StructType) -> DataFrame:
    return spark.read.format("tieredstore").schema(schema).options(**archive.options()).load("orders")


def test_a_narrower_schema_returns_those_columns_in_its_order(spark: SparkSession, posix_archive: Archive) -> None:
    frame = load(spark, posix_archive, "queue_offset BIGINT, msg_id STRING, queue_id INT")
    assert frame.columns == ["queue_offset", "msg_id", "queue_id"]
    got = sorted((row.queue_id, row.queue_offset, row.msg_id) for row in frame.collect())
    expected = sorted((row["queue_id"], row["queue_offset"], row["msg_id"]) for row in posix_archive.expected("orders"))
    assert got == expected


def test_count_and_filters_work_on_one_column(spark: SparkSession, posix_archive: Archive) -> None:
    frame = load(spark, posix_archive, "queue_id INT")
    assert frame.count() == len(posix_archive.expected("orders"))
    assert frame.where("queue_id = 1").count() == sum(r["queue_id"] == 1 for r in posix_archive.expected("orders"))


def test_the_full_schema_given_explicitly_is_the_default(spark: SparkSession, posix_archive: Archive) -> None:
    given = load(spark, posix_archive, spark_schema()).where("queue_id = 2").orderBy("queue_offset")
    default = (
        spark.read.format("tieredstore")
        .options(**posix_archive.options())
        .load("orders")
        .where("queue_id = 2")
        .orderBy("queue_offset")
    )
    assert given.collect() == default.collect()


@pytest.mark.parametrize(
    ("schema", "complaint"),
    [
        ("queue_offset BIGINT, nosuch STRING", "no column 'nosuch'"),
        ("queue_offset INT", "'queue_offset' is bigint, not int"),
        ("properties MAP<STRING, INT>", "'properties' is map<string,string>, not map<string,int>"),
    ],
)
def test_a_schema_that_does_not_fit_fails_clearly(
    spark: SparkSession, posix_archive: Archive, schema: str, complaint: str
) -> None:
    with pytest.raises((AnalysisException, PythonException), match=complaint):
        load(spark, posix_archive, schema).collect()


def test_requested_columns_refuses_not_null_and_repeats() -> None:
    with pytest.raises(ConfigError, match="nullable"):
        requested_columns(StructType([StructField("queue_offset", LongType(), nullable=False)]))
    with pytest.raises(ConfigError, match="named twice"):
        requested_columns(StructType([StructField("queue_offset", LongType())] * 2))
    assert requested_columns(spark_schema()) == tuple(spark_schema().fieldNames())
