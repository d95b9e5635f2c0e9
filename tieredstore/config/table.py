"""Settings of the Apache Iceberg table kept per topic."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from tieredstore.basics import MIB
from tieredstore.config.section import Section


class TableSettings(Section):
    """The Apache Iceberg table per topic that ``tieredstore table sync`` and the archiver keep (docs/table.md)."""

    section: ClassVar[str] = "table"

    enabled: bool = Field(
        default=False,
        description="the archiver (tieredstore run) syncs every topic's table every commit_interval "
        "(pip install 'tieredstore[table]')",
    )
    commit_interval: float = Field(
        default=60.0, gt=0, description="seconds between the archiver's table syncs: the table's lag at most"
    )
    namespace: str = Field(
        default="tieredstore",
        min_length=1,
        pattern=r"^[A-Za-z0-9_]+$",
        description="the Iceberg namespace of the tables; each table is named after its topic",
    )
    catalog_uri: str | None = Field(
        default=None,
        description="an Iceberg REST catalog (http(s)://…); default: pyiceberg's SQL catalog in the metadata database",
    )
    target_file_size: int = Field(
        default=128 * MIB, ge=1 << 20, description="bytes of Arrow data each sync commit and data file aims at"
    )
    orphan_grace: float = Field(
        default=3600.0,
        ge=0,
        description="seconds an unreferenced data file under a table must be old before table sync deletes it "
        "(a file younger may belong to a sync about to commit)",
    )
    allow_unencrypted: bool = Field(
        default=False,
        description="sync even with [encryption] active_key set: the table's Parquet files are not encrypted",
    )
    snapshot_max_age: float = Field(
        default=86_400.0,
        ge=0,
        description="seconds a table snapshot is kept: each sync expires older ones (and files only they "
        "referenced), beyond the newest snapshot_retain_last",
    )
    snapshot_retain_last: int = Field(
        default=10, ge=1, description="newest snapshots each sync keeps whatever their age (time travel, readers)"
    )
    compact_interval: float = Field(
        default=3600.0,
        ge=0,
        description="seconds between the archiver's compactions of each table (small sync files merged); 0: never",
    )
