"""Keeping a topic's table level with its archive: append what was archived since, exactly once.

For each queue, rows go from its table offset (``offsets``; absent, or below what retention left, the
queue's first archived offset: the backfill of an existing archive) up to its archived offset in
metadata. Queues are read in ascending id and each in offset order, so the rows of a commit are already
ordered by (queue_id, queue_offset), and the ``DataFileWriter`` that writes them into each day's file while
the next rows are read (``data_files``) keeps that order. A commit is made whenever about
``[table] target_file_size`` bytes of Arrow are gathered, and when the topic is done, each carrying the
new offsets of every queue: memory stays bounded, and a crash loses at most the uncommitted batches. A
full batch is committed by a thread of its own while the next one is read, one commit at a time.

Another syncer committing first makes our commit fail (the catalog checks the snapshot we started
from): the table is reloaded and the work planned again from its new offsets, so no row is written
twice. A crash between writing Parquet files and committing leaves files no snapshot references (and,
during the commit, manifests and metadata files nothing references); ``remove_orphan_files`` deletes them
once older than ``[table] orphan_grace``.

After appending, a sync keeps the table bounded and honest: rows below a queue's first archived offset
(retention removed them from the cold tier) are trimmed, snapshots older than ``[table] snapshot_max_age``
beyond the newest ``snapshot_retain_last`` expire, and old metadata files are deleted on commit
(``schema.BOUNDED_METADATA``). A topic whose table the catalog lost but whose folder still holds metadata
gets that table registered again rather than a new one (``recovery``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import pyarrow as pa

from tieredstore.config import TieredStoreConfig
from tieredstore.errors import ConfigError, StorageError, TieredStoreError
from tieredstore.metadata import MetadataStore, QueuePosition
from tieredstore.scan import ScanOptions, scan_queue
from tieredstore.table.catalog import catalog_errors, refusals_explained, table_location
from tieredstore.table.data_files import DataFileWriter, Upload
from tieredstore.table.offsets import OFFSETS_PROPERTY, encode_offsets, read_offsets
from tieredstore.table.orphans import remove_orphan_files
from tieredstore.table.recovery import newest_metadata_location
from tieredstore.table.schema import (
    ENFORCED_PROPERTIES,
    iceberg_schema,
    partition_spec,
    sort_order,
    table_properties,
)
from tieredstore.table.uploads import object_upload

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.manifest import DataFile
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
    orphans_deleted: int = 0  # unreferenced data files
    metadata_orphans_deleted: int = 0  # unreferenced metadata, manifest-list and manifest files
    rows_trimmed: int = 0
    snapshots_expired: int = 0
    registered: bool = False  # the catalog had lost the table: its newest metadata file was registered again
    queues: list[QueueProgress] = field(default_factory=list)
    seconds: float = 0.0

    def as_json(self) -> dict[str, object]:
        return {
            "topic": self.topic,
            "rows_added": self.rows_added,
            "commits": self.commits,
            "conflicts": self.conflicts,
            "orphans_deleted": self.orphans_deleted,
            "metadata_orphans_deleted": self.metadata_orphans_deleted,
            "rows_trimmed": self.rows_trimmed,
            "snapshots_expired": self.snapshots_expired,
            "registered": self.registered,
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
    """``topic``'s table, created (with its namespace) under the cold URL if it does not exist yet.

    When the catalog has no table but the table's folder holds metadata (the catalog was lost), the newest
    metadata file is registered instead: the old table comes back with its rows and offsets.
    """
    return open_table(catalog, config, topic)[0]


def open_table(catalog: Catalog, config: TieredStoreConfig, topic: str) -> tuple[Table, bool]:
    """``create_table``'s table, and whether it was registered again from the metadata its folder held."""
    from pyiceberg.exceptions import NamespaceAlreadyExistsError

    existing = load_table(catalog, config, topic)
    if existing is not None:
        return _with_enforced_properties(existing), False
    with refusals_explained(config, topic):
        try:
            catalog.create_namespace(config.table.namespace)
        except NamespaceAlreadyExistsError:
            pass
        return _create_or_register(catalog, config, topic)


def _create_or_register(catalog: Catalog, config: TieredStoreConfig, topic: str) -> tuple[Table, bool]:
    from pyiceberg.exceptions import TableAlreadyExistsError

    schema = iceberg_schema()
    identifier = table_identifier(config, topic)
    # A catalog that places tables itself keeps its own record of them: no folder of ours to recover from.
    placed_by_us = config.table.location == "cold"
    try:
        metadata_location = newest_metadata_location(config, topic) if placed_by_us else None
        if metadata_location is not None:
            table = catalog.register_table(identifier, metadata_location)
            log.warning(
                "table %s: the catalog had no table but %s exists; registered it again", topic, metadata_location
            )
            return _with_enforced_properties(table), True
        return catalog.create_table(
            identifier,
            schema,
            location=table_location(config, topic) if placed_by_us else None,
            partition_spec=partition_spec(schema),
            sort_order=sort_order(schema),
            properties=table_properties(config.table.target_file_size),
        ), False
    except TableAlreadyExistsError:
        # Another syncer created it between our look and our create: theirs is the same table.
        return _with_enforced_properties(catalog.load_table(identifier)), False


def _with_enforced_properties(table: Table) -> Table:
    """``table`` with ``ENFORCED_PROPERTIES`` set (another tool may have changed them): pyiceberg's retry of a
    lost commit off, as a retried append would carry offsets the winning commit already passed; and old
    metadata files deleted, so the table's folder stays bounded."""
    if all(table.properties.get(name) == value for name, value in ENFORCED_PROPERTIES.items()):
        return table
    with table.transaction() as transaction:
        transaction.set_properties(ENFORCED_PROPERTIES)
    return table


@dataclass(slots=True)
class _Batch:
    """Rows gathered for one commit, the writer writing their files, and the offsets they bring every queue to."""

    table: Table
    offsets: dict[int, int]
    upload: Upload | None  # how the files are stored whole (object stores), else streamed through the FileIO
    writer: DataFileWriter | None = None  # started with the first rows
    nbytes: int = 0
    rows: int = 0

    def add(self, batch: pa.RecordBatch) -> None:
        if self.writer is None:
            self.writer = DataFileWriter(self.table, self.upload)
        self.writer.add(batch)
        self.nbytes += batch.nbytes
        self.rows += batch.num_rows

    def data_files(self) -> list[DataFile]:
        """The files of the rows added, closed: ready to commit."""
        return self.writer.finish() if self.writer is not None else []

    def abort(self) -> None:
        if self.writer is not None:
            self.writer.abort()


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

    def sync_topic(
        self, topic: str, *, before_commit: Callable[[], None] | None = None, sweep_orphans: bool = True
    ) -> TopicSync:
        """Append everything archived to ``topic``'s table that it does not hold yet (creating it if needed).

        ``sweep_orphans`` first deletes the files nothing in the table references (it reads every manifest and lists
        the table's folder, so a caller syncing every minute does it less often). ``before_commit`` runs
        before each commit is sent (tests race another syncer there).
        """
        with catalog_errors(topic):
            return self._sync_topic(topic, before_commit, sweep_orphans)

    def _sync_topic(self, topic: str, before_commit: Callable[[], None] | None, sweep_orphans: bool) -> TopicSync:
        started = time.monotonic()
        self.metadata.get_topic(topic)  # NotFoundError for a topic the archive does not know
        table, registered = open_table(self.catalog, self.config, topic)
        result = TopicSync(topic, registered=registered)
        if sweep_orphans:
            swept = remove_orphan_files(self.config, table, self.config.table.orphan_grace)
            result.orphans_deleted, result.metadata_orphans_deleted = swept.data_files, swept.metadata_files
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
        queues = self.metadata.list_queues(topic)
        self._bound(table.refresh(), queues, result)
        table = table.refresh()
        result.queues = queue_progress(read_offsets(table), queues)
        result.seconds = time.monotonic() - started
        return result

    def _bound(self, table: Table, queues: list[QueuePosition], result: TopicSync) -> None:
        """Trim what retention removed from the cold tier, then expire old snapshots (and their files)."""
        # Here, not at the top: maintenance imports pyiceberg, which this module loads only when it syncs.
        from tieredstore.table.maintenance import expire, trim

        lows = {q.queue_id: q.min_offset for q in queues if q.min_offset > 0}
        if lows:
            # trim skips queues whose low offset tieredstore.trimmed already records.
            result.rows_trimmed = trim(table, lows)
        settings = self.config.table
        older_than = datetime.now(UTC) - timedelta(seconds=settings.snapshot_max_age)
        result.snapshots_expired = expire(table, older_than=older_than, retain_last=settings.snapshot_retain_last)

    def _append_all(self, table: Table, result: TopicSync, before_commit: Callable[[], None] | None) -> None:
        topic = result.topic
        offsets = read_offsets(table)
        progress = queue_progress(offsets, self.metadata.list_queues(topic))
        if self.on_plan is not None:
            self.on_plan(topic, sum(q.lag for q in progress))
        upload = object_upload(self.config, table.location())
        batch = _Batch(table, dict(offsets), upload)
        options = ScanOptions.from_config(self.config, [topic])
        target = self.config.table.target_file_size
        # A full batch is committed by this thread while the next one is read: its files' last row group and
        # upload, and the catalog's commit, overlap the decoding. One at a time, so commits stay in order.
        committer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="table-commit")
        committing: Future[Table] | None = None
        try:
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
                        if committing is not None:
                            table = committing.result()  # the previous commit's failure (a _Conflict) stops here
                        committing = committer.submit(self._commit, table, batch, result, before_commit)
                        batch = _Batch(table, dict(batch.offsets), upload)
                # Lost offsets at the end of the range give no rows: the queue is done up to its archived offset.
                batch.offsets[queue.queue_id] = queue.archived_offset
            if committing is not None:
                table = committing.result()
                committing = None
            if batch.rows or batch.offsets != offsets:
                self._commit(table, batch, result, before_commit)
        finally:
            # A failed scan or commit leaves the files written so far to no snapshot: orphans, swept later.
            batch.abort()
            committer.shutdown(wait=True)  # a commit under way ends (its outcome is in the table) before a replan

    def _rows(self, options: ScanOptions, topic: str, queue: QueueProgress) -> Iterator[pa.RecordBatch]:
        for rows in scan_queue(options, topic, queue.queue_id, queue.table_offset, queue.archived_offset):
            if rows.num_rows:
                yield rows

    def _commit(
        self, table: Table, batch: _Batch, result: TopicSync, before_commit: Callable[[], None] | None
    ) -> Table:
        from pyiceberg.exceptions import CommitFailedException

        properties = {OFFSETS_PROPERTY: encode_offsets(batch.offsets)}
        try:
            data_files = batch.data_files()
            if before_commit is not None:
                before_commit()
            # One snapshot for every file of the batch, carrying the offsets they bring the queues to.
            with (
                table.transaction() as transaction,
                transaction.update_snapshot(snapshot_properties=properties).fast_append() as append,
            ):
                for data_file in data_files:
                    append.append_data_file(data_file)
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


@dataclass(slots=True)
class TopicCompaction:
    """What one ``table compact`` of a topic did: its table's data files before and after, and its rows."""

    topic: str
    files_before: int = 0
    files_after: int = 0
    rows: int = 0
    files_merged: int = 0
    seconds: float = 0.0

    def as_json(self) -> dict[str, object]:
        return {
            "topic": self.topic,
            "files_before": self.files_before,
            "files_after": self.files_after,
            "files_merged": self.files_merged,
            "rows": self.rows,
            "seconds": round(self.seconds, 3),
        }


def compact_topic(config: TieredStoreConfig, catalog: Catalog, topic: str) -> TopicCompaction:
    """Merge the small data files of ``topic``'s table (none to merge without a table)."""
    with catalog_errors(topic):
        from tieredstore.table.maintenance import compact
        from tieredstore.table.maintenance_common import live_data_files

        started = time.monotonic()
        result = TopicCompaction(topic)
        table = load_table(catalog, config, topic)
        if table is None:
            return result
        table = _with_enforced_properties(table)
        before = live_data_files(table)
        target = config.table.target_file_size
        # Files at half the target or more are left alone: merging two of them would overshoot it.
        done = compact(table, small_file_bytes=target // 2, target_file_bytes=target)
        after = live_data_files(table.refresh())
        result.files_before, result.files_after = len(before), len(after)
        result.files_merged = done.files_removed
        result.rows = sum(data_file.record_count for data_file in after.values())
        result.seconds = time.monotonic() - started
        return result
