"""Where each topic's table stands: its offsets against the archive's, and what its current snapshot holds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy.exc import SQLAlchemyError

from tieredstore.config import TieredStoreConfig
from tieredstore.errors import TieredStoreError
from tieredstore.metadata import MetadataStore, TopicStatus
from tieredstore.table.catalog import catalog_errors, open_catalog
from tieredstore.table.offsets import read_offsets
from tieredstore.table.sync import QueueProgress, SummedProgress, load_table, queue_progress

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog


@dataclass(frozen=True, slots=True)
class TableStatus(SummedProgress):
    """One topic's table: offsets summed over its queues, lag in messages, snapshots, data files, bytes."""

    topic: str
    exists: bool
    queues: tuple[QueueProgress, ...]
    snapshots: int = 0
    data_files: int = 0
    data_bytes: int = 0
    rows: int = 0

    def as_json(self) -> dict[str, object]:
        return {
            "topic": self.topic,
            "exists": self.exists,
            "table_offset": self.table_offset,
            "archived_offset": self.archived_offset,
            "lag": self.lag,
            "snapshots": self.snapshots,
            "data_files": self.data_files,
            "data_bytes": self.data_bytes,
            "rows": self.rows,
        }


def synced_topics(metadata: MetadataStore) -> list[str]:
    """The topics a sync without a topic covers: every active topic of the archive."""
    return sorted(topic.name for topic in metadata.list_topics() if topic.status == TopicStatus.ACTIVE)


def table_status(config: TieredStoreConfig, metadata: MetadataStore, catalog: Catalog, topic: str) -> TableStatus:
    """``topic``'s table as it stands; a topic without a table lags by everything archived."""
    metadata.get_topic(topic)
    queues = metadata.list_queues(topic)
    with catalog_errors(topic):
        table = load_table(catalog, config, topic)
    if table is None:
        return TableStatus(topic, False, tuple(queue_progress({}, queues)))
    snapshot = table.current_snapshot()
    summary = snapshot.summary if snapshot is not None else None

    def total(name: str) -> int:
        value = summary[name] if summary is not None else None
        return int(value) if value is not None else 0

    return TableStatus(
        topic,
        True,
        tuple(queue_progress(read_offsets(table), queues)),
        snapshots=len(table.snapshots()),
        data_files=total("total-data-files"),
        data_bytes=total("total-files-size"),
        rows=total("total-records"),
    )


def queue_table_lags(
    config: TieredStoreConfig, metadata: MetadataStore, topics: list[str]
) -> dict[tuple[str, int], int] | None:
    """Each queue's table lag for the topics that have a table; None when none has one (or no catalog can
    be read: pyiceberg not installed, the catalog's tables never created), so ``status`` shows no column."""
    try:
        catalog = open_catalog(config, create_tables=False)
        tables = {topic: load_table(catalog, config, topic) for topic in topics}
    except (TieredStoreError, SQLAlchemyError, OSError):
        return None
    lags: dict[tuple[str, int], int] = {}
    for topic, table in tables.items():
        if table is None:
            continue
        for queue in queue_progress(read_offsets(table), metadata.list_queues(topic)):
            lags[(topic, queue.queue_id)] = queue.lag
    return lags or None
