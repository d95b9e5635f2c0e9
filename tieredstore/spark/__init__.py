"""Reading archives with Spark: the ``tieredstore`` Python data source (pyspark 4.x, no JARs).

    from tieredstore.spark import register
    register(spark)
    df = spark.read.format("tieredstore").option("metadata_url", ...).option("cold_url", ...).load("orders")

Without Spark, ``plan_partitions`` and ``read_partition`` drive the same scan (benchmarks, tests).
"""

from tieredstore.spark.filters import ScanFilter, push_filters
from tieredstore.spark.options import OnCorrupt, ScanOptions
from tieredstore.spark.planning import PartitionPlan, plan_partitions, plan_scan
from tieredstore.spark.reading import ReadStats, read_partition
from tieredstore.spark.schema import ARROW_SCHEMA, COLUMNS, spark_schema
from tieredstore.spark.source import FORMAT_NAME, TieredStoreDataSource, TieredStoreReader, register

__all__ = [
    "ARROW_SCHEMA",
    "COLUMNS",
    "FORMAT_NAME",
    "OnCorrupt",
    "PartitionPlan",
    "ReadStats",
    "ScanFilter",
    "ScanOptions",
    "TieredStoreDataSource",
    "TieredStoreReader",
    "plan_partitions",
    "plan_scan",
    "push_filters",
    "read_partition",
    "register",
    "spark_schema",
]
