"""FlatMessageFile: one queue in cold storage — its commit log and consume queue, committed in order.

Commit order is commit log, then consume queue, then metadata (queue positions and segment sizes in
one transaction with the optimistic version check). A queue's archived offset is its consume queue's
commit offset: a message counts as archived only once both its unit and its bytes are durable.

Recovery after a crash rebuilds both files from metadata, corrects their last segments' sizes from
the provider, then restores the invariant "every durable unit points at durable bytes, and every
durable commit-log byte is pointed at": a trailing partial unit is cut, units whose bytes did not
survive are cut, and commit-log bytes no unit references are removed. Under a lease (the file opened
with a ``LeaseHold``) a cut deletes nothing: the segment is sealed at the cut and the file goes on in a
new one, the cut bytes left in storage past the recorded size (``_cut``), so an archiver stalled inside its
recovery cannot delete what a successor wrote in the meantime; and the whole records of a commit cut
short after its commit-log bytes landed get their units instead (``_complete_cut_short_commit``).

Queue offsets the hot store dropped before they were archived are skipped with ``skip_to``: the
consume queue leaves a hole (its last segment sealed, the next one starting at the new offset) while
the commit log carries on unbroken. The hole is in the segment rows, so recovery keeps it; reads
inside it are NotFoundError, and ``lost_ranges`` / ``next_archived_offset`` say where it is.

``load`` builds a read-only view from metadata rows as recorded (no provider call, no repair), for
readers that run beside an archiver: the CLI, Spark, a cold-only store. ``refresh`` re-reads the rows
to see later commits; every write through such a view is ReadOnlyError.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from tieredstore.basics import BoundaryType
from tieredstore.errors import NotFoundError, ValidationError
from tieredstore.flat.queue_recovery import QueueRecovery, RecoveryResult
from tieredstore.flat.queue_state import FlatFileSettings
from tieredstore.flat.queue_writes import BatchRecord, PackedRecords, QueueWrites, RecordRun
from tieredstore.formats.consume_queue import UNIT_SIZE, ConsumeQueueUnit
from tieredstore.formats.naming import FileType
from tieredstore.metadata import MetadataStore, QueuePosition, SegmentRecord
from tieredstore.providers.base import Provider

__all__ = [
    "BatchRecord",
    "FlatFileSettings",
    "FlatMessageFile",
    "PackedRecords",
    "RecordRun",
    "RecoveryResult",
    "read_view_rows",
]

# The files of a queue a read-only view loads from metadata (its segment rows).
_VIEW_FILE_TYPES = (FileType.COMMIT_LOG.value, FileType.CONSUME_QUEUE.value)


async def read_view_rows(
    metadata: MetadataStore, topic: str, queue_id: int, path: str
) -> tuple[QueuePosition, list[SegmentRecord], list[SegmentRecord]]:
    """What a read-only view loads: the queue's position, then its commit log's and consume queue's live
    segment rows, in one metadata call (the position first: a commit in between only lengthens the rows)."""
    position, rows = await asyncio.to_thread(metadata.get_queue_with_segments, topic, queue_id, path, _VIEW_FILE_TYPES)
    return position, rows[FileType.COMMIT_LOG.value], rows[FileType.CONSUME_QUEUE.value]


class FlatMessageFile(QueueWrites, QueueRecovery):
    """The cold files of one queue and its positions: written (``QueueWrites``), recovered
    (``QueueRecovery``), read, and expired."""

    @classmethod
    def load(
        cls,
        provider: Provider,
        metadata: MetadataStore,
        path: str,
        position: QueuePosition,
        commit_log_records: Sequence[SegmentRecord],
        consume_queue_records: Sequence[SegmentRecord],
        *,
        settings: FlatFileSettings | None = None,
    ) -> FlatMessageFile:
        """A read-only view of the queue exactly as metadata records it; no provider call, no repair.

        Reads stop at the recorded archived offset (``position.max_offset``), so rows read after the
        position, which a concurrent commit may have grown, add nothing unrecorded.
        """
        flat_file = cls(provider, metadata, path, position, settings=settings)
        flat_file._load(position, commit_log_records, consume_queue_records)
        return flat_file

    def _load(
        self,
        position: QueuePosition,
        commit_log_records: Sequence[SegmentRecord],
        consume_queue_records: Sequence[SegmentRecord],
    ) -> None:
        self._position = position
        self.consume_queue.load(consume_queue_records, limit_offset=position.max_offset * UNIT_SIZE)
        if self.consume_queue.is_empty:
            self.consume_queue._initial_offset = position.max_offset * UNIT_SIZE
        self.commit_log.load(commit_log_records)

    async def refresh(self, *, if_changed: bool = False) -> bool:
        """Re-read this read-only view's position and segment rows: see what was committed since.

        ``if_changed``: the segment rows only when the queue's row is not the position this view holds
        (one query of one row when nothing happened: what a reader polling at the queue's end pays).
        Whether the view was loaded again.
        """
        if not self.read_only:
            raise ValidationError(f"{self}: only a read-only view is refreshed; the archiver's copy is current")
        unless = self._position if if_changed else None

        def load() -> tuple[QueuePosition, dict[str, list[SegmentRecord]]] | None:
            return self.metadata.get_queue_with_segments(
                self.topic, self.queue_id, self.path, _VIEW_FILE_TYPES, unless=unless
            )

        rows = await asyncio.to_thread(load)
        if rows is None:
            return False
        position, segments = rows
        self._load(position, segments[FileType.COMMIT_LOG.value], segments[FileType.CONSUME_QUEUE.value])
        return True

    def first_record_guess(self) -> tuple[int, float] | None:
        """Where the record at ``min_offset`` most likely lies in the commit log, and the mean record size.

        Without a consume-queue read: a queue's commit log starts with its oldest record unless
        retention removed its segments differently from the consume queue's. A reader must check the
        record it finds there (its queue offset) before it trusts the guess. None when nothing is archived.
        """
        count = self.archived_offset - self.min_offset
        log_ = self.commit_log
        if count <= 0 or log_.commit_offset <= log_.min_offset:
            return None
        return log_.min_offset, (log_.commit_offset - log_.min_offset) / count

    @property
    def lost_ranges(self) -> list[tuple[int, int]]:
        """[start, end) queue offsets below the archived offset that were skipped, never archived."""
        return self.consume_queue.lost_runs()

    @property
    def archived_runs(self) -> list[tuple[int, int]]:
        """[start, end) queue offsets that are archived: one run unless offsets were lost."""
        return self.consume_queue.held_runs()

    def next_archived_offset(self, queue_offset: int) -> int:
        """``queue_offset`` if it is archived or at/above the archived offset, else the first archived one after it."""
        for start, end in self.consume_queue.queue_runs().held:
            if queue_offset < end:
                return max(queue_offset, start)
        return max(queue_offset, self.archived_offset)

    def archived_run_end(self, queue_offset: int) -> int:
        """One past the last offset of the archived run holding ``queue_offset`` (where a read of it stops)."""
        for start, end in self.consume_queue.queue_runs().held:
            if start <= queue_offset < end:
                return end
        raise NotFoundError(f"queue {self.topic}/{self.queue_id}: offset {queue_offset} is not archived")

    # ---- reads -----------------------------------------------------------------------------------

    async def read_units(self, queue_offset: int, count: int) -> list[ConsumeQueueUnit]:
        """Up to ``count`` archived units from ``queue_offset``."""
        return await self.consume_queue.read_units(queue_offset, count)

    async def read_commit_log(self, offset: int, length: int) -> bytes:
        return await self.commit_log.read(offset, length)

    async def read_messages(self, queue_offset: int, count: int) -> list[bytes]:
        """Up to ``count`` archived records from ``queue_offset``: one consume-queue and one commit-log read."""
        units = await self.read_units(queue_offset, count)
        if not units:
            return []
        start = units[0].commitlog_offset
        end = units[-1].commitlog_offset + units[-1].size
        raw = await self.read_commit_log(start, end - start)
        records = []
        for unit in units:
            begin = unit.commitlog_offset - start
            record = raw[begin : begin + unit.size]
            if len(record) != unit.size:
                break
            records.append(record)
        return records

    async def store_timestamp_of(self, unit: ConsumeQueueUnit) -> int:
        return await self.commit_log.store_timestamp_at(unit.commitlog_offset)

    async def find_queue_offset(self, timestamp: int, boundary: BoundaryType = BoundaryType.LOWER) -> int:
        """The queue offset for a store time (see ``FlatConsumeQueueFile.find_queue_offset``)."""
        return await self.consume_queue.find_queue_offset(timestamp, boundary, self.store_timestamp_of)

    # ---- expiry and removal ----------------------------------------------------------------------

    async def destroy_expired(self, before_timestamp: int) -> int:
        """Remove data older than ``before_timestamp``: consume queue first, then the commit-log bytes
        no remaining unit references; records the new min offset. Returns segments removed."""
        self._require_writable("remove expired data")
        async with self._commit_lock:
            return await self._destroy_expired(before_timestamp)

    async def _destroy_expired(self, before_timestamp: int) -> int:
        removed = await self.consume_queue.destroy_expired(before_timestamp)
        limit: int | None = None
        if self.archived_offset > self.min_offset:
            limit = (await self.consume_queue.read_unit(self.min_offset)).commitlog_offset
        removed += await self.commit_log.destroy_expired(before_timestamp, limit_offset=limit)
        if removed:
            await self._record_positions(min_offset=self.min_offset)
        return removed

    async def destroy(self) -> None:
        """Delete both files from storage and their segment rows (the queue row is the caller's)."""
        self._require_writable("delete its files")
        await self.consume_queue.destroy()
        await self.commit_log.destroy()
