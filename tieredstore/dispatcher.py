"""The archiver: group-commits every hot-store queue into its cold flat file, queue by queue.

For one queue, under that queue's lock (DESIGN.md "Write path"):

1. a commit that failed last time is retried first (its buffers were kept);
2. a flush is due when the oldest pending message is older than ``group_commit_timeout``, the backlog
   reaches ``group_commit_count``, or the caller forces it;
3. up to ``group_commit_count`` messages / ``group_commit_size`` bytes, always at least one however
   large, move from the hot store into the flat commit-log and consume-queue buffers, from below its
   flushed position only, so that a power loss cannot take back what is archived: a hot store this
   process writes is flushed by the read that needs it (``flush_queue``), a followed one is archived up
   to its writer's last checkpoint (``durable_max_offset``, at most ``flush_interval`` behind);
4. commit log, consume queue, key-index entries, then metadata are committed in that order;
5. while backlog remains above the count threshold (or the flush is forced) the queue goes again at
   once. At most ``max_pending_commits`` batches are in memory or in flight across all queues, so slow
   storage slows the archiver down instead of growing its memory.

A failed commit puts its queue on an exponential backoff; the other queues carry on. A commit that hangs
fails too: the runtime's provider abandons a storage call after ``commit_timeout`` (``providers.watchdog``;
counted here per queue) and holds uploads to ``max_upload_bytes_per_second`` (``providers.throttle``). The
hot store's blocking calls run in worker threads. Hot data is deleted (``maintain``) only once it is archived.

With a LeaseManager (several archivers on one PostgreSQL, see ``tieredstore.leases``) the dispatcher
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
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeGuard

import structlog

from tieredstore.config import ArchiverSettings
from tieredstore.errors import (
    CommitConflictError,
    CommitTimeoutError,
    LeaseLostError,
    NotFoundError,
    TieredStoreError,
)
from tieredstore.flat.message_file import FlatMessageFile, RecoveryResult
from tieredstore.flat.store import FlatFileStore
from tieredstore.formats.message import PROPERTY_KEYS, PROPERTY_UNIQ_KEY, index_keys_of
from tieredstore.index import IndexEntry, IndexFileStatus, IndexService
from tieredstore.leases import LeaseManager
from tieredstore.local.batch import HotBatch
from tieredstore.local.hot_reader import HotReader
from tieredstore.local.store import LocalMessageStore
from tieredstore.metadata import MetadataStore
from tieredstore.metrics import Metrics
from tieredstore.retention import ArchiverRetention
from tieredstore.runtime import Runtime
from tieredstore.topic_filter import TopicFilter

log = structlog.get_logger(__name__)

QueueKey = tuple[str, int]
# A record can only carry keys if these bytes occur in it; the search is much cheaper than a decode.
_KEY_MARKERS = (f"{PROPERTY_KEYS}\x01".encode(), f"{PROPERTY_UNIQ_KEY}\x01".encode())
# Hot pages every queue has read are released after this much more was read, or this many seconds
# (see Dispatcher._release_hot_pages).
PAGE_RELEASE_BYTES = 32 << 20
PAGE_RELEASE_INTERVAL = 1.0
# A pass that archives "everything now" over a followed hot store waits this many of the writer's flush
# intervals (at most FLUSH_WAIT_MAX seconds, looking every FLUSH_WAIT_POLL) for its checkpoint to cover
# what is written: a writer late by more than that is not waited for (see Dispatcher._settled_snapshot).
FLUSH_WAIT_INTERVALS = 3
FLUSH_WAIT_MAX = 10.0
FLUSH_WAIT_POLL = 0.05


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class HotView:
    """What the hot store says about one queue at one moment."""

    min_offset: int
    max_offset: int
    # STORETIMESTAMP of the first message not archived yet; None when nothing is pending.
    oldest_pending_ms: int | None
    # One past the last message a batch may take: a followed store's flushed end; the write position of a
    # store this process writes, which the batch read flushes first. Lag counts to max_offset.
    archivable_offset: int


# A queue's view before the first scan looked at it.
UNSEEN = HotView(0, 0, None, 0)


@dataclass(slots=True)
class _QueueState:
    topic: str
    queue_id: int
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    flat_file: FlatMessageFile | None = None
    topic_id: int | None = None
    hot: HotView = UNSEEN
    # Index entries of buffered messages: put after the consume queue commits, dropped once recorded.
    unrecorded_entries: list[IndexEntry] = field(default_factory=list)
    unrecorded_messages: int = 0
    unrecorded_bytes: int = 0
    failures: int = 0
    retry_at: float = 0.0
    last_error: str | None = None
    blocked_gap: tuple[int, int] | None = None
    # The hot store holds fewer offsets than are archived (it was replaced or lost its files): said once.
    hot_behind: bool = False
    # Where the last batch read ended in the hot commit log: the queue's next record lies at or after it.
    hot_position: int | None = None

    @property
    def archived_offset(self) -> int:
        return self.flat_file.archived_offset if self.flat_file is not None else 0

    @property
    def append_offset(self) -> int:
        return self.flat_file.append_offset if self.flat_file is not None else 0

    @property
    def needs_commit(self) -> bool:
        """A batch is buffered or committed but not yet recorded in metadata (a failed commit)."""
        flat_file = self.flat_file
        if flat_file is None:
            return False
        return (
            flat_file.has_pending
            or bool(self.unrecorded_entries)
            or flat_file.position.max_offset != flat_file.archived_offset
        )


@dataclass(frozen=True, slots=True)
class QueueStatus:
    """One queue as the archiver sees it: for progress displays and ``--once`` summaries."""

    topic: str
    queue_id: int
    archived_offset: int
    hot_min_offset: int
    hot_max_offset: int
    failures: int
    last_error: str | None

    @property
    def lag(self) -> int:
        return max(0, self.hot_max_offset - self.archived_offset)


@dataclass(slots=True)
class DispatchStats:
    """Running totals since the dispatcher started."""

    messages: int = 0
    bytes: int = 0
    commits: int = 0
    commit_failures: int = 0
    lost_messages: int = 0
    # Queues dropped because another archiver took them over (or wrote where this one meant to).
    queues_lost: int = 0
    started: float = field(default_factory=time.monotonic)

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started


@dataclass(frozen=True, slots=True)
class OnceResult:
    """What ``run_once`` archived, and the queues it could not finish (with their last error)."""

    stats: DispatchStats
    failed: dict[QueueKey, str]


@dataclass(frozen=True, slots=True)
class _Batch:
    records: HotBatch | None
    hot: HotView
    # Key-index entries of the records, found in the reading thread (off the event loop).
    entries: list[IndexEntry] = field(default_factory=list)


class Dispatcher:
    """Moves messages from a LocalMessageStore into a FlatFileStore; one instance per archiver process."""

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
        clock_ms: Callable[[], int] = wall_clock_ms,
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
        self._queues: dict[QueueKey, _QueueState] = {}
        # The furthest any batch read reached in the hot commit log, and when pages were last released.
        self._hot_read_end = 0
        self._pages_released_at = 0.0
        self._read_end_at_release = 0
        self._commit_slots = asyncio.Semaphore(self.settings.max_pending_commits)
        self._tasks: dict[QueueKey, asyncio.Task[None]] = {}
        self._stopping = False
        self._started = False
        self.leases = leases
        self._lease_task: asyncio.Task[None] | None = None
        self._releases: set[asyncio.Task[None]] = set()
        self._queues_with_rows: set[QueueKey] = set()
        self._topic_ids: dict[str, int] = {}
        # Leases found lost since the last lease round, by it or by a commit the epoch fence refused.
        self._leases_lost: set[QueueKey] = set()

    @classmethod
    def from_runtime(
        cls,
        runtime: Runtime,
        *,
        settings: ArchiverSettings | None = None,
        clock_ms: Callable[[], int] = wall_clock_ms,
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
            # A deletion in cold storage holds the queue's lease for a lease duration first: see check_lease.
            self.metadata.set_epoch_fence(self.leases.epoch_of, storage_hold_ms=self.leases.ttl_ms)
            await self._lease_round()
            self._lease_task = asyncio.create_task(self._lease_loop())
            self._started = True
            return
        report = await self.flat.recover()
        for (topic, queue_id), error in report.failed.items():
            log.error("cold queue could not be recovered", topic=topic, queue_id=queue_id, error=str(error))
        for (topic, queue_id), result in report.changed.items():
            if self._recovery_to_reindex(result):
                await self._reindex(await self._state(topic, queue_id), result)
        self._started = True

    def _recovery_to_reindex(self, result: RecoveryResult | None) -> TypeGuard[RecoveryResult]:
        """Whether recovery found messages archived that metadata had not recorded (and we index keys)."""
        return (
            result is not None and self.index is not None and result.archived_offset > result.previous_archived_offset
        )

    async def _reindex(self, state: _QueueState, result: RecoveryResult) -> None:
        """Index the keys of what recovery found archived but unrecorded: its index entries may never have
        been written."""
        end = result.archived_offset
        hot_min = await asyncio.to_thread(self.hot.min_offset, state.topic, state.queue_id)
        offset = max(result.previous_archived_offset, hot_min)
        while offset < end and self.index is not None:
            batch = await asyncio.to_thread(
                self.hot.read_batch, state.topic, state.queue_id, offset, min(1024, end - offset)
            )
            if not len(batch):
                return
            self.metrics.index_items.inc(await self.index.put(self._index_entries(state, batch)))
            offset = batch.next_offset

    # ---- the public loop entry points --------------------------------------------------------------

    async def scan(self, *, force: bool = False) -> int:
        """One pass over every hot queue: dispatch each queue that is due, wait for it; returns messages archived.

        ``force`` archives what is written now, whatever the group-commit thresholds (of a followed hot
        store, what its writer's checkpoint covers after a short wait: see ``_settled_snapshot``).
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
        views = await self._settled_snapshot()
        targets = {key: view.archivable_offset for key, view in views.items()}
        failed: dict[QueueKey, str] = {}
        while True:
            await self._open_new(key for key in targets if key not in failed)
            open_queues = []
            for key, target in targets.items():
                if key in failed or not self._serves(key):
                    continue
                state = await self._opened_state(*key)
                if state is None:
                    state = self._queues.get(key)
                    if state is None:
                        continue  # lost to another archiver, which archives it now
                    if state.failures >= max_attempts:
                        failed[key] = state.last_error or "cold queue could not be opened"
                    elif state.retry_at > time.monotonic():
                        open_queues.append(state)
                    continue
                self._check_hot_behind(state, views[key].max_offset)
                if state.archived_offset >= target and not state.needs_commit:
                    continue
                if state.failures >= max_attempts:
                    failed[key] = state.last_error or "commit failed"
                    continue
                open_queues.append(state)
            if not open_queues:
                break
            now = time.monotonic()
            ready = [s for s in open_queues if s.retry_at <= now]
            if not ready:
                await asyncio.sleep(max(0.0, min(s.retry_at for s in open_queues) - now))
                continue
            await asyncio.gather(
                *(self._drain(s, until=targets[(s.topic, s.queue_id)]) for s in ready if s.flat_file is not None)
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
        for state in self._queues.values():
            flat_file = state.flat_file
            remaining = deadline - time.monotonic()
            if flat_file is None or remaining <= 0 or state.lock.locked():
                continue
            if not flat_file.has_pending and flat_file.position.max_offset != flat_file.archived_offset:
                try:
                    await asyncio.wait_for(flat_file.commit(), timeout=remaining)
                except (TieredStoreError, OSError, TimeoutError) as error:
                    log.warning(
                        "positions not recorded at shutdown",
                        topic=state.topic,
                        queue_id=state.queue_id,
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
                s.topic, s.queue_id, s.archived_offset, s.hot.min_offset, s.hot.max_offset, s.failures, s.last_error
            )
            for _key, s in sorted(self._queues.items())
        ]

    def archived_offset(self, topic: str, queue_id: int) -> int:
        """The first offset not archived yet (0 for a queue never seen); safe to call from a thread."""
        state = self._queues.get((topic, queue_id))
        return state.archived_offset if state is not None else 0

    # ---- maintenance -------------------------------------------------------------------------------

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
        for key, state in sorted(self._queues.items()):
            async with state.lock:
                # Checked under the lock: a batch or a lease round may have changed the queue meanwhile.
                if state.flat_file is None or state.needs_commit or not self._serves(key):
                    continue
                try:
                    await retention.expire_queue(state.flat_file, topics.get(state.topic), now)
                except (LeaseLostError, CommitConflictError) as error:
                    self._lose_queue(state, error, phase="retention")
                except (TieredStoreError, OSError) as error:
                    self.metrics.retention_failures.inc()
                    log.warning(
                        "cold retention failed; the next pass retries",
                        topic=state.topic,
                        queue_id=state.queue_id,
                        error=f"{type(error).__name__}: {error}",
                    )
        if self.index is not None:
            try:
                await retention.expire_index(now, topics)
            except (TieredStoreError, OSError) as error:
                self.metrics.retention_failures.inc()
                log.warning("key-index retention failed; the next pass retries", error=str(error))

    def _archived_for_retention(self, topic: str, queue_id: int) -> int:
        state = self._queues.get((topic, queue_id))
        if state is None or state.flat_file is None:
            return 0  # never seen: nothing of it counts as archived
        return state.flat_file.archived_offset

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

    # ---- scheduling --------------------------------------------------------------------------------

    async def _require_started(self) -> None:
        if not self._started:
            await self.start()

    async def _hot_snapshot(self) -> dict[QueueKey, HotView]:
        archived = {key: s.append_offset for key, s in self._queues.items() if s.flat_file is not None}
        return await asyncio.to_thread(self._read_hot_views, archived)

    def _read_hot_views(self, archived: dict[QueueKey, int]) -> dict[QueueKey, HotView]:
        views = {}
        for topic, queue_id in self.hot.queues():
            if not self.topics.archives(topic) or not self._serves((topic, queue_id)):
                continue
            views[(topic, queue_id)] = self._hot_view(topic, queue_id, archived.get((topic, queue_id)))
        return views

    def _hot_view(self, topic: str, queue_id: int, next_offset: int | None) -> HotView:
        hot_min = self.hot.min_offset(topic, queue_id)
        # Read before the write position, so that it never exceeds it.
        archivable = self.hot.durable_max_offset(topic, queue_id) if self.hot.read_only else None
        hot_max = self.hot.max_offset(topic, queue_id)
        if archivable is None:
            archivable = hot_max
        oldest: int | None = None
        if next_offset is not None and archivable > next_offset:
            try:
                oldest = self.hot.store_timestamp(topic, queue_id, max(next_offset, hot_min))
            except NotFoundError:
                oldest = None
            except (TieredStoreError, OSError):
                # A record whose timestamp cannot be read now (a follower just after the writer restarted):
                # make the queue due, so that its batch read reports the error and backs the queue off, as
                # for any hot-side failure, instead of the scan ending the process.
                oldest = 0
        return HotView(hot_min, hot_max, oldest, archivable)

    async def _settled_snapshot(self) -> dict[QueueKey, HotView]:
        """The hot views for a pass that archives "everything now".

        A hot store this process writes can be archived up to its write position (the batch reads flush
        it). A followed one is flushed by its writer every ``flush_interval``: its checkpoint is waited
        for, a few flush intervals at most, and what that still does not cover is left to a later pass.
        """
        snapshot = await self._hot_snapshot()
        written = {key: view.max_offset for key, view in snapshot.items()}
        waited = min(FLUSH_WAIT_INTERVALS * self.hot.config.flush_interval, FLUSH_WAIT_MAX)
        deadline = time.monotonic() + waited
        while time.monotonic() < deadline and any(
            view.archivable_offset < written.get(key, 0) for key, view in snapshot.items()
        ):
            await asyncio.sleep(FLUSH_WAIT_POLL)
            snapshot = await self._hot_snapshot()
        unflushed = sum(max(0, written.get(key, 0) - view.archivable_offset) for key, view in snapshot.items())
        if unflushed:
            log.warning(
                "the hot store's writer has not flushed everything written yet; a later pass archives it",
                unflushed_messages=unflushed,
                waited_seconds=waited,
            )
        return snapshot

    async def _dispatch_due(self, *, force: bool) -> list[asyncio.Task[None]]:
        snapshot = await (self._settled_snapshot() if force else self._hot_snapshot())
        known = {key for key, state in self._queues.items() if state.flat_file is not None}
        await self._open_new(snapshot)
        now = time.monotonic()
        started: list[asyncio.Task[None]] = []
        for (topic, queue_id), view in snapshot.items():
            if not self._serves((topic, queue_id)):
                continue  # released or lost since the snapshot
            state = await self._opened_state(topic, queue_id)
            if state is None:
                continue
            if (topic, queue_id) not in known:
                # Just opened: the snapshot could not know where its archive starts, so look again.
                view = await asyncio.to_thread(self._hot_view, topic, queue_id, state.append_offset)
            state.hot = view
            self._update_lag(state)
            self._check_hot_behind(state, view.max_offset)
            if (topic, queue_id) in self._tasks or state.retry_at > now or self._stopping:
                continue
            if not self._is_due(state, force=force):
                continue
            task = asyncio.create_task(self._drain(state, until=view.archivable_offset if force else None))
            self._tasks[(topic, queue_id)] = task
            task.add_done_callback(functools.partial(self._forget_task, (topic, queue_id)))
            started.append(task)
        return started

    def _forget_task(self, key: QueueKey, _task: asyncio.Task[None]) -> None:
        self._tasks.pop(key, None)

    def _is_due(self, state: _QueueState, *, force: bool, until: int | None = None) -> bool:
        if state.needs_commit:
            return True
        view = state.hot
        next_offset = state.append_offset
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

    async def _drain(self, state: _QueueState, *, until: int | None) -> None:
        """Archive batches of one queue while it stays due; failures end the drain with a backoff."""
        async with state.lock:
            while not self._stopping:
                if until is not None and state.append_offset >= until and not state.needs_commit:
                    return
                if not self._serves((state.topic, state.queue_id)):
                    return  # the lease ran out, was lost or is being released: start nothing more
                async with self._commit_slots:
                    moved = await self._archive_batch(state)
                if not moved or not self._is_due(state, force=False, until=until):
                    return

    # ---- one batch ---------------------------------------------------------------------------------

    async def _archive_batch(self, state: _QueueState) -> bool:
        """Retry a failed commit, or move and commit one batch; returns whether anything was archived."""
        flat_file = state.flat_file
        assert flat_file is not None
        if state.needs_commit:
            return await self._commit(state)
        start = flat_file.append_offset
        try:
            batch = await asyncio.to_thread(self._read_batch, state, start)
        except NotFoundError:
            batch = _Batch(None, await asyncio.to_thread(self._hot_view, state.topic, state.queue_id, start))
        except (TieredStoreError, OSError) as error:
            # The hot side failed (a record that does not check out yet, a file the writer is replacing):
            # back off this queue like a failed commit, but cold storage is fine, so its health stays.
            self._back_off(state, error, phase="hot read")
            return False
        state.hot = batch.hot
        if batch.hot.min_offset > start:
            return await self._skip_lost_range(state, start, batch.hot.min_offset)
        if batch.records is None or not len(batch.records):
            return False
        last = batch.records.units[-1]
        state.hot_position = int(last["commitlog_offset"]) + int(last["size"])
        self._hot_read_end = max(self._hot_read_end, state.hot_position)
        await self._release_hot_pages()
        buffered = await self._buffer(state, batch.records, batch.entries, start)
        # The hot copies are not needed once buffered: only the cold queue's buffers stay while it commits.
        del batch
        return buffered and await self._commit(state)

    async def _buffer(self, state: _QueueState, records: HotBatch, entries: list[IndexEntry], start: int) -> bool:
        """Append the batch to the cold queue in one call; on failure keep what was buffered, for the retry."""
        flat_file = state.flat_file
        assert flat_file is not None
        sizes = records.sizes
        try:
            # The cold commit log takes the batch's buffer over (its PHYSICALOFFSETs are rewritten in place).
            await flat_file.append_records(records)
        except (TieredStoreError, OSError) as error:
            # A batch that rolled a segment may have failed part way: what was buffered stays buffered.
            appended = flat_file.append_offset - start
            state.unrecorded_messages += appended
            state.unrecorded_bytes += int(sizes[:appended].sum())
            state.unrecorded_entries.extend(e for e in entries if e.queue_offset < flat_file.append_offset)
            self._record_failure(state, error, phase="append")
            return False
        state.unrecorded_messages += len(sizes)
        state.unrecorded_bytes += int(sizes.sum())
        state.unrecorded_entries.extend(entries)
        return True

    async def _release_hot_pages(self, *, force: bool = False) -> None:
        """Now and then (or now, when forced), unmap the hot commit log below every queue's next unread record.

        Batch reads unmap the pages they copy from as they go (``unmap_hot_reads``); this sweeps up
        what else mapped hot pages: the pages a fault mapped around a batch's last record, the store
        timestamps read for the group-commit timeout, a follower's checks of new records. Without it
        they would stay in the archiver's RSS until retention deletes the file. Only advisory: a page
        released too early is mapped again when read.
        """
        now = time.monotonic()
        if (
            not force
            and self._hot_read_end - self._read_end_at_release < PAGE_RELEASE_BYTES
            and now - self._pages_released_at < PAGE_RELEASE_INTERVAL
        ):
            return
        states = list(self._queues.values())
        if any(state.flat_file is None or state.hot is UNSEEN for state in states):
            return  # a queue being opened, or not looked at yet: where it reads next is not known
        self._pages_released_at, self._read_end_at_release = now, self._hot_read_end
        unread = [
            (state.topic, state.queue_id, state.append_offset, state.hot_position)
            for state in states
            if state.append_offset < state.hot.max_offset
        ]
        await asyncio.to_thread(self._release_below, unread, self._hot_read_end)

    def _release_below(self, unread: list[tuple[str, int, int, int | None]], read_end: int) -> None:
        bound = read_end
        for topic, queue_id, offset, position in unread:
            if position is None:  # not read since it was opened: where its next record is
                try:
                    position = self.hot.cq_unit(topic, queue_id, offset).commitlog_offset
                except (TieredStoreError, OSError):
                    continue  # not in the hot store (a lost range): it reads nothing below the bound
            bound = min(bound, position)
        released = self.hot.release_pages(bound)
        if released:
            log.debug("hot pages released", below=bound, bytes=released)

    def _read_batch(self, state: _QueueState, start: int) -> _Batch:
        topic, queue_id = state.topic, state.queue_id
        settings = self.settings
        hot_min = self.hot.min_offset(topic, queue_id)
        durable = self.hot.durable_max_offset(topic, queue_id)
        if not self.hot.read_only and durable < start + settings.group_commit_count:
            # Ours to flush: one commit-log sync now (shared with sync puts) instead of a flush interval's wait.
            durable = self.hot.flush_queue(topic, queue_id)
        if hot_min > start or durable <= start:
            return _Batch(None, self._hot_view(topic, queue_id, start))
        records = self.hot.read_batch(
            topic,
            queue_id,
            start,
            max_count=min(settings.group_commit_count, durable - start),
            max_bytes=settings.group_commit_size,
            unmap=settings.unmap_hot_reads,
        )
        entries = self._index_entries(state, records) if self.index is not None else []
        return _Batch(records, self._hot_view(topic, queue_id, records.next_offset), entries)

    async def _commit(self, state: _QueueState) -> bool:
        """Commit log, consume queue, key-index entries, metadata; on failure keep everything for a retry."""
        flat_file = state.flat_file
        assert flat_file is not None
        started = time.perf_counter()

        async def put_entries() -> None:
            if self.index is not None and state.unrecorded_entries:
                self.metrics.index_items.inc(await self.index.put(state.unrecorded_entries))
                state.unrecorded_entries = []

        try:
            await flat_file.commit(on_durable=put_entries)
        except (TieredStoreError, OSError) as error:
            self._record_failure(state, error, phase="commit")
            return False
        elapsed = time.perf_counter() - started
        metrics = self.metrics
        metrics.commit_latency.observe(elapsed)
        metrics.storage_up.set(1)
        if state.unrecorded_messages:
            metrics.messages_dispatched.labels(state.topic).inc(state.unrecorded_messages)
            metrics.bytes_dispatched.labels(state.topic).inc(state.unrecorded_bytes)
        self.stats.messages += state.unrecorded_messages
        self.stats.bytes += state.unrecorded_bytes
        self.stats.commits += 1
        state.unrecorded_messages = state.unrecorded_bytes = 0
        if state.failures:
            log.info("commits resumed", topic=state.topic, queue_id=state.queue_id, after_failures=state.failures)
        state.failures = 0
        state.retry_at = 0.0
        state.last_error = None
        self._update_lag(state)
        return True

    def _back_off(self, state: _QueueState, error: BaseException, *, phase: str) -> float:
        """Count a failure of this queue and schedule its retry; returns the backoff in seconds."""
        state.failures += 1
        settings = self.settings
        backoff: float = min(settings.retry_max_backoff, settings.retry_initial_backoff * 2 ** (state.failures - 1))
        # Jitter keeps many failing queues from retrying against recovering storage in lock step.
        backoff *= random.uniform(0.8, 1.2)
        state.retry_at = time.monotonic() + backoff
        state.last_error = f"{type(error).__name__}: {error}"
        if phase == "hot read":
            log.warning(
                "hot store read failed; retrying with backoff",
                topic=state.topic,
                queue_id=state.queue_id,
                failures=state.failures,
                retry_in=round(backoff, 3),
                error=state.last_error,
            )
        return backoff

    def _record_failure(self, state: _QueueState, error: BaseException, *, phase: str) -> None:
        if isinstance(error, LeaseLostError | CommitConflictError):
            self._lose_queue(state, error, phase=phase)
            return
        backoff = self._back_off(state, error, phase=phase)
        self.stats.commit_failures += 1
        self.metrics.commit_failures.labels(state.topic).inc()
        self.metrics.storage_up.set(0)
        if isinstance(error, CommitTimeoutError):
            self.metrics.commit_timeouts.labels(state.topic, str(state.queue_id)).inc()
        log.warning(
            "commit attempt abandoned after commit_timeout; retrying with backoff"
            if isinstance(error, CommitTimeoutError)
            else "commit failed; retrying with backoff",
            topic=state.topic,
            queue_id=state.queue_id,
            phase=phase,
            failures=state.failures,
            retry_in=round(backoff, 3),
            error=state.last_error,
        )

    async def _skip_lost_range(self, state: _QueueState, archived: int, hot_min: int) -> bool:
        """The hot store dropped [archived, hot_min) before it was archived: say so, count it, move on."""
        flat_file = state.flat_file
        assert flat_file is not None
        reported = state.blocked_gap[1] if state.blocked_gap and state.blocked_gap[0] == archived else archived
        lost = hot_min - reported
        if lost > 0:
            log.error(
                "hot store dropped messages before they were archived",
                topic=state.topic,
                queue_id=state.queue_id,
                lost_from=reported,
                lost_to=hot_min - 1,
                lost=lost,
            )
            self.metrics.lost_messages.labels(state.topic).inc(lost)
            self.stats.lost_messages += lost
            # Reported and counted once, even when the skip below fails and is retried.
            state.blocked_gap = (archived, hot_min)
        try:
            # The cold queue records the lost range as a hole (durably) and continues at the hot min.
            await flat_file.skip_to(hot_min)
        except (TieredStoreError, OSError) as error:
            self._record_failure(state, error, phase="skip")
            return False
        state.blocked_gap = None
        return True

    # ---- queues ------------------------------------------------------------------------------------

    async def _state(self, topic: str, queue_id: int) -> _QueueState:
        """The queue's state, its cold queue opened (errors propagate)."""
        key = (topic, queue_id)
        state = self._queues.get(key)
        if state is None:
            state = _QueueState(topic, queue_id)
            self._queues[key] = state
        if state.flat_file is None:
            await self._open_queue(state)
        return state

    async def _opened_state(self, topic: str, queue_id: int) -> _QueueState | None:
        """The queue's state, or None when its cold queue cannot be opened now (backing off, failed, not leased)."""
        if not self._serves((topic, queue_id)):
            return None
        state = self._queues.get((topic, queue_id))
        if state is not None and state.flat_file is None and state.retry_at > time.monotonic():
            return None
        key = (topic, queue_id)
        try:
            opened = await self._state(topic, queue_id)
        except (TieredStoreError, OSError) as error:
            failed = self._queues.get(key)
            # A lease round may have found the queue lost (and unloaded it) while it was opening.
            if failed is not None:
                self._record_failure(failed, error, phase="open")
            return None
        if self._queues.get(key) is not opened:
            # Lost or released while opening: the cold queue it loaded must not be reused by a later lease.
            self._unload(opened)
            return None
        return opened

    async def _open_queue(self, state: _QueueState) -> None:
        """Load the cold queue; on first sight create it at the ``start_from`` offset."""
        topic, queue_id = state.topic, state.queue_id
        try:
            flat_file = self.flat.get(topic, queue_id)
        except NotFoundError:
            start = await asyncio.to_thread(self._start_offset, topic, queue_id)
            flat_file = await self.flat.get_or_create(topic, queue_id, start_offset=start)
            log.info("archiving a new queue", topic=topic, queue_id=queue_id, start_offset=flat_file.archived_offset)
        recovered = self.flat.pop_recovery(topic, queue_id)
        topic_id = self._topic_ids.get(topic)
        if topic_id is None:
            topic_id = (await asyncio.to_thread(self.metadata.get_or_create_topic, topic)).id
            self._topic_ids[topic] = topic_id
        state.flat_file = flat_file
        state.topic_id = topic_id
        if self._recovery_to_reindex(recovered):
            # Opened under a lease: whoever wrote the queue before may have died between the consume
            # queue's commit and its index entries (``start`` does the same for every queue without leases).
            await self._reindex(state, recovered)

    async def _open_new(self, keys: Iterable[QueueKey]) -> None:
        """Open the cold queues not opened yet, several at once: first sight of many queues is metadata-bound."""
        limit = asyncio.Semaphore(self.flat.settings.recovery_concurrency)

        async def open_one(key: QueueKey) -> None:
            async with limit:
                await self._opened_state(*key)

        unopened = [key for key in keys if self._serves(key) and self._needs_open(key)]
        if len(unopened) > 1:
            await asyncio.gather(*(open_one(key) for key in unopened))

    def _needs_open(self, key: QueueKey) -> bool:
        state = self._queues.get(key)
        return state is None or (state.flat_file is None and state.retry_at <= time.monotonic())

    def _start_offset(self, topic: str, queue_id: int) -> int:
        start_from = self.settings.start_from
        if start_from == "earliest":
            return self.hot.min_offset(topic, queue_id)
        if start_from == "latest":
            return self.hot.max_offset(topic, queue_id)
        return self.hot.offset_for_timestamp(topic, queue_id, int(start_from), "lower")

    # ---- leases ------------------------------------------------------------------------------------

    def _serves(self, key: QueueKey) -> bool:
        """Whether this dispatcher may write the queue now (always, without leases)."""
        return self.leases is None or self.leases.holds(key)

    async def _lease_loop(self) -> None:
        leases = self.leases
        assert leases is not None
        while not self._stopping:
            await asyncio.sleep(leases.renew_interval)
            await self._lease_round()

    async def _lease_round(self) -> None:
        """Renew, drop lost queues, start releasing surplus ones; acquired ones are opened by the next scan."""
        leases = self.leases
        assert leases is not None
        try:
            await self._create_queue_rows()
            changes = await asyncio.to_thread(leases.round)
        except (TieredStoreError, OSError) as error:
            log.warning(
                "lease renewal failed; this archiver stops writing its queues when their leases run out",
                owner=leases.owner,
                error=f"{type(error).__name__}: {error}",
            )
            return
        for key in changes.lost:
            state = self._queues.get(key)
            if state is not None:
                self._lose_queue(state, LeaseLostError(f"the lease of {key[0]}/{key[1]} was taken over"), phase="renew")
        # A commit the epoch fence refused drops its lease before the round can see it: count it here too.
        lost = self._leases_lost | set(changes.lost)
        self._leases_lost = set()
        if changes.acquired or lost or changes.surplus:
            # Losing a lease (a takeover while this process was cut off or paused) is worth a warning.
            (log.warning if lost else log.info)(
                "leases changed",
                owner=leases.owner,
                acquired=len(changes.acquired),
                lost=len(lost),
                releasing=len(changes.surplus),
                held=len(leases.held()),
                fair_share=changes.fair_share,
                archivers=changes.live_archivers,
            )
        if changes.surplus:
            task = asyncio.create_task(self._release(changes.surplus))
            self._releases.add(task)
            task.add_done_callback(self._releases.discard)

    async def _create_queue_rows(self) -> None:
        """Give every hot queue a metadata row (at its ``start_from`` offset) so that it can be leased."""
        hot_queues = await asyncio.to_thread(self.hot.queues)
        missing = [key for key in hot_queues if key not in self._queues_with_rows and self.topics.archives(key[0])]
        if not missing:
            return
        self._queues_with_rows.update((p.topic, p.queue_id) for p in await asyncio.to_thread(self.metadata.list_queues))
        for topic, queue_id in missing:
            if (topic, queue_id) in self._queues_with_rows:
                continue
            start = await asyncio.to_thread(self._start_offset, topic, queue_id)
            await asyncio.to_thread(self.metadata.get_or_create_queue, topic, queue_id, start_offset=start)
            self._queues_with_rows.add((topic, queue_id))

    async def _release(self, keys: list[QueueKey]) -> None:
        """Hand surplus queues back once their in-flight batch is done (the lease is renewed meanwhile)."""
        leases = self.leases
        assert leases is not None
        for key in keys:
            state = self._queues.get(key)
            if state is not None:
                async with state.lock:
                    self._unload(state)
            try:
                await asyncio.to_thread(leases.release, [key])
            except TieredStoreError as error:
                log.warning("lease release failed; it expires on its own", queue=f"{key[0]}/{key[1]}", error=str(error))

    def _lose_queue(self, state: _QueueState, error: BaseException, *, phase: str) -> None:
        """Another archiver owns the queue now (or wrote where this one meant to): drop it, never retry."""
        key = (state.topic, state.queue_id)
        if isinstance(error, LeaseLostError) and self.leases is not None:
            self.leases.forget(key)
            self._leases_lost.add(key)
        self._unload(state)
        self.stats.queues_lost += 1
        log.warning(
            "lost the queue: dropped its buffered batch (the hot store keeps it); reloaded if leased again",
            topic=state.topic,
            queue_id=state.queue_id,
            phase=phase,
            error=f"{type(error).__name__}: {error}",
        )

    def _unload(self, state: _QueueState) -> None:
        key = (state.topic, state.queue_id)
        if self._queues.get(key) is state:
            del self._queues[key]
        try:
            loaded = self.flat.get(*key)
        except NotFoundError:
            return
        if loaded is state.flat_file:
            self.flat.forget(*key)

    def _check_hot_behind(self, state: _QueueState, hot_max: int) -> None:
        """Say once, loudly, when the hot store holds fewer offsets than cold storage has archived.

        The hot store's max offset never goes down, so it was replaced (a lost disk, a wiped directory)
        or lost files it had not synced. Producers writing into it now reuse offsets the archive holds
        other messages at: those are never archived (the archive goes on from its own offset once the
        hot store passes it), and readers get the hot or the cold message depending on the tier.
        Restoring the archive into the hot store first (``restore --to-store``) avoids both.
        """
        archived = state.archived_offset
        behind = state.flat_file is not None and hot_max < archived
        if behind and not state.hot_behind:
            log.error(
                "the hot store holds fewer offsets than are archived: it was replaced or lost its files; "
                "messages put at offsets below the archived one will not be archived. Restore the archive "
                "into it (tieredstore restore TOPIC --to-store) before producing to this queue",
                topic=state.topic,
                queue_id=state.queue_id,
                hot_max=hot_max,
                archived=archived,
            )
            self.metrics.hot_behind_archive.labels(state.topic).inc()
        elif state.hot_behind and not behind:
            log.warning(
                "the hot store reached the archived offset again; archiving goes on from there",
                topic=state.topic,
                queue_id=state.queue_id,
                archived=archived,
            )
        state.hot_behind = behind

    def _update_lag(self, state: _QueueState) -> None:
        lag = max(0, state.hot.max_offset - state.archived_offset)
        self.metrics.queue_lag.labels(state.topic, str(state.queue_id)).set(lag)

    def _index_entries(self, state: _QueueState, records: HotBatch) -> list[IndexEntry]:
        """Key-index entries of the records that carry keys; only records holding a key marker are decoded."""
        entries = []
        topic_id = state.topic_id if state.topic_id is not None else 0
        for index in records.records_holding(_KEY_MARKERS):
            raw = records.record(index)
            keys = index_keys_of(raw)
            if keys:
                entries.append(
                    IndexEntry(
                        topic=state.topic,
                        topic_id=topic_id,
                        queue_id=state.queue_id,
                        queue_offset=records.first_offset + index,
                        size=len(raw),
                        timestamp=int(records.store_timestamps[index]),
                        keys=keys,
                    )
                )
        return entries
