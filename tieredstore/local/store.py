"""LocalMessageStore: the hot tier producers write to and the archiver reads from.

Layout is RocketMQ's: ``<dir>/commitlog/<20-digit start>``, ``<dir>/consumequeue/<topic>/<queueId>/
<20-digit start>``, ``<dir>/index/<yyyyMMddHHmmssSSS>`` (the key index, ``tieredstore.local.index_file``),
``<dir>/checkpoint``, plus ``<dir>/lock`` (one writer per directory) and
``<dir>/abort`` (present while open: finding it at open means the last run did not close cleanly).
Opened ``read_only`` it reads a RocketMQ broker's store directory without writing a byte to it.

The class is put together from mixins, one concern each, over the state they share (``store_state``):
recovery at open (``recovery``), puts (``puts``), restores (``restore``) and reads (``store_reads``);
this module keeps opening, flushing, closing and hot retention.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import structlog

from tieredstore import basics
from tieredstore.directories import ensure_directory
from tieredstore.errors import NotFoundError, ValidationError
from tieredstore.formats.message import MAGIC_V1, MAGIC_V2, RecordLayout, store_timestamp_of
from tieredstore.local.commit_log import CommitLog
from tieredstore.local.config import LocalStoreConfig, check_commit_log_file_size
from tieredstore.local.file_sizes import StoreFileSizes
from tieredstore.local.flusher import Flusher, FlushStats
from tieredstore.local.index_file import HotKeyIndex, KeyEntry
from tieredstore.local.puts import StorePuts
from tieredstore.local.queue import ConsumeQueue
from tieredstore.local.reading import RECORD_HEAD, TIMESTAMP_PREFIX, Boundary, StoredMessage
from tieredstore.local.recovery import StoreRecovery
from tieredstore.local.restore import JoinedRecords, StoreRestore
from tieredstore.local.results import PutRequest, PutResult, RecoveryReport, RetentionReport
from tieredstore.local.store_lock import take_writer_lock
from tieredstore.local.store_reads import StoreReads

__all__ = [
    "Boundary",
    "JoinedRecords",
    "LocalMessageStore",
    "PutRequest",
    "PutResult",
    "RecoveryReport",
    "RetentionReport",
    "StoredMessage",
]

log = structlog.get_logger(__name__)


class LocalMessageStore(StoreReads, StorePuts, StoreRestore, StoreRecovery):
    """An append-only message store in RocketMQ's layout; thread-safe; use as a context manager."""

    def __init__(
        self, data_dir: str | os.PathLike[str], *, config: LocalStoreConfig | None = None, read_only: bool = False
    ) -> None:
        self.root = Path(data_dir)
        self.config = config or LocalStoreConfig()
        self.read_only = read_only
        self._store_host = self.config.store_host_address
        self._max_queues = self.config.max_queues_per_topic
        self._max_message_size = self.config.max_message_size
        self._layouts: dict[str, RecordLayout] = {}
        self._put_lock = threading.Lock()
        # Where a restore patches a run of records before writing it: reused, so a bulk restore does not
        # fault in a fresh buffer the size of a batch for every batch.
        self._restore_buffer = bytearray()
        self._flush_lock = threading.Lock()
        # Keys of records put since the last drain, in commit-log order: the put path only records them,
        # and the flush thread or a key lookup indexes them in one batch (as RocketMQ's reput thread does).
        self._pending_keys: list[KeyEntry] = []
        # Serialises drains, so a batch is indexed whole before the next one starts: order and exactly once.
        self._index_lock = threading.Lock()
        self._queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._last_store_timestamp = 0
        # What the checkpoint file holds, as (store timestamp, confirmed offset), once this store wrote it.
        self._checkpointed: tuple[int, int] | None = None
        self._unit_count = 0
        self._disk_cap = self.config.hot_disk_max_bytes
        # Wall-clock ms of the last disk-usage look and until when it stays good; a clock jump re-checks.
        self._disk_checked_ms = 0
        self._disk_ok_until = 0
        self._disk_full_reason: str | None = None
        self._put_refusal: str | None = f"{self.root} is open read-only; puts are refused" if read_only else None
        self._closed = False
        self._lock_fd: int | None = None
        if read_only:
            if not (self.root / "commitlog").is_dir():
                raise NotFoundError(f"{self.root} has no commitlog directory; it is not a RocketMQ store")
        else:
            ensure_directory(self.root, "the hot store's directory")
            self._take_lock()
        try:
            self.file_sizes = StoreFileSizes.learn(self.root, self.config, writer=not read_only)
            if not read_only:
                check_commit_log_file_size(self.file_sizes.commit_log, self._max_message_size)
            self._commit_log = CommitLog.load(
                self.root / "commitlog", file_size=self.file_sizes.commit_log, writable=not read_only
            )
            self._load_queues()
            self._key_index = HotKeyIndex(
                self.root / "index",
                slot_capacity=self.config.index_slot_count,
                item_capacity=self.config.index_max_items,
                writable=not read_only,
            )
            self.recovery = self._recover()
            for queue in self._queues.values():
                # Retention (ours or the broker's) may have deleted commit-log files older units point at.
                queue.min_offset = queue.lower_bound(self._commit_log.min_offset)
        except BaseException:
            self._release()
            raise
        self._dispatched_offset = self._commit_log.write_offset
        self._unit_count = sum(q.max_offset - q.min_offset for q in self._queues.values())
        self._flusher: Flusher | None = None
        if not read_only:
            abort = self.root / "abort"
            abort.touch()
            self._flusher = Flusher(
                interval=self.config.flush_interval,
                write_offset=lambda: self._commit_log.write_offset,
                flushed_offset=lambda: self._commit_log.flushed_offset,
                flush_commit_log=self._flush_commit_log,
                flush_all=self.flush,
            )
            self._flusher.start()
        self._sync_flusher = self._flusher if self.config.flush_mode == "sync" else None
        log.info(
            "hot store opened",
            data_dir=str(self.root),
            read_only=read_only,
            clean=self.recovery.clean,
            repaired=self.recovery.repaired,
            valid_end=self.recovery.valid_end,
        )

    # ----------------------------------------------------------------- open and close

    def _take_lock(self) -> None:
        self._lock_fd = take_writer_lock(self.root)

    def _release(self) -> None:
        for queue in self._queues.values():
            queue.close()
        if hasattr(self, "_commit_log"):
            self._commit_log.close()
        if hasattr(self, "_key_index"):
            self._key_index.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def close(self) -> None:
        """Flush everything, write the checkpoint, and mark the shutdown clean."""
        if self._closed:
            return
        self._closed = True
        self._put_refusal = "the hot store is closed"
        self._restore_buffer = bytearray()
        if self._flusher is not None:
            self._flusher.stop()
            with self._put_lock:
                pass  # a put already past the refusal check ends before the last flush, which covers it
            self.flush()
            (self.root / "abort").unlink(missing_ok=True)
        self._release()

    def __enter__(self) -> LocalMessageStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- flushing

    def _flush_commit_log(self, upto: int) -> None:
        with self._flush_lock:
            self._commit_log.flush(upto)

    def flush(self) -> None:
        """Make everything written so far durable and move the checkpoint up to it."""
        if self.read_only:
            return
        # Only records whose keys are indexed move the checkpoint: recovery re-adds keys from it on.
        dispatched, stamp = self._index_pending()
        with self._flush_lock:
            for queue in list(self._queues.values()):
                queue.flush()
            self._commit_log.flush(dispatched)
            self._key_index.flush()
            if self._checkpointed is None or dispatched >= self._checkpointed[1]:
                self._write_checkpoint(dispatched, stamp)  # not back past a concurrent flush's

    @property
    def flush_stats(self) -> FlushStats:
        """Commit-log syncs done and sync puts served: their ratio is what group commit saves."""
        return self._flusher.stats if self._flusher else FlushStats()

    # ----------------------------------------------------------------- retention

    def delete_expired(
        self, archived_offset: Callable[[str, int], int], *, now_ms: int | None = None
    ) -> RetentionReport:
        """Delete whole commit-log files older than ``hot_retention_hours`` whose every message is archived.

        ``archived_offset(topic, queue_id)`` is the first queue offset not yet archived. A file's age is
        that of the first record after it, so it counts from when the file stopped receiving data.
        Consume-queue files whose units all point at deleted commit-log files go too; min offsets move up.
        """
        if self.read_only:
            raise ValidationError(f"{self.root} is open read-only; nothing is deleted")
        now = basics.now_ms() if now_ms is None else now_ms
        horizon = now - int(self.config.hot_retention_hours * 3_600_000)
        log_ = self._commit_log
        removed: list[str] = []
        while len(log_.files) > 1:
            file, successor = log_.files[0], log_.files[1]
            if successor.start_offset >= self._dispatched_offset:
                break
            head = successor.read(0, TIMESTAMP_PREFIX)
            if RECORD_HEAD.unpack_from(head)[1] not in (MAGIC_V1, MAGIC_V2) or store_timestamp_of(head) > horizon:
                break
            if not self._fully_archived(file.end_offset, archived_offset):
                break
            with self._put_lock, self._flush_lock:
                # Min offsets move past the file before it goes: a reader that sees it gone never sees a
                # min offset that still points into it.
                for queue in self._queues.values():
                    queue.min_offset = queue.lower_bound(successor.start_offset)
                log_.delete_first_file()
            removed.append(file.path.name)
        queue_files = 0
        with self._index_lock, self._put_lock, self._flush_lock:
            for queue in self._queues.values():
                queue_files += queue.delete_files_below(log_.min_offset)
            self._unit_count = sum(q.max_offset - q.min_offset for q in self._queues.values())
            index_files = self._key_index.delete_below(log_.min_offset)
        if removed:
            log.info("hot files deleted", commit_log_files=removed, consume_queue_files=queue_files)
        return RetentionReport(removed, queue_files, log_.min_offset, index_files)

    def _fully_archived(self, file_end: int, archived_offset: Callable[[str, int], int]) -> bool:
        for (topic, queue_id), queue in list(self._queues.items()):
            first_after = queue.lower_bound(file_end)
            if queue.min_offset < first_after and archived_offset(topic, queue_id) < first_after:
                return False
        return True
