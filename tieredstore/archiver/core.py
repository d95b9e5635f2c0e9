"""What every part of the archiver shares: its stores and settings, and the queues it serves, each one's worker.

The parts (``scheduler``, ``lease_rounds``, ``maintenance``) build on ArchiverCore as FlatMessageFile's
parts build on QueueFiles; a QueueWorker reaches the stores, metrics and totals through it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeGuard

import structlog

from tieredstore.archiver.hot_pages import HotPages
from tieredstore.archiver.hot_views import HotViews
from tieredstore.archiver.indexing import needs_reindex, reindex
from tieredstore.archiver.leases import LeaseManager
from tieredstore.archiver.views import UNSEEN, DispatchStats
from tieredstore.archiver.worker import QueueWorker
from tieredstore.basics import QueueKey, now_ms
from tieredstore.config import ArchiverSettings
from tieredstore.errors import LeaseLostError, TieredStoreError
from tieredstore.flat.message_file import RecoveryResult
from tieredstore.flat.store import FlatFileStore
from tieredstore.index import IndexService
from tieredstore.local.hot_reader import HotReader
from tieredstore.metadata import MetadataStore
from tieredstore.metrics import Metrics
from tieredstore.retention import ArchiverRetention
from tieredstore.topic_filter import TopicFilter

log = structlog.get_logger(__name__)


class ArchiverCore:
    """The archiver's stores, settings and totals, and a worker for each queue it has opened."""

    def __init__(
        self,
        hot: HotReader,
        flat: FlatFileStore,
        *,
        metadata: MetadataStore,
        index: IndexService | None = None,
        settings: ArchiverSettings | None = None,
        metrics: Metrics | None = None,
        maintain_interval: float = 60.0,
        clock_ms: Callable[[], int] = now_ms,
        leases: LeaseManager | None = None,
        index_upkeep: Callable[[], Awaitable[object]] | None = None,
        retention: ArchiverRetention | None = None,
    ) -> None:
        self.hot = hot
        self.flat = flat
        self.metadata = metadata
        self.index = index
        # What a maintenance pass runs for the key index: ``index.maintain`` unless told otherwise
        # (``KeyIndex.maintain`` also sweeps namespaces left by archivers that are gone).
        self._index_upkeep = index_upkeep or (index.maintain if index is not None else None)
        # Cold retention on the maintenance pass (None: only ``tieredstore retention`` applies it).
        self.retention = retention
        self.settings = settings or ArchiverSettings()
        self.topics = TopicFilter.of(self.settings, cluster=flat.cluster, broker=flat.broker)
        self.metrics = metrics or Metrics()
        self.maintain_interval = maintain_interval
        self.clock_ms = clock_ms
        self.stats = DispatchStats()
        self._queues: dict[QueueKey, QueueWorker] = {}
        self._hot_pages = HotPages(hot)
        # Every queue's batch reads share the hot pages mapped (see HotPages).
        self.hot_window = self._hot_pages.window
        self._hot_views = HotViews(hot, self.topics, self._serves)
        self._commit_slots = asyncio.Semaphore(self.settings.max_pending_commits)
        self._tasks: dict[QueueKey, asyncio.Task[None]] = {}
        self._stopping = False
        self._started = False
        self.leases = leases
        self._lease_task: asyncio.Task[None] | None = None
        self._releases: set[asyncio.Task[None]] = set()
        self._queues_with_rows: set[QueueKey] = set()
        self._topic_ids: dict[str, int] = {}
        # Leases found lost since the last lease round, by it or by a commit whose epoch was refused.
        self._leases_lost: set[QueueKey] = set()

    # ---- what workers ask of the archiver -----------------------------------------------------------

    def start_offset(self, topic: str, queue_id: int) -> int:
        """Where archiving a queue seen for the first time starts (``start_from``); reads the hot store."""
        start_from = self.settings.start_from
        if start_from == "earliest":
            return self.hot.min_offset(topic, queue_id)
        if start_from == "latest":
            return self.hot.max_offset(topic, queue_id)
        return self.hot.offset_for_timestamp(topic, queue_id, int(start_from), "lower")

    async def topic_id(self, topic: str) -> int:
        topic_id = self._topic_ids.get(topic)
        if topic_id is None:
            topic_id = (await asyncio.to_thread(self.metadata.get_or_create_topic, topic)).id
            self._topic_ids[topic] = topic_id
        return topic_id

    async def hot_read_to(self, position: int) -> None:
        """A batch read ended at ``position`` in the hot commit log: release the pages behind every queue if due."""
        self._hot_pages.read_to(position)
        await self._release_hot_pages()

    async def _release_hot_pages(self, *, force: bool = False) -> None:
        """Now and then (or now, when forced), unmap the hot commit log below every queue's next unread record."""
        if not self._hot_pages.due(force=force):
            return
        workers = list(self._queues.values())
        if any(worker.flat_file is None or worker.hot is UNSEEN for worker in workers):
            return  # a queue being opened, or not looked at yet: where it reads next is not known
        await self._hot_pages.release(
            [worker.next_read() for worker in workers if worker.append_offset < worker.hot.max_offset]
        )

    def lose_queue(self, worker: QueueWorker, error: BaseException, *, phase: str) -> None:
        """Another archiver owns the queue now (or wrote where this one meant to): drop it, never retry."""
        key = (worker.topic, worker.queue_id)
        if isinstance(error, LeaseLostError) and self.leases is not None:
            self.leases.forget(key)
            self._leases_lost.add(key)
        self._unload(worker)
        self.stats.queues_lost += 1
        log.warning(
            "lost the queue: dropped its buffered batch (the hot store keeps it); reloaded if leased again",
            topic=worker.topic,
            queue_id=worker.queue_id,
            phase=phase,
            error=f"{type(error).__name__}: {error}",
        )

    # ---- queues ------------------------------------------------------------------------------------

    def _serves(self, key: QueueKey) -> bool:
        """Whether this dispatcher may write the queue now (always, without leases)."""
        return self.leases is None or self.leases.holds(key)

    async def _worker(self, topic: str, queue_id: int) -> QueueWorker:
        """The queue's worker, its cold queue opened (errors propagate)."""
        key = (topic, queue_id)
        worker = self._queues.get(key)
        if worker is None:
            worker = QueueWorker(self, topic, queue_id)
            self._queues[key] = worker
        if worker.flat_file is None:
            await self._open_queue(worker)
        return worker

    async def _opened_worker(self, topic: str, queue_id: int) -> QueueWorker | None:
        """The queue's worker, or None when its cold queue cannot be opened now (backing off, failed, not leased)."""
        if not self._serves((topic, queue_id)):
            return None
        worker = self._queues.get((topic, queue_id))
        if worker is not None and worker.flat_file is None and worker.retry_at > time.monotonic():
            return None
        key = (topic, queue_id)
        try:
            opened = await self._worker(topic, queue_id)
        except (TieredStoreError, OSError) as error:
            failed = self._queues.get(key)
            # A lease round may have found the queue lost (and unloaded it) while it was opening.
            if failed is not None:
                failed.record_failure(error, phase="open")
            return None
        if self._queues.get(key) is not opened:
            # Lost or released while opening: the cold queue it loaded must not be reused by a later lease.
            self._unload(opened)
            return None
        return opened

    async def _open_queue(self, worker: QueueWorker) -> None:
        """Load the worker's cold queue, and re-index what its recovery found archived but unrecorded."""
        recovered = await worker.open()
        if self._recovery_to_reindex(recovered):
            # Opened under a lease: whoever wrote the queue before may have died between the consume
            # queue's commit and its index entries (``start`` does the same for every queue without leases).
            await self._reindex(worker, recovered)

    def _recovery_to_reindex(self, result: RecoveryResult | None) -> TypeGuard[RecoveryResult]:
        """Whether recovery found messages archived that metadata had not recorded (and we index keys)."""
        return self.index is not None and needs_reindex(result)

    async def _reindex(self, worker: QueueWorker, result: RecoveryResult) -> None:
        if self.index is not None:
            topic_id = worker.topic_id if worker.topic_id is not None else 0
            await reindex(self.hot, self.index, self.metrics, (worker.topic, topic_id, worker.queue_id), result)

    async def _open_new(self, keys: Iterable[QueueKey]) -> None:
        """Open the cold queues not opened yet, several at once: first sight of many queues is metadata-bound."""
        limit = asyncio.Semaphore(self.flat.settings.recovery_concurrency)

        async def open_one(key: QueueKey) -> None:
            async with limit:
                await self._opened_worker(*key)

        unopened = [key for key in keys if self._serves(key) and self._needs_open(key)]
        if len(unopened) > 1:
            await asyncio.gather(*(open_one(key) for key in unopened))

    def _needs_open(self, key: QueueKey) -> bool:
        worker = self._queues.get(key)
        return worker is None or (worker.flat_file is None and worker.retry_at <= time.monotonic())

    def _unload(self, worker: QueueWorker) -> None:
        key = (worker.topic, worker.queue_id)
        if self._queues.get(key) is worker:
            del self._queues[key]
        worker.unload()
