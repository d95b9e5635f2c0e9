"""The ``tieredstore`` PySpark data source: ``spark.read.format("tieredstore")`` over archived queues.

Spark runs each piece in a Python worker: ``schema`` when ``load()`` is called, ``reader``,
``pushFilters`` and ``partitions`` when the query is planned (on the driver's machine: this is where
the metadata database must be reachable), and ``read`` once per partition in a task. The reader is
pickled to the tasks with its options, which is how S3 credentials reach executors; they are in no
partition and in no ``repr``. Keys do not travel at all: the options name a keyring file or variable,
and each worker loads the keyring where it runs (``tieredstore.scan.session``). A query that gives a
schema of its own (``.schema(...)``) gets only those columns, and only those are built.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, Filter, InputPartition
from pyspark.sql.types import StructType

from tieredstore.scan.filters import ScanFilter
from tieredstore.scan.options import ScanOptions, TableMode
from tieredstore.scan.reading import read_partition
from tieredstore.scan.schema import ARROW_SCHEMA
from tieredstore.scan.session import scan_codecs
from tieredstore.spark.filters import push_filters
from tieredstore.spark.schema import requested_columns, spark_schema
from tieredstore.table.read_plan import ReadPlan, TableFilePlan, open_tables, plan_read_partitions

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

FORMAT_NAME = "tieredstore"
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


class TieredStorePartition(InputPartition):
    """One planned partition, as Spark carries it to a task."""

    def __init__(self, plan: ReadPlan) -> None:
        super().__init__(plan)
        self.plan = plan

    def __repr__(self) -> str:
        return f"TieredStorePartition({self.plan})"


class TieredStoreReader(DataSourceReader):
    """Plans partitions from metadata (or by listing), and from a topic's Iceberg table when option ``table``
    lets it (tieredstore.table.read_plan); reads each archive partition in its own event loop, each table
    partition's Parquet with pyarrow."""

    def __init__(self, options: ScanOptions, columns: tuple[str, ...] = tuple(ARROW_SCHEMA.names)) -> None:
        self.options = options
        self.columns = columns
        self.scan_filter = ScanFilter()

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        self.scan_filter, unsupported = push_filters(filters)
        return unsupported

    def partitions(self) -> list[InputPartition]:
        return [TieredStorePartition(plan) for plan in plan_read_partitions(self.options, self.scan_filter)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        # Spark substitutes one InputPartition(None) when nothing survived planning.
        if not isinstance(partition, TieredStorePartition):
            return iter(())
        if isinstance(partition.plan, TableFilePlan):
            from tieredstore.table.read_files import read_table_file

            return read_table_file(partition.plan, self.options, columns=self.columns)
        return read_partition(partition.plan, self.options, columns=self.columns)

    def __repr__(self) -> str:
        return f"TieredStoreReader({self.options!r}, {self.scan_filter!r}, columns={self.columns!r})"


class TieredStoreDataSource(DataSource):
    """``spark.read.format("tieredstore").option("cold_url", ...).load("topic[,topic...]")``."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> StructType:
        # Bad options, and a keyring the driver cannot load, fail at load(), not at the first action.
        options = ScanOptions.parse(self.options)
        scan_codecs(options)
        if options.table is TableMode.TRUE:
            open_tables(options, options.topics)  # table=true and a topic without a table: fail at load()
        return spark_schema()

    def reader(self, schema: StructType) -> TieredStoreReader:
        # Spark passes the schema given with .schema(...), else ours: it prunes no column of a Python source
        # by itself, so a narrower user schema is how a query avoids building columns it does not need.
        return TieredStoreReader(ScanOptions.parse(self.options), requested_columns(schema))


def register(spark: SparkSession) -> None:
    """Register the ``tieredstore`` format with ``spark`` and turn on Python filter pushdown.

    Without ``spark.sql.python.filterPushdown.enabled`` Spark refuses a source that pushes filters,
    so this sets it for the session.
    """
    spark.dataSource.register(TieredStoreDataSource)
    spark.conf.set(PUSHDOWN_CONF, "true")
