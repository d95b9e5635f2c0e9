"""Keeping a topic's table level with its archive: append what was archived since, exactly once.

For each queue, rows go from its table offset (``offsets``; absent, or below what retention left, the
queue's first archived offset: the backfill of an existing archive) up to its archived offset in
metadata. Queues are read in ascending id and each in offset order, so the rows of a commit are already
ordered by (queue_id, queue_offset) and pyiceberg's partitioned write, which filters rows per day
without reordering them, keeps that order within every file. A commit is made whenever about
``[table] target_file_size`` bytes of Arrow are gathered, and when the topic is done, each carrying the
new offsets of every queue: memory stays bounded, and a crash loses at most the uncommitted batch.

Another syncer committing first makes our commit fail (the catalog checks the snapshot we started
from): the table is reloaded and the work planned again from its new offsets, so no row is written
twice. A crash between writing Parquet files and committing leaves files no snapshot references;
``remove_orphan_files`` deletes them once older than ``[table] orphan_grace``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa

from tieredstore.config import TieredStoreConfig
from tieredstore.errors import ConfigError, StorageError, TieredStoreError
from tieredstore.metadata import MetadataStore, QueuePosition
from tieredstore.scan import ARROW_SCHEMA, ScanOptions, scan_queue
from tieredstore.table.catalog import catalog_errors, table_location
from tieredstore.table.offsets import OFFSETS_PROPERTY, encode_offsets, read_offsets
from tieredstore.table.orphans import remove_orphan_files
from tieredstore.table.schema import NO_COMMIT_RETRIES, iceberg_schema, partition_spec, sort_order, table_properties

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

log = logging.getLogger(__name__)

# Commits lost to other syncers before one sync gives up: each loss means another syncer made progress.
MAX_CONFLICTS = 16


def require_unencrypted_allowed(config: TieredStoreConfig) -> None:
    """ConfigError when the cold tier is encrypted and the table, plaintext Parquet, was not allowed to be."""
    if config.encryption.active_key is not None and not config.table.allow_unencrypted:
        raise ConfigError(
            f"[encryption] active_key is set ({config.encryption.active_key!r}) but Iceberg tables are plaintext "
            "Parquet: they would expose what the cold tier encrypts; set [table] allow_unencrypted = true "
            "to sync anyway"
        )


@dataclass(frozen=True, slots=True)
class QueueProgress:
    """One queue's table offset against its archive."""

    queue_id: int
    table_offset: int  # the next offset the table does not hold (the first archived one if it holds none)
    archived_offset: int  # the next offset not archived yet

    @property
    def lag(self) -> int:
        return max(0, self.archived_offset - self.table_offset)


def queue_progress(offsets: dict[int, int], queues: list[QueuePosition]) -> list[QueueProgress]:
    """Where each queue's table stands: from its table offset, never below what is still archived."""
    return [
        QueueProgress(q.queue_id, max(offsets.get(q.queue_id, q.min_offset), q.min_offset), q.max_offset)
        for q in sorted(queues, key=lambda q: q.queue_id)
    ]


class SummedProgress:
    """A topic's table offset, archived offset and lag: its queues' summed."""

    __slots__ = ()
    queues: Sequence[QueueProgress]

    @property
    def table_offset(self) -> int:
        return sum(q.table_offset for q in self.queues)

    @property
    def archived_offset(self) -> int:
        return sum(q.archived_offset for q in self.queues)

    @property
    def lag(self) -> int:
        return sum(q.lag for q in self.queues)


@dataclass(slots=True)
class TopicSync(SummedProgress):
    """What one sync of a topic did, and where its table stands afterwards."""

    topic: str
    rows_added: int = 0
    commits: int = 0
    conflicts: int = 0
    orphans_deleted: int = 0
    queues: list[QueueProgress] = field(default_factory=list)
    seconds: float = 0.0

    def as_json(self) -> dict[str, object]:
        return {
            "topic": self.topic,
            "rows_added": self.rows_added,
            "commits": self.commits,
            "conflicts": self.conflicts,
            "orphans_deleted": self.orphans_deleted,
            "table_offset": self.table_offset,
            "archived_offset": self.archived_offset,
            "lag": self.lag,
            "seconds": round(self.seconds, 3),
        }


def table_identifier(config: TieredStoreConfig, topic: str) -> tuple[str, str]:
    return (config.table.namespace, topic)


def load_table(catalog: Catalog, config: TieredStoreConfig, topic: str) -> Table | None:
    """``topic``'s table, or None when it has none yet."""
    from pyiceberg.exceptions import NoSuchTableError

    try:
        return catalog.load_table(table_identifier(config, topic))
    except NoSuchTableError:
        return None


def create_table(catalog: Catalog, config: TieredStoreConfig, topic: str) -> Table:
    """``topic``'s table, created (with its namespace) under the cold URL if it does not exist yet."""
    from pyiceberg.exceptions import NamespaceAlreadyExistsError, TableAlreadyExistsError

    existing = load_table(catalog, config, topic)
    if existing is not None:
        return _without_commit_retries(existing)
    try:
        catalog.create_namespace(config.table.namespace)
    except NamespaceAlreadyExistsError:
        pass
    schema = iceberg_schema()
    try:
        return catalog.create_table(
            table_identifier(config, topic),
            schema,
            location=table_location(config, topic),
            partition_spec=partition_spec(schema),
            sort_order=sort_order(schema),
            properties=table_properties(config.table.target_file_size),
        )
    except TableAlreadyExistsError:
        # Another syncer created it between our look and our create: theirs is the same table.
        return _without_commit_retries(catalog.load_table(table_identifier(config, topic)))


def _without_commit_retries(table: Table) -> Table:
    """``table``, its property that makes pyiceberg retry lost commits set to none (another tool may have
    changed it): a retried append would carry offsets the winning commit already passed."""
    if all(table.properties.get(name) == value for name, value in NO_COMMIT_RETRIES.items()):
        return table
    with table.transaction() as transaction:
        transaction.set_properties(NO_COMMIT_RETRIES)
    return table


@dataclass(slots=True)
class _Batch:
    """Rows gathered for one commit and the offsets they bring every queue to."""

    offsets: dict[int, int]
    pieces: list[pa.RecordBatch] = field(default_factory=list)
    nbytes: int = 0
    rows: int = 0

    def add(self, batch: pa.RecordBatch) -> None:
        self.pieces.append(batch)
        self.nbytes += batch.nbytes
        self.rows += batch.num_rows


class _Conflict(Exception):
    """Another syncer committed to the table first: plan again from its offsets."""


class TableSyncer:
    """Syncs topics of one node's archive into their tables; ``on_rows`` hears of every batch appended."""

    def __init__(
        self,
        config: TieredStoreConfig,
        metadata: MetadataStore,
        catalog: Catalog,
        *,
        on_rows: Callable[[int], None] | None = None,
        on_plan: Callable[[str, int], None] | None = None,
    ) -> None:
        require_unencrypted_allowed(config)
        self.config = config
        self.metadata = metadata
        self.catalog = catalog
        self.on_rows = on_rows
        self.on_plan = on_plan

    def sync_topic(self, topic: str, *, before_commit: Callable[[], None] | None = None) -> TopicSync:
        """Append everything archived to ``topic``'s table that it does not hold yet (creating it if needed).

        ``before_commit`` runs before each commit is sent (tests race another syncer there).
        """
        with catalog_errors(topic):
            return self._sync_topic(topic, before_commit)

    def _sync_topic(self, topic: str, before_commit: Callable[[], None] | None) -> TopicSync:
        started = time.monotonic()
        self.metadata.get_topic(topic)  # NotFoundError for a topic the archive does not know
        table = create_table(self.catalog, self.config, topic)
        result = TopicSync(topic)
        result.orphans_deleted = remove_orphan_files(self.config, table, self.config.table.orphan_grace)
        while True:
            try:
                self._append_all(table, result, before_commit)
                break
            except _Conflict:
                result.conflicts += 1
                if result.conflicts > MAX_CONFLICTS:
                    raise TieredStoreError(
                        f"table {topic}: {MAX_CONFLICTS} commits in a row lost to other syncers; try again"
                    ) from None
                table = table.refresh()
        table = table.refresh()
        result.queues = queue_progress(read_offsets(table), self.metadata.list_queues(topic))
        result.seconds = time.monotonic() - started
        return result

    def _append_all(self, table: Table, result: TopicSync, before_commit: Callable[[], None] | None) -> None:
        topic = result.topic
        offsets = read_offsets(table)
        progress = queue_progress(offsets, self.metadata.list_queues(topic))
        if self.on_plan is not None:
            self.on_plan(topic, sum(q.lag for q in progress))
        batch = _Batch(dict(offsets))
        options = ScanOptions.from_config(self.config, [topic])
        target = self.config.table.target_file_size
        for queue in progress:
            if queue.lag == 0:
                batch.offsets[queue.queue_id] = queue.table_offset
                continue
            for rows in self._rows(options, topic, queue):
                batch.add(rows)
                batch.offsets[queue.queue_id] = int(rows.column("queue_offset")[-1].as_py()) + 1
                if self.on_rows is not None:
                    self.on_rows(rows.num_rows)
                if batch.nbytes >= target:
                    table = self._commit(table, batch, result, before_commit)
                    batch = _Batch(dict(batch.offsets))
            # Lost offsets at the end of the range give no rows: the queue is done up to its archived offset.
            batch.offsets[queue.queue_id] = queue.archived_offset
        if batch.rows or batch.offsets != offsets:
            self._commit(table, batch, result, before_commit)

    def _rows(self, options: ScanOptions, topic: str, queue: QueueProgress) -> Iterator[pa.RecordBatch]:
        for rows in scan_queue(options, topic, queue.queue_id, queue.table_offset, queue.archived_offset):
            if rows.num_rows:
                yield rows

    def _commit(
        self, table: Table, batch: _Batch, result: TopicSync, before_commit: Callable[[], None] | None
    ) -> Table:
        from pyiceberg.exceptions import CommitFailedException

        rows = pa.Table.from_batches(batch.pieces, schema=ARROW_SCHEMA)
        properties = {OFFSETS_PROPERTY: encode_offsets(batch.offsets)}
        if before_commit is not None:
            before_commit()
        try:
            table.append(rows, snapshot_properties=properties)
        except CommitFailedException as error:
            log.info("table %s: another syncer committed first (%s); planning again", result.topic, error)
            raise _Conflict() from error
        except OSError as error:
            # pyarrow's file systems raise plain OSErrors: the cold tier refused or could not be reached.
            raise StorageError(f"table {result.topic}: writing its files failed: {error}") from error
        result.commits += 1
        result.rows_added += batch.rows
        log.info("table %s: appended %d rows, offsets %s", result.topic, batch.rows, properties[OFFSETS_PROPERTY])
        return table
