"""FlatFileStore: every queue's FlatMessageFile, created on first use and recovered in parallel.

A restart costs two metadata queries (all queues, all live segments) however many queues there are;
then each queue corrects its last segments from the provider, at most ``recovery_concurrency``
queues at once so a large broker does not open thousands of storage requests together. A queue
whose recovery fails stays out of service (its error is kept) and is retried on next use.

``open_read_only`` is for readers beside a running archiver (CLI, Spark, a cold-only store): the queue
as metadata records it, never recovered (recovery truncates), never cached with the writable queues.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import structlog

from tieredstore.basics import QueueKey, now_ms
from tieredstore.errors import NotFoundError, TieredStoreError
from tieredstore.flat.append_file import RECOVERABLE_STATUSES, Clock
from tieredstore.flat.message_file import FlatFileSettings, FlatMessageFile, RecoveryResult, read_view_rows
from tieredstore.flat.position_commits import PositionCommits
from tieredstore.formats.naming import FileType, queue_path, validate_topic
from tieredstore.metadata import LeaseHold, MetadataStore, QueuePosition, SegmentFileType, SegmentRecord
from tieredstore.providers.base import Provider

log = structlog.get_logger(__name__)


@dataclass(slots=True)
class RecoveryReport:
    """The outcome of ``FlatFileStore.recover``."""

    recovered: int = 0
    changed: dict[QueueKey, RecoveryResult] = field(default_factory=dict)
    failed: dict[QueueKey, BaseException] = field(default_factory=dict)
    seconds: float = 0.0


class FlatFileStore:
    """All cold queues of one broker."""

    def __init__(
        self,
        provider: Provider,
        metadata: MetadataStore,
        *,
        cluster: str,
        broker: str,
        settings: FlatFileSettings | None = None,
        clock: Clock = now_ms,
    ) -> None:
        self.provider = provider
        self.metadata = metadata
        self.cluster = cluster
        self.broker = broker
        self.settings = settings or FlatFileSettings()
        self.clock = clock
        self._files: dict[QueueKey, FlatMessageFile] = {}
        self._failed: dict[QueueKey, BaseException] = {}
        self._creating: dict[QueueKey, asyncio.Lock] = {}
        self._recoveries: dict[QueueKey, RecoveryResult] = {}
        # One for every queue: positions of queues that commit together go to metadata in one transaction.
        self.position_commits = PositionCommits(metadata)

    def queue_path(self, topic: str, queue_id: int) -> str:
        return queue_path(self.cluster, self.broker, topic, queue_id)

    def _new_file(self, position: QueuePosition, lease: LeaseHold | None = None) -> FlatMessageFile:
        return FlatMessageFile(
            self.provider,
            self.metadata,
            self.queue_path(position.topic, position.queue_id),
            position,
            settings=self.settings,
            clock=self.clock,
            lease=lease,
            commits=self.position_commits,
        )

    # ---- lookup and creation ---------------------------------------------------------------------

    def get(self, topic: str, queue_id: int) -> FlatMessageFile:
        """The loaded queue; NotFoundError if it was never created or has not been recovered."""
        found = self._files.get((topic, queue_id))
        if found is None:
            raise NotFoundError(f"cold queue {topic}/{queue_id} is not loaded")
        return found

    def files(self) -> list[FlatMessageFile]:
        return list(self._files.values())

    def forget(self, topic: str, queue_id: int) -> None:
        """Unload a queue without touching storage or metadata (another archiver owns it now, or it is
        reloaded from metadata on next use)."""
        self._files.pop((topic, queue_id), None)
        self._failed.pop((topic, queue_id), None)
        self._recoveries.pop((topic, queue_id), None)

    @property
    def failed(self) -> dict[QueueKey, BaseException]:
        """Queues whose last recovery failed, with the error."""
        return dict(self._failed)

    async def get_or_create(
        self, topic: str, queue_id: int, *, start_offset: int = 0, lease: LeaseHold | None = None
    ) -> FlatMessageFile:
        """The queue's flat file: loaded, recovered from metadata if it exists there, or created at ``start_offset``.

        ``lease``: the queue's lease when an archiver beside others opens it (its recovery and every
        write then go under it, see ``FlatMessageFile.lease``); a file already loaded keeps its own.
        Different queues are opened concurrently (the archiver opens many at once on first sight); one
        queue is opened once however many callers ask.
        """
        key = (topic, queue_id)
        found = self._files.get(key)
        if found is not None:
            return found
        validate_topic(topic)
        lock = self._creating.setdefault(key, asyncio.Lock())
        async with lock:
            found = self._files.get(key)
            if found is not None:
                return found
            position = await asyncio.to_thread(
                self.metadata.get_or_create_queue, topic, queue_id, start_offset=start_offset
            )
            flat_file = self._new_file(position, lease)
            path = flat_file.path
            commit_log_rows, consume_queue_rows = await asyncio.gather(
                asyncio.to_thread(
                    self.metadata.list_segments, path, FileType.COMMIT_LOG.value, statuses=RECOVERABLE_STATUSES
                ),
                asyncio.to_thread(
                    self.metadata.list_segments, path, FileType.CONSUME_QUEUE.value, statuses=RECOVERABLE_STATUSES
                ),
            )
            # Rows read here in one round: a queue with no segment rows then recovers without a storage request.
            result = await flat_file.recover(commit_log_rows, consume_queue_rows)
            if result.changed:
                self._recoveries[key] = result
                _log_recovery(key, result)
            self._failed.pop(key, None)
            self._files[key] = flat_file
            return flat_file

    def pop_recovery(self, topic: str, queue_id: int) -> RecoveryResult | None:
        """What ``get_or_create`` changed recovering the queue, if anything, told once (for re-indexing)."""
        return self._recoveries.pop((topic, queue_id), None)

    # ---- read-only views ---------------------------------------------------------------------------

    def read_only_file(
        self,
        position: QueuePosition,
        commit_log_records: Sequence[SegmentRecord],
        consume_queue_records: Sequence[SegmentRecord],
    ) -> FlatMessageFile:
        """A read-only view of one queue from rows the caller already read (see ``FlatMessageFile.load``)."""
        return FlatMessageFile.load(
            self.provider,
            self.metadata,
            self.queue_path(position.topic, position.queue_id),
            position,
            commit_log_records,
            consume_queue_records,
            settings=self.settings,
        )

    async def open_read_only(self, topic: str, queue_id: int) -> FlatMessageFile:
        """A read-only view of one queue as metadata records it now; NotFoundError for an unknown queue.

        The position is read before the segment rows, so a commit in between only makes rows longer
        than the view counts; ``refresh`` on the view sees later commits.
        """
        validate_topic(topic)
        return self.read_only_file(
            *await read_view_rows(self.metadata, topic, queue_id, self.queue_path(topic, queue_id))
        )

    # ---- recovery --------------------------------------------------------------------------------

    async def recover(self, *, leases: Callable[[QueueKey], LeaseHold] | None = None) -> RecoveryReport:
        """Load every queue the metadata knows (not loaded yet), correcting each from storage.

        ``leases``: each queue's lease, when the queues are recovered under leases (``LeaseManager.hold``).
        """
        started = time.perf_counter()
        queues, segments = await asyncio.gather(
            asyncio.to_thread(self.metadata.list_queues),
            asyncio.to_thread(self.metadata.list_all_segments, statuses=RECOVERABLE_STATUSES),
        )
        report = RecoveryReport()
        limit = asyncio.Semaphore(self.settings.recovery_concurrency)

        async def recover_one(position: QueuePosition) -> None:
            key = (position.topic, position.queue_id)
            path = self.queue_path(*key)
            flat_file = self._new_file(position, None if leases is None else leases(key))
            async with limit:
                try:
                    result = await flat_file.recover(
                        _records(segments, path, FileType.COMMIT_LOG),
                        _records(segments, path, FileType.CONSUME_QUEUE),
                    )
                except TieredStoreError as error:
                    report.failed[key] = error
                    self._failed[key] = error
                    return
            self._failed.pop(key, None)
            self._files[key] = flat_file
            report.recovered += 1
            if result.changed:
                report.changed[key] = result
                _log_recovery(key, result)

        await asyncio.gather(*(recover_one(p) for p in queues if (p.topic, p.queue_id) not in self._files))
        report.seconds = time.perf_counter() - started
        return report

    # ---- whole-store operations ------------------------------------------------------------------

    async def commit_all(self) -> None:
        """Commit every queue with buffered data (at most ``recovery_concurrency`` at once)."""
        limit = asyncio.Semaphore(self.settings.recovery_concurrency)

        async def commit_one(flat_file: FlatMessageFile) -> None:
            async with limit:
                await flat_file.commit()

        await asyncio.gather(*(commit_one(f) for f in self._files.values() if f.has_pending))

    async def destroy_topic(self, topic: str) -> None:
        """Delete a topic's cold data (objects first), then its rows."""
        queues = await asyncio.to_thread(self.metadata.list_queues, topic)
        for position in queues:
            key = (position.topic, position.queue_id)
            flat_file = self._files.pop(key, None) or self._new_file(position)
            if not flat_file.commit_log.segments and not flat_file.consume_queue.segments:
                await flat_file.commit_log.recover()
                await flat_file.consume_queue.recover()
            await flat_file.destroy()
            self._failed.pop(key, None)
        await asyncio.to_thread(self.metadata.delete_topic, topic)


def _records(
    grouped: dict[tuple[str, SegmentFileType], list[SegmentRecord]], path: str, file_type: FileType
) -> list[SegmentRecord]:
    return grouped.get((path, SegmentFileType(file_type.value)), [])


def _log_recovery(key: QueueKey, result: RecoveryResult) -> None:
    """One line for a queue whose recovery changed something; a warning when it cut what a crash left."""
    cut = (
        result.dropped_units or result.orphan_bytes_removed or result.orphan_bytes_abandoned or result.records_completed
    )
    (log.warning if cut else log.info)(
        "cold queue recovered",
        topic=key[0],
        queue_id=key[1],
        archived_offset=result.archived_offset,
        recorded_offset=result.previous_archived_offset,
        dropped_units=result.dropped_units,
        orphan_bytes_removed=result.orphan_bytes_removed,
        orphan_bytes_abandoned=result.orphan_bytes_abandoned,
        records_completed=result.records_completed,
    )
