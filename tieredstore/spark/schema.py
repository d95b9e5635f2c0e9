"""The rows the ``tieredstore`` source produces: one schema, in Spark and in Arrow terms.

Spark checks every Arrow batch a Python source yields against ``to_arrow_schema(schema, "UTC")``,
field names, types and nullability included, so ``ARROW_SCHEMA`` is spelled to match it exactly
(tests/spark checks that it does). A query may name fewer columns with ``.schema(...)``: any of ours,
in any order, each with our type; the source then builds only those.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
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


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    spark_type: DataType
    arrow_type: pa.DataType
    description: str


COLUMNS: tuple[Column, ...] = (
    Column("topic", StringType(), pa.string(), "topic of the message"),
    Column("queue_id", IntegerType(), pa.int32(), "queue within the topic"),
    Column("queue_offset", LongType(), pa.int64(), "position of the message in its queue"),
    Column("commitlog_offset", LongType(), pa.int64(), "byte offset of the record in the queue's cold commit log"),
    Column("store_timestamp", TimestampType(), pa.timestamp("us", tz="UTC"), "when the broker stored it"),
    Column("born_timestamp", TimestampType(), pa.timestamp("us", tz="UTC"), "when the producer created it"),
    Column("keys", ArrayType(StringType()), pa.list_(pa.field("element", pa.string())), "property KEYS, split"),
    Column("tags", StringType(), pa.string(), "property TAGS; null without tags"),
    Column(
        "properties",
        MapType(StringType(), StringType()),
        pa.map_(pa.field("key", pa.string(), nullable=False), pa.field("value", pa.string())),
        "every property, KEYS/TAGS/UNIQ_KEY included",
    ),
    Column("msg_id", StringType(), pa.string(), "UNIQ_KEY if set, else the offset message id"),
    Column("body", BinaryType(), pa.binary(), "message body"),
    Column("body_crc", IntegerType(), pa.int32(), "stored body CRC32 (sign bit cleared)"),
    Column("reconsume_times", IntegerType(), pa.int32(), "redelivery count"),
    Column("sysflag", IntegerType(), pa.int32(), "RocketMQ system flags"),
)

ARROW_SCHEMA = pa.schema([pa.field(column.name, column.arrow_type) for column in COLUMNS])


def spark_schema() -> StructType:
    """The Spark schema of every ``tieredstore`` DataFrame."""
    return StructType([StructField(column.name, column.spark_type, nullable=True) for column in COLUMNS])


def requested_columns(schema: StructType) -> tuple[str, ...]:
    """The names of the columns a query asked for, checked against ours; ConfigError when one does not fit."""
    ours = {column.name: column.spark_type for column in COLUMNS}
    names = tuple(field.name for field in schema.fields)
    for field in schema.fields:
        if field.name not in ours:
            raise ConfigError(f"tieredstore has no column {field.name!r}; its columns are {', '.join(ours)}")
        if field.dataType != ours[field.name]:
            raise ConfigError(
                f"tieredstore column {field.name!r} is {ours[field.name].simpleString()}, "
                f"not {field.dataType.simpleString()}"
            )
        if not field.nullable:
            raise ConfigError(f"declare tieredstore column {field.name!r} nullable (Spark's default), not NOT NULL")
    if len(set(names)) < len(names):
        raise ConfigError(f"a column is named twice in the schema {schema.simpleString()}")
    if not names:
        raise ConfigError("the schema names no column; name at least one, e.g. .schema('queue_offset BIGINT')")
    return names
