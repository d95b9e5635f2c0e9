"""The archiver's maintenance pass: hot retention, cold retention and rolling, key-index upkeep."""

from __future__ import annotations

import asyncio
from collections import Counter

import structlog

from tieredstore.archiver.core import ArchiverCore
from tieredstore.errors import CommitConflictError, LeaseLostError, TieredStoreError
from tieredstore.index import IndexFileStatus
from tieredstore.local.store import LocalMessageStore

log = structlog.get_logger(__name__)


class Maintenance(ArchiverCore):
    """What the archiver does every ``maintain_interval`` besides archiving."""

    async def maintain(self) -> None:
        """Delete hot files whose messages are all archived and old enough; roll segments that are due and
        apply cold retention (``tieredstore.retention``); seal and upload index files.

        A read-only or followed hot store is not ours to delete from: its writer process runs hot
        retention against the archived offsets in metadata (``AsyncTieredMessageStore.delete_expired_hot``).
        """
        if isinstance(self.hot, LocalMessageStore) and not self.hot.read_only:
            try:
                archived_offset = self.topics.for_hot_retention(self._archived_for_retention)
                await asyncio.to_thread(self.hot.delete_expired, archived_offset)
            except (TieredStoreError, OSError) as error:
                log.warning("hot retention failed", error=str(error))
        await self._maintain_cold()
        await self._maintain_index()

    async def _maintain_cold(self) -> None:
        """Cold retention of every queue this archiver holds, each under its lock, then of the key index."""
        retention = self.retention
        if retention is None:
            return
        now = self.clock_ms()
        try:
            topics = await retention.topics()
        except (TieredStoreError, OSError) as error:
            self.metrics.retention_failures.inc()
            log.warning("cold retention skipped: topics could not be listed", error=str(error))
            return
        for key, worker in sorted(self._queues.items()):
            async with worker.lock:
                # Checked under the lock: a batch or a lease round may have changed the queue meanwhile.
                if worker.flat_file is None or worker.needs_commit or not self._serves(key):
                    continue
                try:
                    await retention.expire_queue(worker.flat_file, topics.get(worker.topic), now)
                except (LeaseLostError, CommitConflictError) as error:
                    self.lose_queue(worker, error, phase="retention")
                except (TieredStoreError, OSError) as error:
                    self.metrics.retention_failures.inc()
                    log.warning(
                        "cold retention failed; the next pass retries",
                        topic=worker.topic,
                        queue_id=worker.queue_id,
                        error=f"{type(error).__name__}: {error}",
                    )
        if self.index is not None:
            try:
                await retention.expire_index(now, topics)
            except (TieredStoreError, OSError) as error:
                self.metrics.retention_failures.inc()
                log.warning("key-index retention failed; the next pass retries", error=str(error))

    def _archived_for_retention(self, topic: str, queue_id: int) -> int:
        worker = self._queues.get((topic, queue_id))
        if worker is None or worker.flat_file is None:
            return 0  # never seen: nothing of it counts as archived
        return worker.flat_file.archived_offset

    async def _maintain_index(self) -> None:
        if self._index_upkeep is None or self.index is None:
            return
        try:
            await self._index_upkeep()
        except (TieredStoreError, OSError) as error:
            self.metrics.index_upload_failures.inc()
            log.warning("key index upload failed; the next pass retries", error=str(error))
        states = Counter(record.status for record in self.index.files())
        for status in IndexFileStatus:
            self.metrics.index_files.labels(status=status.value).set(states[status])
