"""What every part of LocalMessageStore shares: its files, locks and counters, and the few steps all parts take.

``LocalMessageStore`` is put together from mixins, one concern each (recovery, puts, restores, reads);
this base declares the state they share, so each is checked against it on its own.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

from tieredstore import basics
from tieredstore.errors import NotFoundError, StoreFullError
from tieredstore.formats.consume_queue import UNIT_SIZE
from tieredstore.formats.message import HostAddress, RecordLayout
from tieredstore.local.checkpoint import Checkpoint
from tieredstore.local.commit_log import CommitLog
from tieredstore.local.config import LocalStoreConfig
from tieredstore.local.file_sizes import StoreFileSizes
from tieredstore.local.flusher import Flusher
from tieredstore.local.index_file import HotKeyIndex, KeyEntry
from tieredstore.local.queue import ConsumeQueue
from tieredstore.local.reading import validate_queue
from tieredstore.local.results import RecoveryReport

# How long a disk-usage look stays good: statvfs on every put would cost more than the put.
_DISK_CHECK_INTERVAL_MS = 200


class StoreState:
    """The state of an open LocalMessageStore (set by its ``__init__``) and the steps its parts share."""

    root: Path
    config: LocalStoreConfig
    read_only: bool
    file_sizes: StoreFileSizes
    recovery: RecoveryReport
    _store_host: HostAddress
    _max_queues: int
    _max_message_size: int
    _layouts: dict[str, RecordLayout]
    _commit_log: CommitLog
    _key_index: HotKeyIndex
    _queues: dict[tuple[str, int], ConsumeQueue]
    _put_lock: threading.Lock
    _flush_lock: threading.Lock
    _index_lock: threading.Lock
    _pending_keys: list[KeyEntry]
    _restore_buffer: bytearray
    _last_store_timestamp: int
    _checkpointed: tuple[int, int] | None
    _dispatched_offset: int
    _unit_count: int
    _disk_cap: int | None
    _disk_checked_ms: int
    _disk_ok_until: int
    _disk_full_reason: str | None
    _put_refusal: str | None
    _closed: bool
    _lock_fd: int | None
    _flusher: Flusher | None
    _sync_flusher: Flusher | None

    def _queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        queue = self._queues.get((topic, queue_id))
        if queue is None:
            queue = ConsumeQueue(
                topic,
                queue_id,
                self.root / "consumequeue" / topic / str(queue_id),
                file_size=self.file_sizes.consume_queue,
                writable=not self.read_only,
            )
            self._queues[(topic, queue_id)] = queue
        return queue

    def _existing_queue(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        validate_queue(topic, queue_id)
        return self._queues.get((topic, queue_id))

    def _require_queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        queue = self._existing_queue(topic, queue_id)
        if queue is None:
            raise NotFoundError(f"queue {topic}/{queue_id} holds no messages in the hot store")
        return queue

    def _index_pending(self) -> tuple[int, int]:
        """Index the keys puts recorded so far in one batch; returns the commit-log offset below which every
        record's keys are indexed, and the store timestamp of the newest record below it."""
        with self._index_lock:
            with self._put_lock:
                pending, self._pending_keys = self._pending_keys, []
                covered = self._dispatched_offset, self._last_store_timestamp
            if pending:
                self._key_index.add_many(pending)
        return covered

    def _write_checkpoint(self, confirmed: int, stamp: int | None = None) -> None:
        stamp = self._last_store_timestamp if stamp is None else stamp
        if self._checkpointed == (stamp, confirmed):
            return  # an idle store does not rewrite (and fsync) the same checkpoint every flush interval
        # The key index is flushed with the rest: it is as current as the commit log.
        Checkpoint(stamp, stamp, stamp, confirmed).write(self.root / "checkpoint")
        self._checkpointed = (stamp, confirmed)

    def _check_disk(self, incoming: int, now_ms: int | None = None) -> None:
        cap = self.config.hot_disk_max_bytes
        if cap is not None:
            held = self._commit_log.write_offset - self._commit_log.min_offset + self._unit_count * UNIT_SIZE
            if held + incoming > cap:
                raise StoreFullError(
                    f"the hot store holds {held} bytes and this put adds {incoming}; hot_disk_max_bytes is {cap}"
                )
        now = basics.now_ms() if now_ms is None else now_ms
        if self._disk_full_reason is not None or not self._disk_checked_ms <= now < self._disk_ok_until:
            usage = shutil.disk_usage(self.root)
            used = (usage.total - usage.free) / usage.total if usage.total else 1.0
            watermark = self.config.hot_disk_high_watermark
            self._disk_full_reason = (
                f"the disk of {self.root} is {used:.1%} full; hot_disk_high_watermark is {watermark:.1%}"
                if used >= watermark
                else None
            )
            self._disk_checked_ms = now
            self._disk_ok_until = now + _DISK_CHECK_INTERVAL_MS if self._disk_full_reason is None else 0
        if self._disk_full_reason is not None:
            raise StoreFullError(self._disk_full_reason)
