"""An archive written through the flat layer on each backend pair, and the node whose CLI syncs its tables."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.cli.framed import backend_node
from tests.cli.helpers import CliResult, Node
from tests.fixtures.s3 import S3Server
from tests.spark.conftest import spark  # noqa: F401  (the session fixture, for the Spark reader test)
from tests.spark.helpers import Archive, Row, archive_messages, make_message
from tieredstore.config import TieredStoreConfig, load_config
from tieredstore.formats.message import MessageRecord
from tieredstore.table.catalog import open_catalog

TOPIC = "orders"
DAY_MS = 86_400_000
# Midnight UTC, 2026-05-01: message times are placed on whole days from here.
FIRST_DAY_MS = 1_777_593_600_000


@dataclass
class TableNode:
    """A node's CLI and settings, and the archive its cold URL and metadata hold (every row archived)."""

    node: Node
    archive: Archive
    provider_options: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    s3: S3Server | None = None  # the moto server of an S3 cold URL

    def __call__(self, *args: str, output: str | None = None) -> CliResult:
        return self.node(*args, output=output)

    def config(self, **table: Any) -> TieredStoreConfig:
        s3 = dict(self.provider_options)
        return load_config(
            data_dir=self.node.data_dir,
            cold_url=self.node.cold_url,
            metadata_url=self.node.metadata_url,
            s3=s3 or None,
            table=table or None,
        )

    def put(self, messages: dict[tuple[str, int], list[MessageRecord]]) -> None:
        asyncio.run(archive_messages(self.archive, self.provider_options, messages))

    def s3_client(self) -> Any:
        """A boto3 client on the moto server of an S3 node, to see what landed in its bucket."""
        assert self.s3 is not None, f"{self.node.name} keeps its cold tier on POSIX"
        return self.s3.client()

    def table(self, topic: str = TOPIC) -> Any:
        return open_catalog(self.config()).load_table(("tieredstore", topic))

    def expected(self, topic: str = TOPIC) -> list[Row]:
        return sorted(self.archive.rows.get(topic, []), key=lambda row: (row["queue_id"], row["queue_offset"]))


def on_day(message: MessageRecord, day: int) -> MessageRecord:
    """``message`` stored on day ``day`` after FIRST_DAY_MS (its offset spreads it over that day)."""
    stored = FIRST_DAY_MS + day * DAY_MS + message.queue_offset * 1000 + message.queue_id
    return dataclasses.replace(message, store_timestamp=stored, born_timestamp=stored - 250)


def messages(
    queue_id: int, offsets: range | list[int], *, day: int = 0, body_size: int | None = None
) -> list[MessageRecord]:
    return [on_day(make_message(TOPIC, queue_id, offset, body_size=body_size), day) for offset in offsets]


def table_node_on(pair: str, request: pytest.FixtureRequest, tmp_path: Path) -> TableNode:
    """An empty archive on ``pair`` (``posix-sqlite``, ``s3-postgres`` ...) and its node."""
    node = backend_node(pair, request, tmp_path / "node")
    node.data_dir.mkdir(parents=True, exist_ok=True)
    cold_url = node.cold_url or str(node.data_dir / "cold")
    metadata_url = node.metadata_url or f"sqlite:///{node.data_dir / 'metadata.db'}"
    s3: S3Server | None = request.getfixturevalue("s3_server") if node.cold_url else None
    options = s3.provider_options() if s3 is not None else {}
    return TableNode(node, Archive(pair, cold_url, metadata_url), options, s3=s3)


def table_rows(table: Any, row_filter: Any = None) -> list[Row]:
    """Every row of the table's current snapshot (pyiceberg's own reader), in the shape of ``expected_row``."""
    scan = table.scan() if row_filter is None else table.scan(row_filter=row_filter)
    rows = scan.to_arrow().to_pylist()
    return sorted((as_expected(row) for row in rows), key=lambda row: (row["queue_id"], row["queue_offset"]))


def as_expected(row: Row) -> Row:
    shaped = dict(row)
    for name in ("store_timestamp", "born_timestamp"):
        value: datetime.datetime = shaped[name]
        shaped[name] = round(value.timestamp() * 1000)
    shaped["properties"] = dict(shaped["properties"])
    return shaped
