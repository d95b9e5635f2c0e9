"""The state every part of a FlatMessageFile shares: a queue's two cold files, its recorded position, and
the writes to metadata that keep them in step (see ``flat.message_file``)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from tieredstore.basics import GIB, MIB, now_ms
from tieredstore.errors import ReadOnlyError, ValidationError
from tieredstore.flat.append_file import Clock
from tieredstore.flat.commit_log import FlatCommitLogFile
from tieredstore.flat.consume_queue import FlatConsumeQueueFile
from tieredstore.flat.position_commits import PositionCommits
from tieredstore.metadata import CommitRecord, LeaseHold, MetadataStore, QueuePosition
from tieredstore.providers.base import Provider


@dataclass(frozen=True, slots=True)
class FlatFileSettings:
    """Segment sizes, rolling by time and recovery concurrency (the ``[segments]`` config section)."""

    commit_log_max_size: int = GIB
    consume_queue_max_size: int = 100 * MIB
    # Seconds after which both files' open segments roll, whatever their size (retention's bound).
    commit_log_rolling_interval: float = 24 * 3600.0
    recovery_concurrency: int = 64


class QueueFiles:
    """The cold files of one queue and its positions, as every part of a FlatMessageFile sees them."""

    def __init__(
        self,
        provider: Provider,
        metadata: MetadataStore,
        path: str,
        position: QueuePosition,
        *,
        settings: FlatFileSettings | None = None,
        clock: Clock = now_ms,
        lease: LeaseHold | None = None,
        commits: PositionCommits | None = None,
    ) -> None:
        """``lease``: the queue's lease when an archiver beside others writes it (see ``lease``).
        ``commits``: where positions are recorded, shared with the queues that commit beside this one."""
        settings = settings or FlatFileSettings()
        rolling_interval_ms = int(settings.commit_log_rolling_interval * 1000)
        self.topic = position.topic
        self.queue_id = position.queue_id
        self.path = path
        self.metadata = metadata
        self.clock = clock
        self.commit_log = FlatCommitLogFile(
            provider,
            metadata,
            path,
            max_segment_size=settings.commit_log_max_size,
            rolling_interval_ms=rolling_interval_ms,
            clock=clock,
            lease=lease,
        )
        self.consume_queue = FlatConsumeQueueFile(
            provider,
            metadata,
            path,
            commit_log=self.commit_log,
            max_segment_size=settings.consume_queue_max_size,
            initial_queue_offset=position.max_offset,
            rolling_interval_ms=rolling_interval_ms,
            clock=clock,
            lease=lease,
        )
        self._position = position
        self._commits = commits or PositionCommits(metadata)
        # Serialises commits, expiry and recovery: two concurrent records would race on one version.
        self._commit_lock = asyncio.Lock()

    def __repr__(self) -> str:
        return (
            f"FlatMessageFile({self.topic}/{self.queue_id}, min={self.min_offset}, "
            f"archived={self.archived_offset}, append={self.append_offset})"
        )

    @property
    def min_offset(self) -> int:
        """The oldest queue offset still in cold storage."""
        return self.consume_queue.min_queue_offset

    @property
    def archived_offset(self) -> int:
        """The next queue offset to archive: every offset below it is durable in both files."""
        return self.consume_queue.commit_queue_offset

    @property
    def append_offset(self) -> int:
        """The next queue offset ``append_records`` expects (archived offset plus buffered messages)."""
        return self.consume_queue.append_queue_offset

    @property
    def position(self) -> QueuePosition:
        """The positions as last recorded in metadata."""
        return self._position

    @property
    def lease(self) -> LeaseHold | None:
        """The queue's lease this file is written under; None when no other archiver can write the queue.

        Under a lease every metadata change names the epoch held (refused with LeaseLostError once the
        queue was taken over), a storage deletion checks and holds the lease first, and recovery cuts by
        abandoning bytes rather than deleting them (``QueueRecovery._cut``).
        """
        return self.commit_log.lease

    @lease.setter
    def lease(self, lease: LeaseHold | None) -> None:
        if lease is not None and lease.queue != (self.topic, self.queue_id):
            raise ValidationError(f"a lease on {lease.queue} is not one on queue {self.topic}/{self.queue_id}")
        self.commit_log.lease = lease
        self.consume_queue.lease = lease

    @property
    def read_only(self) -> bool:
        """Loaded from metadata as recorded (``load``): readable, never written or repaired."""
        return self.consume_queue.read_only

    @property
    def has_pending(self) -> bool:
        return self.commit_log.pending_bytes > 0 or self.consume_queue.pending_bytes > 0

    def _require_writable(self, action: str) -> None:
        if self.read_only:
            raise ReadOnlyError(f"queue {self.topic}/{self.queue_id} is open read-only: cannot {action}")

    async def _record_positions(self, *, min_offset: int | None = None) -> None:
        updates = [u for u in (self.commit_log.segment_update(), self.consume_queue.segment_update()) if u]
        archived = self.archived_offset
        if not updates and archived == self._position.max_offset and min_offset is None:
            return
        self._position = await self._commits.record(
            CommitRecord(
                self.topic,
                self.queue_id,
                expected_version=self._position.version,
                max_offset=archived,
                min_offset=min_offset,
                segments=tuple(updates),
                expected_epoch=None if self.lease is None else self.lease.epoch(),
            )
        )
        for update in updates:
            (self.commit_log if update.file_type == self.commit_log.file_type else self.consume_queue).mark_recorded(
                update
            )

    async def _roll_by_time(self, now_ms: int) -> bool:
        """Roll both files if due at ``now_ms``: the clock on a maintenance pass, the store time of the
        next message when one is appended (so a backlog of old messages is cut by store time, not
        into a segment per batch because the clock says its first message is old)."""
        rolled = await self.consume_queue.try_rolling(now_ms)
        return await self.commit_log.try_rolling(now_ms) or rolled
