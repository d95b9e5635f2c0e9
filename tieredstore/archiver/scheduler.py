"""The Dispatcher: scans every hot queue and sets the queue's worker (``worker.QueueWorker``) going when it is due.

The archiver group-commits every hot-store queue into its cold flat file, queue by queue. For one queue,
under that queue's lock (DESIGN.md "Write path"):

1. a commit that failed last time is retried first (its buffers were kept);
2. a flush is due when the oldest pending message is older than ``group_commit_timeout``, the backlog
   reaches ``group_commit_count``, or the caller forces it;
3. up to ``group_commit_count`` messages / ``group_commit_size`` bytes, always at least one however
   large, move from the hot store into the flat commit-log and consume-queue buffers, from below its
   flushed position only, so that a power loss cannot take back what is archived: a hot store this
   process writes is flushed by the read that needs it (``flush_queue``), a followed one is archived up
   to its writer's last checkpoint (``durable_max_offset``, at most ``flush_interval`` behind);
4. commit log, consume queue, key-index entries, then metadata are committed in that order (one
   ``FlatMessageFile.commit``, the entries put from its hook);
5. while backlog remains above the count threshold (or the flush is forced) the queue goes again at
   once. At most ``max_pending_commits`` batches are in memory or in flight across all queues, so slow
   storage slows the archiver down instead of growing its memory.

A failed commit puts its queue on an exponential backoff; the other queues carry on. A commit that hangs
fails too: the runtime's provider abandons a storage call after ``commit_timeout`` (``providers.watchdog``;
counted here per queue) and holds uploads to ``max_upload_bytes_per_second`` (``providers.throttle``). The
hot store's blocking calls run in worker threads. Hot data is deleted (``maintain``) only once it is archived.

With a LeaseManager (several archivers on one PostgreSQL, see ``tieredstore.archiver.leases``) the dispatcher
serves only the queues it holds a lease on, opening (recovering) each one when it is acquired, never
all at start. A queue whose lease was lost, whose position update hit another archiver's epoch
(LeaseLostError) or whose commit found another writer's bytes (CommitConflictError) is dropped at
once with its buffers, never retried: the hot store still has the messages, and if the lease is
still (or again) ours the queue is reloaded from metadata. Surplus leases are released only after
the queue's in-flight batch is done.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable

import structlog

from tieredstore.archiver.hot_views import read_hot_view
from tieredstore.archiver.lease_rounds import LeaseRounds
from tieredstore.archiver.leases import LeaseManager
from tieredstore.archiver.maintenance import Maintenance
from tieredstore.archiver.views import DispatchStats, OnceResult, QueueStatus
from tieredstore.archiver.worker import QueueWorker
from tieredstore.basics import QueueKey, now_ms
from tieredstore.config import ArchiverSettings
from tieredstore.errors import TieredStoreError
from tieredstore.retention import ArchiverRetention
from tieredstore.runtime import Runtime

log = structlog.get_logger(__name__)


class Dispatcher(LeaseRounds, Maintenance):
    """Moves messages from a LocalMessageStore into a FlatFileStore; one instance per archiver process."""

    @classmethod
    def from_runtime(
        cls,
        runtime: Runtime,
        *,
        settings: ArchiverSettings | None = None,
        clock_ms: Callable[[], int] = now_ms,
        leases: LeaseManager | None = None,
        with_index: bool = True,
    ) -> Dispatcher:
        """A dispatcher over the runtime's hot store, flat files, key index (``with_index``) and metrics."""
        if runtime.hot is None:
            raise TieredStoreError("the archiver needs the hot store; open the runtime with hot=True")
        return cls(
            runtime.hot,
            runtime.flat,
            metadata=runtime.metadata,
            index=runtime.index if with_index else None,
            settings=settings or runtime.config.archiver,
            metrics=runtime.metrics,
            maintain_interval=runtime.config.archiver.maintain_interval,
            clock_ms=clock_ms,
            leases=leases,
            index_upkeep=runtime.keys.maintain if with_index else None,
            retention=ArchiverRetention(
                runtime.metadata,
                runtime.metrics,
                default_reserve_hours=runtime.config.default_reserve_hours,
                keys=runtime.keys if with_index else None,
                owner=leases.owner if leases is not None else None,
            ),
        )

    # ---- start-up ----------------------------------------------------------------------------------

    async def start(self) -> None:
        """Load every cold queue; re-index messages that recovery found archived but metadata had not recorded.

        A crash between the consume-queue commit and the metadata record leaves messages archived whose
        key-index entries may never have been written; indexing them again is harmless (lookups
        de-duplicate by queue offset).
        """
        if self._started:
            return
        if self.leases is not None:
            # Queues are recovered one by one as their leases are acquired: recovering a queue another
            # archiver is writing would cut its committed-but-unrecorded bytes.
            await self._lease_round()
            self._lease_task = asyncio.create_task(self._lease_loop())
            self._started = True
            return
        report = await self.flat.recover()
        for (topic, queue_id), error in report.failed.items():
            log.error("cold queue could not be recovered", topic=topic, queue_id=queue_id, error=str(error))
        for (topic, queue_id), result in report.changed.items():
            if self._recovery_to_reindex(result):
                await self._reindex(await self._worker(topic, queue_id), result)
        self._started = True

    # ---- the public loop entry points --------------------------------------------------------------

    async def scan(self, *, force: bool = False) -> int:
        """One pass over every hot queue: dispatch each queue that is due, wait for it; returns messages archived.

        ``force`` archives what is written now, whatever the group-commit thresholds (of a followed hot
        store, what its writer's checkpoint covers after a short wait: see ``HotViews.settled``).
        """
        before = self.stats.messages
        await self._require_started()
        tasks = await self._dispatch_due(force=force)
        if tasks:
            await asyncio.gather(*tasks)
        return self.stats.messages - before

    async def run_once(self, *, max_attempts: int = 5) -> OnceResult:
        """Archive everything the hot store holds now (of a followed one, as ``scan(force=True)``), then return.

        A queue whose commits fail ``max_attempts`` times in a row (with backoff between) is given up
        and named in the result; the others are finished regardless.
        """
        await self._require_started()
        views = await self._hot_views.settled(self._next_offsets)
        targets = {key: view.archivable_offset for key, view in views.items()}
        failed: dict[QueueKey, str] = {}
        while True:
            await self._open_new(key for key in targets if key not in failed)
            open_queues = []
            for key, target in targets.items():
                if key in failed or not self._serves(key):
                    continue
                worker = await self._opened_worker(*key)
                if worker is None:
                    worker = self._queues.get(key)
                    if worker is None:
                        continue  # lost to another archiver, which archives it now
                    if worker.failures >= max_attempts:
                        failed[key] = worker.last_error or "cold queue could not be opened"
                    elif worker.retry_at > time.monotonic():
                        open_queues.append(worker)
                    continue
                worker.check_hot_behind(views[key].max_offset)
                if worker.archived_offset >= target and not worker.needs_commit:
                    continue
                if worker.failures >= max_attempts:
                    failed[key] = worker.last_error or "commit failed"
                    continue
                open_queues.append(worker)
            if not open_queues:
                break
            now = time.monotonic()
            ready = [w for w in open_queues if w.retry_at <= now]
            if not ready:
                await asyncio.sleep(max(0.0, min(w.retry_at for w in open_queues) - now))
                continue
            await asyncio.gather(
                *(self._drain(w, until=targets[(w.topic, w.queue_id)]) for w in ready if w.flat_file is not None)
            )
        await self._release_hot_pages(force=True)
        await self._maintain_index()
        return OnceResult(self.stats, failed)

    async def run(self, stop: asyncio.Event) -> DispatchStats:
        """Scan and dispatch until ``stop`` is set; then stop taking batches and finish what is in flight.

        In-flight commits get ``shutdown_timeout`` seconds; whatever is still running then is
        abandoned (a crash-equivalent the next start recovers from). Positions are flushed to metadata.
        """
        await self._require_started()
        next_maintain = time.monotonic() + self.maintain_interval
        while not stop.is_set():
            await self._dispatch_due(force=False)
            if time.monotonic() >= next_maintain:
                await self.maintain()
                next_maintain = time.monotonic() + self.maintain_interval
            try:
                await asyncio.wait_for(stop.wait(), timeout=self.settings.scan_interval)
            except TimeoutError:
                pass
        await self.shutdown()
        return self.stats

    async def shutdown(self) -> None:
        """Stop taking new batches, wait for in-flight ones (then abandon them), record positions."""
        self._stopping = True
        timeout = self.settings.shutdown_timeout
        deadline = time.monotonic() + timeout
        if self._lease_task is not None:
            self._lease_task.cancel()
            await asyncio.gather(self._lease_task, *self._releases, return_exceptions=True)
        running = [task for task in self._tasks.values() if not task.done()]
        if running:
            _done, late = await asyncio.wait(running, timeout=timeout * 0.8)
            for task in late:
                task.cancel()
            if late:
                log.warning("abandoned in-flight commits at shutdown; the next start recovers them", queues=len(late))
                await asyncio.wait(late, timeout=1.0)
        for worker in self._queues.values():
            flat_file = worker.flat_file
            remaining = deadline - time.monotonic()
            if flat_file is None or remaining <= 0 or worker.lock.locked():
                continue
            if not flat_file.has_pending and flat_file.position.max_offset != flat_file.archived_offset:
                try:
                    # The batch's key-index entries go in first: once recorded, nothing re-indexes them.
                    await asyncio.wait_for(flat_file.commit(on_durable=worker.put_entries), timeout=remaining)
                except (TieredStoreError, OSError, TimeoutError) as error:
                    log.warning(
                        "positions not recorded at shutdown",
                        topic=worker.topic,
                        queue_id=worker.queue_id,
                        error=str(error),
                    )
        if self.leases is not None:
            try:
                await asyncio.to_thread(self.leases.close)
            except TieredStoreError as error:
                log.warning("leases not released at shutdown; they expire on their own", error=str(error))

    def status(self) -> list[QueueStatus]:
        """Every queue the dispatcher has seen, sorted by topic and queue id."""
        return [
            QueueStatus(
                w.topic, w.queue_id, w.archived_offset, w.hot.min_offset, w.hot.max_offset, w.failures, w.last_error
            )
            for _key, w in sorted(self._queues.items())
        ]

    def archived_offset(self, topic: str, queue_id: int) -> int:
        """The first offset not archived yet (0 for a queue never seen); safe to call from a thread."""
        worker = self._queues.get((topic, queue_id))
        return worker.archived_offset if worker is not None else 0

    # ---- scheduling --------------------------------------------------------------------------------

    async def _require_started(self) -> None:
        if not self._started:
            await self.start()

    def _next_offsets(self) -> dict[QueueKey, int]:
        """Where the archive of every opened queue goes on."""
        return {key: w.append_offset for key, w in self._queues.items() if w.flat_file is not None}

    async def _dispatch_due(self, *, force: bool) -> list[asyncio.Task[None]]:
        snapshot = await (
            self._hot_views.settled(self._next_offsets) if force else self._hot_views.snapshot(self._next_offsets())
        )
        known = {key for key, worker in self._queues.items() if worker.flat_file is not None}
        await self._open_new(snapshot)
        now = time.monotonic()
        started: list[asyncio.Task[None]] = []
        for (topic, queue_id), view in snapshot.items():
            if not self._serves((topic, queue_id)):
                continue  # released or lost since the snapshot
            worker = await self._opened_worker(topic, queue_id)
            if worker is None:
                continue
            if (topic, queue_id) not in known:
                # Just opened: the snapshot could not know where its archive starts, so look again.
                view = await asyncio.to_thread(read_hot_view, self.hot, topic, queue_id, worker.append_offset)
            worker.hot = view
            worker.update_lag()
            worker.check_hot_behind(view.max_offset)
            if (topic, queue_id) in self._tasks or worker.retry_at > now or self._stopping:
                continue
            if not self._is_due(worker, force=force):
                continue
            task = asyncio.create_task(self._drain(worker, until=view.archivable_offset if force else None))
            self._tasks[(topic, queue_id)] = task
            task.add_done_callback(functools.partial(self._forget_task, (topic, queue_id)))
            started.append(task)
        return started

    def _forget_task(self, key: QueueKey, _task: asyncio.Task[None]) -> None:
        self._tasks.pop(key, None)

    def _is_due(self, worker: QueueWorker, *, force: bool, until: int | None = None) -> bool:
        if worker.needs_commit:
            return True
        view = worker.hot
        next_offset = worker.append_offset
        if view.min_offset > next_offset:
            return True  # a lost range to skip (or a failed skip to retry, gated by its backoff)
        backlog = view.archivable_offset - next_offset
        if backlog <= 0:
            return False
        if force or (until is not None and next_offset < until):
            return True
        if backlog >= self.settings.group_commit_count:
            return True
        oldest = view.oldest_pending_ms
        return oldest is not None and self.clock_ms() - oldest >= self.settings.group_commit_timeout * 1000

    async def _drain(self, worker: QueueWorker, *, until: int | None) -> None:
        """Archive batches of one queue while it stays due; failures end the drain with a backoff."""
        async with worker.lock:
            while not self._stopping:
                if until is not None and worker.append_offset >= until and not worker.needs_commit:
                    return
                if not self._serves((worker.topic, worker.queue_id)):
                    return  # the lease ran out, was lost or is being released: start nothing more
                async with self._commit_slots:
                    moved = await worker.archive_batch()
                if not moved or not self._is_due(worker, force=False, until=until):
                    return
