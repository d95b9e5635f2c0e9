"""Reading archives with Spark: the ``tieredstore`` Python data source (pyspark 4.x, no JARs).

    from tieredstore.spark import register
    register(spark)
    df = spark.read.format("tieredstore").option("metadata_url", ...).option("cold_url", ...).load("orders")

The scan itself (options, planning, decoding to Arrow) is ``tieredstore.scan``, which needs no pyspark;
this package holds only the data source, filter pushdown and the Spark schema.
"""

from tieredstore.spark.filters import push_filters
from tieredstore.spark.schema import spark_schema
from tieredstore.spark.source import FORMAT_NAME, TieredStoreDataSource, TieredStoreReader, register

__all__ = [
    "FORMAT_NAME",
    "TieredStoreDataSource",
    "TieredStoreReader",
    "push_filters",
    "register",
    "spark_schema",
]
