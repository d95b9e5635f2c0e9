"""One queue's archiving: its batch from the hot store, its commit, its backoff after a failure.

A QueueWorker holds what the archiver knows of one queue (its cold queue, its last hot view, the batch
buffered but not yet recorded, its failures) and does that queue's work under its lock; the scheduler
(``tieredstore.archiver.scheduler``) decides when.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import structlog

from tieredstore.archiver.hot_pages import NextRead
from tieredstore.archiver.hot_views import read_hot_view
from tieredstore.archiver.indexing import index_entries
from tieredstore.archiver.views import UNSEEN, HotView
from tieredstore.errors import (
    CommitConflictError,
    CommitTimeoutError,
    LeaseLostError,
    NotFoundError,
    TieredStoreError,
)
from tieredstore.flat.message_file import FlatMessageFile, RecoveryResult
from tieredstore.index import IndexEntry
from tieredstore.local.batch import HotBatch

if TYPE_CHECKING:
    from tieredstore.archiver.core import ArchiverCore

log = structlog.get_logger(__name__)


def retry_backoff(failures: int, initial: float, maximum: float) -> float:
    """Seconds before a queue's next attempt after ``failures`` failures in a row: doubling up to ``maximum``."""
    # Jitter keeps many failing queues from retrying against recovering storage in lock step.
    return float(min(maximum, initial * 2 ** (failures - 1))) * random.uniform(0.8, 1.2)


@dataclass(frozen=True, slots=True)
class _Batch:
    records: HotBatch | None
    hot: HotView
    # Key-index entries of the records, found in the reading thread (off the event loop).
    entries: list[IndexEntry] = field(default_factory=list)


@dataclass(eq=False, slots=True)
class QueueWorker:
    """One queue the archiver serves: its state, and its batch, commit, backoff and lost-range skip."""

    archiver: ArchiverCore
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

    def next_read(self) -> NextRead:
        return NextRead(self.topic, self.queue_id, self.append_offset, self.hot_position)

    # ---- open and unload ---------------------------------------------------------------------------

    async def open(self) -> RecoveryResult | None:
        """Load the cold queue (on first sight create it at the ``start_from`` offset); returns what its
        recovery found, if this load recovered it."""
        archiver, topic, queue_id = self.archiver, self.topic, self.queue_id
        lease = None if archiver.leases is None else archiver.leases.hold((topic, queue_id))
        try:
            flat_file = archiver.flat.get(topic, queue_id)
            if lease is not None:
                flat_file.lease = lease  # loaded before the lease was held: written under it from now on
        except NotFoundError:
            start = await asyncio.to_thread(archiver.start_offset, topic, queue_id)
            flat_file = await archiver.flat.get_or_create(topic, queue_id, start_offset=start, lease=lease)
            log.info("archiving a new queue", topic=topic, queue_id=queue_id, start_offset=flat_file.archived_offset)
        recovered = archiver.flat.pop_recovery(topic, queue_id)
        topic_id = await archiver.topic_id(topic)
        self.flat_file = flat_file
        self.topic_id = topic_id
        return recovered

    def unload(self) -> None:
        """Forget the cold queue this worker loaded, so that a later lease loads it afresh from metadata."""
        flat = self.archiver.flat
        try:
            loaded = flat.get(self.topic, self.queue_id)
        except NotFoundError:
            return
        if loaded is self.flat_file:
            flat.forget(self.topic, self.queue_id)

    # ---- one batch ---------------------------------------------------------------------------------

    async def archive_batch(self) -> bool:
        """Retry a failed commit, or move and commit one batch; returns whether anything was archived."""
        flat_file = self.flat_file
        assert flat_file is not None
        if self.needs_commit:
            return await self.commit()
        start = flat_file.append_offset
        hot = self.archiver.hot
        try:
            batch = await asyncio.to_thread(self._read_batch, start)
        except NotFoundError:
            batch = _Batch(None, await asyncio.to_thread(read_hot_view, hot, self.topic, self.queue_id, start))
        except (TieredStoreError, OSError) as error:
            # The hot side failed (a record that does not check out yet, a file the writer is replacing):
            # back off this queue like a failed commit, but cold storage is fine, so its health stays.
            self.back_off(error, phase="hot read")
            return False
        self.hot = batch.hot
        if batch.hot.min_offset > start:
            return await self._skip_lost_range(start, batch.hot.min_offset)
        if batch.records is None or not len(batch.records):
            return False
        last = batch.records.units[-1]
        self.hot_position = int(last["commitlog_offset"]) + int(last["size"])
        await self.archiver.hot_read_to(self.hot_position)
        buffered = await self._buffer(batch.records, batch.entries, start)
        # The hot copies are not needed once buffered: only the cold queue's buffers stay while it commits.
        del batch
        return buffered and await self.commit()

    def _read_batch(self, start: int) -> _Batch:
        topic, queue_id = self.topic, self.queue_id
        archiver = self.archiver
        hot, settings = archiver.hot, archiver.settings
        hot_min = hot.min_offset(topic, queue_id)
        durable = hot.durable_max_offset(topic, queue_id)
        if not hot.read_only and durable < start + settings.group_commit_count:
            # Ours to flush: one commit-log sync now (shared with sync puts) instead of a flush interval's wait.
            durable = hot.flush_queue(topic, queue_id)
        if hot_min > start or durable <= start:
            return _Batch(None, read_hot_view(hot, topic, queue_id, start))
        records = hot.read_batch(
            topic,
            queue_id,
            start,
            max_count=min(settings.group_commit_count, durable - start),
            max_bytes=settings.group_commit_size,
            window=archiver.hot_window,
        )
        topic_id = self.topic_id if self.topic_id is not None else 0
        entries = index_entries(topic, topic_id, queue_id, records) if archiver.index is not None else []
        return _Batch(records, read_hot_view(hot, topic, queue_id, records.next_offset), entries)

    async def _buffer(self, records: HotBatch, entries: list[IndexEntry], start: int) -> bool:
        """Append the batch to the cold queue in one call; on failure keep what was buffered, for the retry."""
        flat_file = self.flat_file
        assert flat_file is not None
        sizes = records.sizes
        try:
            # The cold commit log takes the batch's buffer over (its PHYSICALOFFSETs are rewritten in place).
            await flat_file.append_records(records)
        except (TieredStoreError, OSError) as error:
            # A batch that rolled a segment may have failed part way: what was buffered stays buffered.
            appended = flat_file.append_offset - start
            self.unrecorded_messages += appended
            self.unrecorded_bytes += int(sizes[:appended].sum())
            self.unrecorded_entries.extend(e for e in entries if e.queue_offset < flat_file.append_offset)
            self.record_failure(error, phase="append")
            return False
        self.unrecorded_messages += len(sizes)
        self.unrecorded_bytes += int(sizes.sum())
        self.unrecorded_entries.extend(entries)
        return True

    async def commit(self) -> bool:
        """Commit log, consume queue, key-index entries, metadata; on failure keep everything for a retry."""
        flat_file = self.flat_file
        assert flat_file is not None
        archiver = self.archiver
        started = time.perf_counter()
        try:
            await flat_file.commit(on_durable=self.put_entries)
        except (TieredStoreError, OSError) as error:
            self.record_failure(error, phase="commit")
            return False
        elapsed = time.perf_counter() - started
        metrics, stats = archiver.metrics, archiver.stats
        metrics.commit_latency.observe(elapsed)
        metrics.storage_up.set(1)
        if self.unrecorded_messages:
            metrics.messages_dispatched.labels(self.topic).inc(self.unrecorded_messages)
            metrics.bytes_dispatched.labels(self.topic).inc(self.unrecorded_bytes)
        stats.messages += self.unrecorded_messages
        stats.bytes += self.unrecorded_bytes
        stats.commits += 1
        self.unrecorded_messages = self.unrecorded_bytes = 0
        if self.failures:
            log.info("commits resumed", topic=self.topic, queue_id=self.queue_id, after_failures=self.failures)
        self.failures = 0
        self.retry_at = 0.0
        self.last_error = None
        self.update_lag()
        return True

    async def put_entries(self) -> None:
        """Put the key-index entries of what is buffered or committed but not recorded (``FlatMessageFile.commit``'s
        hook: after the units are durable, before metadata counts them archived)."""
        index = self.archiver.index
        if index is not None and self.unrecorded_entries:
            self.archiver.metrics.index_items.inc(await index.put(self.unrecorded_entries))
            self.unrecorded_entries = []

    # ---- failures ----------------------------------------------------------------------------------

    def back_off(self, error: BaseException, *, phase: str) -> float:
        """Count a failure of this queue and schedule its retry; returns the backoff in seconds."""
        self.failures += 1
        settings = self.archiver.settings
        backoff = retry_backoff(self.failures, settings.retry_initial_backoff, settings.retry_max_backoff)
        self.retry_at = time.monotonic() + backoff
        self.last_error = f"{type(error).__name__}: {error}"
        if phase == "hot read":
            log.warning(
                "hot store read failed; retrying with backoff",
                topic=self.topic,
                queue_id=self.queue_id,
                failures=self.failures,
                retry_in=round(backoff, 3),
                error=self.last_error,
            )
        return backoff

    def record_failure(self, error: BaseException, *, phase: str) -> None:
        archiver = self.archiver
        if isinstance(error, LeaseLostError | CommitConflictError):
            archiver.lose_queue(self, error, phase=phase)
            return
        backoff = self.back_off(error, phase=phase)
        archiver.stats.commit_failures += 1
        metrics = archiver.metrics
        metrics.commit_failures.labels(self.topic).inc()
        metrics.storage_up.set(0)
        if isinstance(error, CommitTimeoutError):
            metrics.commit_timeouts.labels(self.topic, str(self.queue_id)).inc()
        log.warning(
            "commit attempt abandoned after commit_timeout; retrying with backoff"
            if isinstance(error, CommitTimeoutError)
            else "commit failed; retrying with backoff",
            topic=self.topic,
            queue_id=self.queue_id,
            phase=phase,
            failures=self.failures,
            retry_in=round(backoff, 3),
            error=self.last_error,
        )

    async def _skip_lost_range(self, archived: int, hot_min: int) -> bool:
        """The hot store dropped [archived, hot_min) before it was archived: say so, count it, move on."""
        flat_file = self.flat_file
        assert flat_file is not None
        reported = self.blocked_gap[1] if self.blocked_gap and self.blocked_gap[0] == archived else archived
        lost = hot_min - reported
        if lost > 0:
            log.error(
                "hot store dropped messages before they were archived",
                topic=self.topic,
                queue_id=self.queue_id,
                lost_from=reported,
                lost_to=hot_min - 1,
                lost=lost,
            )
            self.archiver.metrics.lost_messages.labels(self.topic).inc(lost)
            self.archiver.stats.lost_messages += lost
            # Reported and counted once, even when the skip below fails and is retried.
            self.blocked_gap = (archived, hot_min)
        try:
            # The cold queue records the lost range as a hole (durably) and continues at the hot min.
            await flat_file.skip_to(hot_min)
        except (TieredStoreError, OSError) as error:
            self.record_failure(error, phase="skip")
            return False
        self.blocked_gap = None
        return True

    # ---- what the hot store says -------------------------------------------------------------------

    def check_hot_behind(self, hot_max: int) -> None:
        """Say once, loudly, when the hot store holds fewer offsets than cold storage has archived.

        The hot store's max offset never goes down, so it was replaced (a lost disk, a wiped directory)
        or lost files it had not synced. Producers writing into it now reuse offsets the archive holds
        other messages at: those are never archived (the archive goes on from its own offset once the
        hot store passes it), and readers get the hot or the cold message depending on the tier.
        Restoring the archive into the hot store first (``restore --to-store``) avoids both.
        """
        archived = self.archived_offset
        behind = self.flat_file is not None and hot_max < archived
        if behind and not self.hot_behind:
            log.error(
                "the hot store holds fewer offsets than are archived: it was replaced or lost its files; "
                "messages put at offsets below the archived one will not be archived. Restore the archive "
                "into it (tieredstore restore TOPIC --to-store) before producing to this queue",
                topic=self.topic,
                queue_id=self.queue_id,
                hot_max=hot_max,
                archived=archived,
            )
            self.archiver.metrics.hot_behind_archive.labels(self.topic).inc()
        elif self.hot_behind and not behind:
            log.warning(
                "the hot store reached the archived offset again; archiving goes on from there",
                topic=self.topic,
                queue_id=self.queue_id,
                archived=archived,
            )
        self.hot_behind = behind

    def update_lag(self) -> None:
        lag = max(0, self.hot.max_offset - self.archived_offset)
        self.archiver.metrics.queue_lag.labels(self.topic, str(self.queue_id)).set(lag)
