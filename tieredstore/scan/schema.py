"""The rows a scan produces, in Arrow terms: the one schema the Spark source and the table sync share.

Spark checks every Arrow batch a Python source yields against ``to_arrow_schema(schema, "UTC")``,
field names, types and nullability included, so ``ARROW_SCHEMA`` is spelled to match it exactly
(tests/spark checks that it does; ``tieredstore.spark.schema`` holds the Spark side). Nothing here
imports pyspark, so the archiver can build these batches without it.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    arrow_type: pa.DataType
    description: str


COLUMNS: tuple[Column, ...] = (
    Column("topic", pa.string(), "topic of the message"),
    Column("queue_id", pa.int32(), "queue within the topic"),
    Column("queue_offset", pa.int64(), "position of the message in its queue"),
    Column("commitlog_offset", pa.int64(), "byte offset of the record in the queue's cold commit log"),
    Column("store_timestamp", pa.timestamp("us", tz="UTC"), "when the broker stored it"),
    Column("born_timestamp", pa.timestamp("us", tz="UTC"), "when the producer created it"),
    Column("keys", pa.list_(pa.field("element", pa.string())), "property KEYS, split"),
    Column("tags", pa.string(), "property TAGS; null without tags"),
    Column(
        "properties",
        pa.map_(pa.field("key", pa.string(), nullable=False), pa.field("value", pa.string())),
        "every property, KEYS/TAGS/UNIQ_KEY included",
    ),
    Column("msg_id", pa.string(), "UNIQ_KEY if set, else the offset message id"),
    Column("body", pa.binary(), "message body"),
    Column("body_crc", pa.int32(), "stored body CRC32 (sign bit cleared)"),
    Column("reconsume_times", pa.int32(), "redelivery count"),
    Column("sysflag", pa.int32(), "RocketMQ system flags"),
)

ARROW_SCHEMA = pa.schema([pa.field(column.name, column.arrow_type) for column in COLUMNS])
