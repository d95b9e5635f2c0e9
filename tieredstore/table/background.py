"""The archiver's table sync: every topic's table kept level every ``[table] commit_interval``, in a thread.

A sync plans and reads with event loops of its own and blocks on pyiceberg's writes and catalog commits, so
it runs in a worker thread and never holds up the archiver's event loop. A topic whose sync fails is
logged, counted (``tieredstore_table_sync_failures``) and tried again on the next interval.

Each table is also compacted every ``[table] compact_interval`` (0: never), after its sync: one-minute syncs
would otherwise leave a long-running table as thousands of small files.

With queue leases (several archivers on one PostgreSQL), an archiver syncs only the topics whose
lowest-numbered queue it holds, so each table has one syncer and the others do not redo its work; when an
archiver stops, its leases and with them its tables pass to the others. Two syncers of one table, while a
lease changes hands, are safe: a commit lost to the other is planned again (``table.sync``).
"""

from __future__ import annotations

import math
import threading
import time
from typing import TYPE_CHECKING

import structlog

from tieredstore.config import TieredStoreConfig
from tieredstore.errors import TieredStoreError
from tieredstore.metadata import MetadataStore
from tieredstore.metrics import Metrics
from tieredstore.table.catalog import open_catalog
from tieredstore.table.status import synced_topics
from tieredstore.table.sync import TableSyncer, compact_topic, require_unencrypted_allowed

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

    from tieredstore.archiver.leases import LeaseManager

log = structlog.get_logger(__name__)


class BackgroundTableSync:
    """A daemon thread that syncs every active topic's table, then waits ``commit_interval``, until stopped."""

    def __init__(self, config: TieredStoreConfig, metrics: Metrics, leases: LeaseManager | None = None) -> None:
        """``leases``: the archiver's queue leases, when it has any; then only its topics are synced."""
        # Refused here, at the archiver's start, rather than logged every interval.
        require_unencrypted_allowed(config)
        self.config = config
        self.metrics = metrics
        self.leases = leases
        self.rounds = 0
        self.compactions = 0
        # When each topic's table was last compacted (monotonic seconds); the first comes one interval after start.
        self._compacted: dict[str, float] = {}
        # When each topic's orphan files were last swept: at its first round (a restart follows any crash
        # that left some), then once an orphan_grace, as a younger orphan could not be deleted anyway.
        self._swept: dict[str, float] = {}
        self._started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="table-sync", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stop after the sync in progress (if any); wait up to ``timeout`` seconds for it."""
        self._stop.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.sync_all()
            self.rounds += 1
            self._stop.wait(max(0.0, self.config.table.commit_interval - (time.monotonic() - started)))

    def sync_all(self) -> None:
        """One round: every active topic's table synced, its lag published."""
        try:
            metadata = MetadataStore(self.config.effective_metadata_url)
        except TieredStoreError as error:
            log.warning("table sync skipped: metadata cannot be opened", error=str(error))
            return
        try:
            catalog = open_catalog(self.config)
            syncer = TableSyncer(self.config, metadata, catalog)
            for topic in synced_topics(metadata):
                if self._stop.is_set():
                    return
                if not self._ours(metadata, topic):
                    continue
                sweep = time.monotonic() - self._swept.get(topic, -math.inf) >= self.config.table.orphan_grace
                try:
                    result = syncer.sync_topic(topic, sweep_orphans=sweep)
                except Exception as error:  # noqa: BLE001 - one topic's failure must not end the archiver's syncs
                    self.metrics.table_sync_failures.labels(topic).inc()
                    log.warning("table sync failed", topic=topic, error=str(error))
                    continue
                if sweep:
                    self._swept[topic] = time.monotonic()
                self.metrics.table_lag.labels(topic).set(result.lag)
                log.info(
                    "table synced",
                    topic=topic,
                    rows_added=result.rows_added,
                    table_offset=result.table_offset,
                    lag=result.lag,
                    seconds=round(result.seconds, 3),
                )
                self._compact_if_due(catalog, topic)
        except TieredStoreError as error:
            log.warning("table sync skipped: the catalog cannot be opened", error=str(error))
        finally:
            metadata.close()

    def _ours(self, metadata: MetadataStore, topic: str) -> bool:
        """Whether this archiver syncs ``topic``: always without leases, else if it holds the topic's
        lowest-numbered queue (one holder at a time, so one syncer a table)."""
        if self.leases is None:
            return True
        queues = metadata.list_queues(topic)
        return bool(queues) and self.leases.holds((topic, min(queue.queue_id for queue in queues)))

    def _compact_if_due(self, catalog: Catalog, topic: str) -> None:
        interval = self.config.table.compact_interval
        if interval <= 0 or time.monotonic() - self._compacted.get(topic, self._started) < interval:
            return
        try:
            result = compact_topic(self.config, catalog, topic)
        except Exception as error:  # noqa: BLE001 - a failed compaction is tried again next interval
            log.warning("table compaction failed", topic=topic, error=str(error))
            return
        finally:
            self._compacted[topic] = time.monotonic()
        self.compactions += 1
        log.info(
            "table compacted",
            topic=topic,
            files_before=result.files_before,
            files_after=result.files_after,
            rows=result.rows,
        )
