"""HotStoreFollower: reads a hot store that another process writes, following it as it grows and shrinks.

The archiver runs as its own process (``tieredstore run``) next to the producer applications that own
the hot store. The writer holds the directory's lock; a follower never takes it and never writes a
byte into the directory. It maps the writer's consume-queue and commit-log files read-only and
follows them:

* **growth**: a queue's end is found by reading units past the last one known; new consume-queue and
  commit-log files are picked up when a unit needs them; new queues are found by listing
  ``consumequeue/`` at most every ``refresh_interval`` seconds;
* **retention**: files the writer deleted are unmapped at the next listing, the commit log's min
  offset moves to its first remaining file and each queue's min offset to its first unit at or
  after it; an offset whose file vanished reads as below the min offset (NotFoundError), never as
  a crash;
* **writer restarts**: a file the writer's recovery replaced (another inode) is mapped again;
* **an early start**: a directory holding no commit log yet is followed as an empty store;
* **queues without consume-queue files** (a store copied without ``consumequeue/``): their units are
  rebuilt from the flushed commit log in memory (``tieredstore.local.commit_log_dispatch``), from where
  the other queues' units end.

A unit is served only once the record it points at checks out: magic, TOTALSIZE equal to the unit's
size, PHYSICALOFFSET equal to the unit's offset, topic, queue id and queue offset of this queue, a
properties block that ends where the record ends (in 0x02 when present) and the body CRC. The writer
publishes a record before its unit, but a zero unit, or one whose record does not check out yet, is
simply the end of the queue for now; the next call looks again.

Durability: a follower reads the page cache, so it serves records the writer has written but not yet
fsynced (under async flush, up to ``flush_interval`` of them). A machine crash can take those back,
so the archiver takes only what ``durable_max_offset`` gives: the messages the checkpoint the writer
wrote at its last flush says are flushed (re-read at every listing). That is ours, or a RocketMQ
broker's own (see ``FlushedBound``: its records stored before its flush timestamp, or below its
confirmed offset). A missing checkpoint means nothing is known to be flushed yet.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import structlog

from tieredstore.errors import NotFoundError, ValidationError
from tieredstore.formats.consume_queue import ConsumeQueueUnit
from tieredstore.formats.message import store_timestamp_of
from tieredstore.formats.naming import validate_topic
from tieredstore.local.batch import HotBatch, SharedWindow
from tieredstore.local.checkpoint import CheckpointSource, FlushedBound
from tieredstore.local.commit_log_dispatch import CommitLogDispatch
from tieredstore.local.config import LocalStoreConfig
from tieredstore.local.file_sizes import StoreFileSizes
from tieredstore.local.followed_files import FollowedLog, FollowedQueue, queue_directories, rebuild_queues
from tieredstore.local.followed_reads import (
    covers,
    grow_checked,
    log_flushed_source,
    read_checked_batch,
    read_checked_messages,
    record_problem,
)
from tieredstore.local.index_file import HotKeyIndex, KeyedRecord, find_records, whole_record
from tieredstore.local.queue import list_offset_files
from tieredstore.local.reading import (
    TIMESTAMP_PREFIX,
    Boundary,
    StoredMessage,
    UnitReads,
    check_boundary,
    check_not_below,
    check_unit_record,
    found_record,
    offset_msg_id,
    timestamp_offset,
    validate_queue,
)

__all__ = ["DEFAULT_REFRESH_INTERVAL", "GROW_RELEASE_BYTES", "HotStoreFollower", "record_problem"]

log = structlog.get_logger(__name__)

DEFAULT_REFRESH_INTERVAL = 0.2
# A queue's check of new units unmaps the pages behind it each time it has moved this far (see _grow).
GROW_RELEASE_BYTES = 8 << 20


class HotStoreFollower(UnitReads):
    """Reads a hot store directory another process writes, and follows it; never writes.

    It implements ``HotReader``, the read interface every reader of the hot store (the archiver, the
    fetcher, the CLI) is typed against, and nothing else: puts, restores and hot retention are the
    writer's, so a follower has no such methods. ``refresh_interval`` (seconds) bounds how often
    directories are listed; reads between listings cost no system call except when a unit needs a file
    not mapped yet. Thread-safe.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        config: LocalStoreConfig | None = None,
        refresh_interval: float = DEFAULT_REFRESH_INTERVAL,
    ) -> None:
        self.root = Path(data_dir)
        self.config = config or LocalStoreConfig()
        self.read_only = True
        self.refresh_interval = refresh_interval
        self._store_host = self.config.store_host_address
        self._closed = False
        self._lock = threading.RLock()
        if not self.root.is_dir():
            raise NotFoundError(f"{self.root} is not a directory; there is no hot store to follow")
        self._log = FollowedLog(self.root / "commitlog")
        self._key_index = HotKeyIndex(
            self.root / "index",
            slot_capacity=self.config.index_slot_count,
            item_capacity=self.config.index_max_items,
            writable=False,
        )
        self._followed: dict[tuple[str, int], FollowedQueue] = {}
        self.file_sizes = StoreFileSizes.learn(self.root, self.config)
        self._dispatch = CommitLogDispatch(self._has_queue_files)
        self._listed_at = -1.0
        # What the writer's checkpoint says is flushed. Read again at every listing.
        self._flushed = FlushedBound("missing")
        self._flushed_said: tuple[CheckpointSource, bool] | None = None  # (source, known) the log last said
        with self._lock:
            self._refresh(time.monotonic())
        log.info("following a hot store", data_dir=str(self.root), queues=len(self._followed))

    # ---- refreshing ----------------------------------------------------------------------------------

    def _refresh(self, now: float) -> None:
        """Relist the commit log and the queue directories (new queues; vanished files); read the checkpoint."""
        self._listed_at = now
        self._log.refresh()
        flushed = FlushedBound.read(self.root / "checkpoint")
        if (flushed.source, flushed.known) != self._flushed_said:
            self._flushed_said = (flushed.source, flushed.known)
            log_flushed_source(str(self.root / "checkpoint"), flushed)
        self._flushed = flushed
        for key in queue_directories(self.root / "consumequeue"):
            if key not in self._followed:
                self._follow(*key, now)  # a queue directory not followed yet
        # Queues without consume-queue files get the newly flushed records' units (``CommitLogDispatch``).
        rebuild_queues(self._dispatch, self._followed, self._log, self._flushed, self.root / "consumequeue", now)

    def _has_queue_files(self, topic: str, queue_id: int) -> bool:
        return bool(list_offset_files(self.root / "consumequeue" / topic / str(queue_id)))

    def _follow(self, topic: str, queue_id: int, now: float) -> FollowedQueue:
        queue = FollowedQueue(topic, queue_id, self.root / "consumequeue" / topic / str(queue_id))
        queue.refresh(self._log.min_offset, now)
        self._followed[(topic, queue_id)] = queue
        return queue

    def _listed(self) -> float:
        """Relist if the last listing is stale (ValidationError once closed); returns the time now."""
        if self._closed:
            raise ValidationError("the hot store follower is closed")
        now = time.monotonic()
        if now - self._listed_at >= self.refresh_interval:
            self._refresh(now)
        return now

    def _fresh(self, topic: str, queue_id: int) -> FollowedQueue | None:
        """The queue, relisted if stale and grown to its last checked unit; None if it has no directory yet."""
        validate_queue(topic, queue_id)
        now = self._listed()
        queue = self._followed.get((topic, queue_id))
        if queue is None:
            if not (self.root / "consumequeue" / topic / str(queue_id)).is_dir():
                return None
            queue = self._follow(topic, queue_id, now)
        elif now - queue.refreshed_at >= self.refresh_interval:
            queue.refresh(self._log.min_offset, now)
        self._grow(queue)
        return queue

    def _grow(self, queue: FollowedQueue) -> None:
        """Extend the queue over every new unit whose record checks out (``grow_checked``)."""
        grow_checked(self._log, queue, GROW_RELEASE_BYTES)

    # ---- the read API --------------------------------------------------------------------------------

    def queues(self) -> list[tuple[str, int]]:
        """Every (topic, queue id) that holds or held messages, sorted."""
        with self._lock:
            self._listed()
            for queue in self._followed.values():
                if queue.max_offset == 0:
                    self._grow(queue)
            return sorted(key for key, queue in self._followed.items() if queue.max_offset > 0)

    def min_offset(self, topic: str, queue_id: int) -> int:
        """The first queue offset still in the hot store (0 for a queue never written)."""
        with self._lock:
            queue = self._fresh(topic, queue_id)
            return queue.min_offset if queue is not None else 0

    def max_offset(self, topic: str, queue_id: int) -> int:
        """One past the last message whose record is whole on disk (0 for a queue never written)."""
        with self._lock:
            queue = self._fresh(topic, queue_id)
            return queue.max_offset if queue is not None else 0

    @property
    def commitlog_min_offset(self) -> int:
        with self._lock:
            return self._log.min_offset

    @property
    def commitlog_max_offset(self) -> int:
        """The end of the last commit-log file: a follower does not know the writer's exact write position."""
        with self._lock:
            return self._log.max_offset

    def durable_max_offset(self, topic: str, queue_id: int) -> int:
        """One past the last message the writer's checkpoint covers (0 for a queue never written): what the
        writer had flushed at its last checkpoint, at most ``flush_interval`` (plus ``refresh_interval``) ago."""
        with self._lock:
            queue = self._fresh(topic, queue_id)
            if queue is None:
                return 0
            flushed = self._flushed

            def is_flushed(queue_offset: int) -> bool:
                return covers(flushed, self._log, queue, queue_offset)

            return queue.durable_end.search(
                (flushed.offset, flushed.stored_until), queue.min_offset, queue.max_offset, is_flushed
            )

    def flush_queue(self, topic: str, queue_id: int) -> int:
        """Flushing is the writer's: only its ``durable_max_offset``."""
        return self.durable_max_offset(topic, queue_id)

    @property
    def commitlog_flushed_offset(self) -> int:
        """Up to where the writer's last checkpoint says the commit log is flushed (0 before its first one).

        A RocketMQ broker's checkpoint bounds what is flushed by time too: see ``durable_max_offset``."""
        with self._lock:
            self._listed()
            return self._flushed.offset

    def release_pages(self, below: int) -> int:
        """Unmap this process's pages of the commit log below ``below`` (see LocalMessageStore's)."""
        with self._lock:
            return self._log.release_pages_below(below)

    def cq_unit(self, topic: str, queue_id: int, queue_offset: int) -> ConsumeQueueUnit:
        """The consume-queue unit at ``queue_offset``; NotFoundError outside [min_offset, max_offset)."""
        with self._lock:
            queue = self._fresh(topic, queue_id)
            if queue is None:
                raise NotFoundError(f"queue {topic}/{queue_id} holds no messages in the hot store")
            return queue.checked_unit(queue_offset)

    def read_record(self, unit: ConsumeQueueUnit) -> bytes:
        """The record bytes a unit points at, checked to be a whole record of the unit's size."""
        with self._lock:
            raw = self._log.read(unit.commitlog_offset, unit.size)
            if raw is None and self._log.holder_replaced(unit.commitlog_offset):
                self._log.refresh()
                raw = self._log.read(unit.commitlog_offset, unit.size)
        if raw is None:
            raise NotFoundError(f"commit-log range [{unit.commitlog_offset}, +{unit.size}) is not in the hot store")
        return check_unit_record(raw, unit)

    def read_messages(
        self, topic: str, queue_id: int, queue_offset: int, max_count: int = 32, max_bytes: int = 4 << 20
    ) -> list[StoredMessage]:
        """As the writer's (see ``LocalMessageStore.read_messages``); an offset whose file the writer just
        deleted is a NotFoundError too, and every record is checked again as it is copied out."""
        with self._lock:
            queue = self._fresh(topic, queue_id)
            if queue is None:
                return []
            check_not_below(topic, queue_id, queue_offset, queue.min_offset)
            return read_checked_messages(self._log, queue, queue_offset, max_count, max_bytes)

    def read_batch(
        self,
        topic: str,
        queue_id: int,
        queue_offset: int,
        max_count: int = 32,
        max_bytes: int = 4 << 20,
        *,
        unmap: bool = False,
        window: SharedWindow | None = None,
    ) -> HotBatch:
        """``read_messages`` as one HotBatch (see ``tieredstore.local.batch``): the same records, each
        checked again as it is copied out, all at once instead of one by one. ``unmap`` and ``window`` as
        the writer's."""
        with self._lock:
            queue = self._fresh(topic, queue_id)
            if queue is None:
                return HotBatch.empty(topic, queue_id, queue_offset)
            check_not_below(topic, queue_id, queue_offset, queue.min_offset)
            return read_checked_batch(self._log, queue, queue_offset, max_count, max_bytes, unmap=unmap, window=window)

    def _store_timestamp_of(self, unit: ConsumeQueueUnit) -> int:
        with self._lock:
            head = self._log.read(unit.commitlog_offset, min(unit.size, TIMESTAMP_PREFIX))
        if head is None:
            raise NotFoundError(f"commit-log offset {unit.commitlog_offset} was just deleted by retention")
        return store_timestamp_of(head)

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp: int, boundary: Boundary = "lower") -> int:
        """As the writer's, over the units this follower has checked (see ``timestamp_offset``)."""
        check_boundary(boundary)
        with self._lock:
            return timestamp_offset(
                self._fresh(topic, queue_id),
                timestamp,
                boundary,
                lambda queue, offset: self._store_timestamp_of(queue.checked_unit(offset)),
            )

    def query_keys(
        self, topic: str, key: str, max_count: int = 32, begin_timestamp: int = 0, end_timestamp: int = (1 << 63) - 1
    ) -> list[KeyedRecord]:
        """As the writer's (see ``LocalMessageStore.query_keys``), through the key index the writer keeps."""
        validate_topic(topic)
        return find_records(self._key_index, topic, key, max_count, begin_timestamp, end_timestamp, self._record_at)

    def record_at(self, commitlog_offset: int) -> bytes:
        """As the writer's (see ``LocalMessageStore.record_at``), in the files mapped or newly listed."""
        return found_record(self._record_at(commitlog_offset), commitlog_offset)

    def _record_at(self, commitlog_offset: int) -> bytes | None:
        """The whole record the writer wrote at ``commitlog_offset``; None when no mapped file holds one."""
        with self._lock:
            if self._closed:
                raise ValidationError("the hot store follower is closed")
            if self._log.read(commitlog_offset, 1) is None:
                self._log.refresh()  # a commit-log file the writer created since the last listing
            return whole_record(self._log.read, commitlog_offset)

    def offset_msg_id(self, commitlog_offset: int) -> str:
        """RocketMQ's offset message id of a record the writer wrote (its store host is this config's)."""
        return offset_msg_id(self._store_host, commitlog_offset)

    # ---- lifecycle -----------------------------------------------------------------------------------

    def close(self) -> None:
        """Unmap every file; the writer's directory is left exactly as it was."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for queue in self._followed.values():
                queue.close()
            self._followed.clear()
            self._dispatch.close()
            self._log.close()
            self._key_index.close()

    def __enter__(self) -> HotStoreFollower:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
