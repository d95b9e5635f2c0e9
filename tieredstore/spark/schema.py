"""The Spark side of the scan's schema: each of ``tieredstore.scan.schema.COLUMNS`` as a Spark type.

Spark checks every Arrow batch a Python source yields against ``to_arrow_schema(schema, "UTC")``, so each
type here must turn into that column's Arrow type exactly (tests/spark checks that it does). A query may
name fewer columns with ``.schema(...)``: any of ours, in any order, each with our type; the source then
builds only those.
"""

from __future__ import annotations

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from tieredstore.errors import ConfigError
from tieredstore.scan.schema import COLUMNS

SPARK_TYPES: dict[str, DataType] = {
    "topic": StringType(),
    "queue_id": IntegerType(),
    "queue_offset": LongType(),
    "commitlog_offset": LongType(),
    "store_timestamp": TimestampType(),
    "born_timestamp": TimestampType(),
    "keys": ArrayType(StringType()),
    "tags": StringType(),
    "properties": MapType(StringType(), StringType()),
    "msg_id": StringType(),
    "body": BinaryType(),
    "body_crc": IntegerType(),
    "reconsume_times": IntegerType(),
    "sysflag": IntegerType(),
}
# A column added to the scan without a Spark type would only fail at a query's first batch; fail at import.
if set(SPARK_TYPES) != {column.name for column in COLUMNS}:
    raise AssertionError("SPARK_TYPES must name exactly the columns of tieredstore.scan.schema.COLUMNS")


def spark_schema() -> StructType:
    """The Spark schema of every ``tieredstore`` DataFrame, in the order of ``COLUMNS``."""
    return StructType([StructField(column.name, SPARK_TYPES[column.name], nullable=True) for column in COLUMNS])


def requested_columns(schema: StructType) -> tuple[str, ...]:
    """The names of the columns a query asked for, checked against ours; ConfigError when one does not fit."""
    names = tuple(field.name for field in schema.fields)
    for field in schema.fields:
        if field.name not in SPARK_TYPES:
            raise ConfigError(f"tieredstore has no column {field.name!r}; its columns are {', '.join(SPARK_TYPES)}")
        if field.dataType != SPARK_TYPES[field.name]:
            raise ConfigError(
                f"tieredstore column {field.name!r} is {SPARK_TYPES[field.name].simpleString()}, "
                f"not {field.dataType.simpleString()}"
            )
        if not field.nullable:
            raise ConfigError(f"declare tieredstore column {field.name!r} nullable (Spark's default), not NOT NULL")
    if len(set(names)) < len(names):
        raise ConfigError(f"a column is named twice in the schema {schema.simpleString()}")
    if not names:
        raise ConfigError("the schema names no column; name at least one, e.g. .schema('queue_offset BIGINT')")
    return names
