"""A topic table's shape: the Spark source's columns as an Iceberg schema, day partitions, queue order, zstd.

Field ids are fixed here (1..14 for the columns in their order, nested ids after), so every table has the
same ids and a reader's projection by id means the same column in each.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

from tieredstore.scan import ARROW_SCHEMA, COLUMNS

if TYPE_CHECKING:
    from pyiceberg.partitioning import PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.table.sorting import SortOrder
    from pyiceberg.types import IcebergType

PARTITION_COLUMN = "store_timestamp"
SORT_COLUMNS = ("queue_id", "queue_offset")
# Partition field ids start at 1000 by Iceberg's convention.
_PARTITION_FIELD_ID = 1000


def _primitive(arrow_type: pa.DataType) -> IcebergType:
    from pyiceberg.types import BinaryType, IntegerType, LongType, StringType, TimestamptzType

    if pa.types.is_string(arrow_type):
        return StringType()
    if pa.types.is_int32(arrow_type):
        return IntegerType()
    if pa.types.is_int64(arrow_type):
        return LongType()
    if pa.types.is_binary(arrow_type):
        return BinaryType()
    if pa.types.is_timestamp(arrow_type) and arrow_type.unit == "us" and arrow_type.tz == "UTC":
        return TimestamptzType()
    raise TypeError(f"no Iceberg type for Arrow {arrow_type}")


def iceberg_schema() -> Schema:
    """The Iceberg schema of every topic table: ``ARROW_SCHEMA``'s columns, documented, all optional."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import ListType, MapType, NestedField

    next_id = len(COLUMNS) + 1
    fields = []
    for field_id, column in enumerate(COLUMNS, start=1):
        arrow_type = ARROW_SCHEMA.field(column.name).type
        kind: IcebergType
        if pa.types.is_list(arrow_type):
            kind = ListType(next_id, _primitive(arrow_type.value_type), element_required=False)
            next_id += 1
        elif pa.types.is_map(arrow_type):
            kind = MapType(
                next_id,
                _primitive(arrow_type.key_type),
                next_id + 1,
                _primitive(arrow_type.item_type),
                value_required=False,
            )
            next_id += 2
        else:
            kind = _primitive(arrow_type)
        fields.append(NestedField(field_id, column.name, kind, required=False, doc=column.description))
    return Schema(*fields)


def parquet_schema(schema: Schema) -> pa.Schema:
    """``ARROW_SCHEMA`` with ``schema``'s field ids (and docs) on every field, nested ones too: what a data
    file's Parquet schema says, while its Arrow types stay the scan's, so a batch is relabelled, not cast."""
    from pyiceberg.types import ListType, MapType

    def labelled(arrow_field: pa.Field, field_id: int, doc: str | None = None) -> pa.Field:
        metadata = {"PARQUET:field_id": str(field_id)}
        if doc:
            metadata["doc"] = doc
        return arrow_field.with_metadata(metadata)

    fields = []
    for iceberg_field in schema.fields:
        arrow_field = ARROW_SCHEMA.field(iceberg_field.name)
        kind = iceberg_field.field_type
        if isinstance(kind, ListType):
            arrow_type = arrow_field.type
            arrow_field = arrow_field.with_type(pa.list_(labelled(arrow_type.value_field, kind.element_id)))
        elif isinstance(kind, MapType):
            arrow_type = arrow_field.type
            arrow_field = arrow_field.with_type(
                pa.map_(labelled(arrow_type.key_field, kind.key_id), labelled(arrow_type.item_field, kind.value_id))
            )
        fields.append(labelled(arrow_field, iceberg_field.field_id, iceberg_field.doc))
    return pa.schema(fields)


def partition_spec(schema: Schema) -> PartitionSpec:
    """Day of ``store_timestamp``: a time filter prunes whole days of files."""
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import DayTransform

    source = schema.find_field(PARTITION_COLUMN).field_id
    return PartitionSpec(PartitionField(source, _PARTITION_FIELD_ID, DayTransform(), f"{PARTITION_COLUMN}_day"))


def sort_order(schema: Schema) -> SortOrder:
    """Queue, then offset: how sync writes rows within a file, declared so that engines know it."""
    from pyiceberg.table.sorting import SortField, SortOrder
    from pyiceberg.transforms import IdentityTransform

    return SortOrder(*(SortField(schema.find_field(name).field_id, IdentityTransform()) for name in SORT_COLUMNS))


# pyiceberg retries a commit that lost to another writer by rebasing the same rows onto the new snapshot:
# with our offsets in the snapshot, that would append rows the other writer already appended. Sync replans
# from the winner's offsets instead, so its tables must never retry on their own.
NO_COMMIT_RETRIES = {"commit.retry.num-retries": "0"}
# Every commit writes a new metadata.json; without these the table folder keeps all of them forever.
METADATA_VERSIONS_KEPT = 20
BOUNDED_METADATA = {
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": str(METADATA_VERSIONS_KEPT),
}
# What every sync makes so again (another tool may have changed it): retries off, metadata files bounded.
ENFORCED_PROPERTIES = {**NO_COMMIT_RETRIES, **BOUNDED_METADATA}


def table_properties(target_file_size: int) -> dict[str, str]:
    """Parquet with zstd, data files of about ``target_file_size`` bytes, no commit retried by pyiceberg,
    old metadata files deleted."""
    return {
        "write.format.default": "parquet",
        "write.parquet.compression-codec": "zstd",
        "write.target-file-size-bytes": str(target_file_size),
        **ENFORCED_PROPERTIES,
    }
