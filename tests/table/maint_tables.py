"""Iceberg tables for the maintenance tests, shaped as the sync makes them but filled without an archive.

``table_catalog`` (fixture, parametrised over catalog x warehouse): a ``CatalogSetup`` whose ``open()`` gives a
pyiceberg SqlCatalog on SQLite in tmp_path or on a fresh PostgreSQL database, with its warehouse on a POSIX
directory or in a moto S3 bucket over HTTP; ``open()`` again gives a second, independent catalog client
(a concurrent writer). ``message_table`` creates a table with the sync's schema, partitioning, order and
properties (so pyiceberg's commit retries are off, as on every table of ours), and ``append_messages``
appends a batch in one snapshot that carries
``tieredstore.offsets`` like a sync would, so several calls leave many small files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.table import Table

from tieredstore.scan import ARROW_SCHEMA
from tieredstore.table.offsets import OFFSETS_PROPERTY, encode_offsets, read_offsets
from tieredstore.table.schema import iceberg_schema, partition_spec, sort_order, table_properties

NAMESPACE = "maint"
DAY0 = datetime(2026, 11, 1, tzinfo=UTC)
# The columns these tests fill and compare; the sync's other columns stay null.
KEY_COLUMNS = ("topic", "queue_id", "queue_offset", "store_timestamp", "body")
Row = tuple[str, int, int, datetime, bytes]


@dataclass
class CatalogSetup:
    """How to reach one catalog database and warehouse; each ``open()`` is a new client of them."""

    name: str
    uri: str
    warehouse: str
    properties: dict[str, str] = field(default_factory=dict)
    opened: list[SqlCatalog] = field(default_factory=list, repr=False)

    def open(self) -> SqlCatalog:
        catalog = SqlCatalog("maint", uri=self.uri, warehouse=self.warehouse, **self.properties)
        self.opened.append(catalog)
        return catalog


PAIRS = [
    "sqlite-posix",
    "sqlite-s3",
    pytest.param("postgres-posix", marks=pytest.mark.postgres),
    pytest.param("postgres-s3", marks=pytest.mark.postgres),
]


def make_setup(pair: str, request: pytest.FixtureRequest, tmp_path: Path) -> CatalogSetup:
    database, storage = pair.split("-")
    uri = f"sqlite:///{tmp_path / 'catalog.db'}" if database == "sqlite" else request.getfixturevalue("postgres_url")
    if storage == "posix":
        return CatalogSetup(pair, uri, f"file://{tmp_path / 'warehouse'}")
    s3 = request.getfixturevalue("s3_server")
    bucket = request.getfixturevalue("s3_bucket")
    properties = {
        "s3.endpoint": s3.endpoint_url,
        "s3.access-key-id": s3.access_key_id,
        "s3.secret-access-key": s3.secret_access_key,
        "s3.region": s3.region,
    }
    return CatalogSetup(pair, uri, f"s3://{bucket}/warehouse", properties)


def message_table(catalog: SqlCatalog, name: str = "orders", **properties: str) -> Table:
    catalog.create_namespace_if_not_exists(NAMESPACE)
    schema = iceberg_schema()
    return catalog.create_table(
        (NAMESPACE, name),
        schema=schema,
        partition_spec=partition_spec(schema),
        sort_order=sort_order(schema),
        properties={**table_properties(128 * 1024 * 1024), **properties},
    )


def messages(queue_id: int, start: int, count: int, day: int, topic: str = "orders") -> pa.Table:
    """``count`` messages of one queue from offset ``start``, stored on day ``day`` after DAY0."""
    offsets = list(range(start, start + count))
    filled = {
        "topic": [topic] * count,
        "queue_id": [queue_id] * count,
        "queue_offset": offsets,
        "store_timestamp": [DAY0 + timedelta(days=day, seconds=offset) for offset in offsets],
        "body": [f"q{queue_id}-o{offset}-".encode() * 8 for offset in offsets],
    }
    columns = [filled[f.name] if f.name in filled else pa.nulls(count, type=f.type) for f in ARROW_SCHEMA]
    return pa.Table.from_arrays(columns, schema=ARROW_SCHEMA)


def append_messages(table: Table, batch: pa.Table) -> None:
    """Append ``batch`` in one snapshot whose ``tieredstore.offsets`` moves past it, as a sync commits."""
    offsets = read_offsets(table)
    for queue_id, offset in zip(batch["queue_id"].to_pylist(), batch["queue_offset"].to_pylist(), strict=True):
        offsets[queue_id] = max(offsets.get(queue_id, 0), offset + 1)
    table.append(batch, snapshot_properties={OFFSETS_PROPERTY: encode_offsets(offsets)})


def all_rows(table: Table) -> list[Row]:
    """Every row of the current snapshot, sorted, as plain tuples (so equal lists mean identical rows)."""
    data = table.scan().to_arrow()
    rows = zip(*(data[name].to_pylist() for name in KEY_COLUMNS), strict=True)
    return sorted(rows)


def summary_property(table: Table, name: str) -> str | None:
    head = table.current_snapshot()
    assert head is not None
    return head.summary.additional_properties.get(name)


def data_file_paths(table: Table) -> list[str]:
    return sorted(task.file.file_path for task in table.scan().plan_files())
