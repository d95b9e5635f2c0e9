"""Recovery of a FlatMessageFile after a crash: both files rebuilt from metadata and brought back in line
(see ``flat.message_file``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tieredstore.flat.commit_log import FlatCommitLogFile
from tieredstore.flat.consume_queue import FlatConsumeQueueFile, HeldOffsets
from tieredstore.flat.queue_state import QueueFiles
from tieredstore.formats.consume_queue import UNIT_SIZE, ConsumeQueueUnit
from tieredstore.formats.message import MIN_RECORD_SIZE, split_back_to_back, store_timestamp_of
from tieredstore.formats.records import (
    Expected,
    Layout,
    PackedRun,
    first_problem,
    store_timestamps_of,
    tag_hashes_of,
)
from tieredstore.metadata import SegmentRecord


@dataclass(frozen=True, slots=True)
class RecoveryResult:
    """What recovering one queue found and changed."""

    archived_offset: int
    previous_archived_offset: int
    dropped_units: int
    orphan_bytes_removed: int
    sizes_corrected: bool
    orphan_bytes_abandoned: int = 0  # left in storage past a sealed segment's recorded size (under leases)
    records_completed: int = 0  # whole records of a commit cut short given their units (under leases)

    @property
    def changed(self) -> bool:
        return (
            self.sizes_corrected
            or self.dropped_units > 0
            or self.orphan_bytes_removed > 0
            or self.orphan_bytes_abandoned > 0
            or self.archived_offset != self.previous_archived_offset
        )


def completing_units(
    raw: bytes, at: int, topic_raw: bytes, queue_id: int, first_offset: int
) -> tuple[list[ConsumeQueueUnit], npt.NDArray[np.int64]]:
    """The units of the records back to back in ``raw`` (commit-log bytes from offset ``at``) up to the first
    that is not a sound record of this queue at the next queue offset and its own PHYSICALOFFSET, and
    their store timestamps: the batch record engine with a completed commit's rule."""
    ends = np.asarray(split_back_to_back(raw, len(raw) // MIN_RECORD_SIZE + 1), dtype=np.int64)
    run = PackedRun.at(raw, ends[:-1], np.diff(ends))
    rule = Expected(topic=topic_raw, queue_id=queue_id, queue_offsets=first_offset, physical_offsets=at + run.starts)
    bad = first_problem(run, rule)
    whole = np.arange(len(run.starts) if bad is None else bad, dtype=np.int64)
    tags = tag_hashes_of(run, Layout.of(run), whole).tolist()
    places = (at + run.starts[whole]).tolist()
    sizes = run.sizes[whole].tolist()
    units = [ConsumeQueueUnit(*unit) for unit in zip(places, sizes, tags, strict=True)]
    return units, store_timestamps_of(run.heads[whole])


class QueueRecovery(QueueFiles):
    """``recover``: the invariant between a queue's two cold files restored after a crash."""

    async def recover(
        self,
        commit_log_records: Sequence[SegmentRecord] | None = None,
        consume_queue_records: Sequence[SegmentRecord] | None = None,
    ) -> RecoveryResult:
        """Rebuild from metadata and storage after a restart; see the module docstring."""
        self._require_writable("recover")
        async with self._commit_lock:
            return await self._recover(commit_log_records, consume_queue_records)

    async def _recover(
        self,
        commit_log_records: Sequence[SegmentRecord] | None,
        consume_queue_records: Sequence[SegmentRecord] | None,
    ) -> RecoveryResult:
        corrected = await self.commit_log.recover(commit_log_records)
        corrected = await self.consume_queue.recover(consume_queue_records) or corrected
        if self.consume_queue.is_empty:
            self.consume_queue.reset_initial_queue_offset(self._position.max_offset)
        before_units = self.archived_offset

        whole_units_end = self.consume_queue.commit_offset - self.consume_queue.commit_offset % UNIT_SIZE
        if whole_units_end != self.consume_queue.commit_offset:
            await self._cut(self.consume_queue, whole_units_end)
        last_unit, durable_end = await self._last_durable_unit()
        if durable_end < self.archived_offset:
            await self._cut(self.consume_queue, durable_end * UNIT_SIZE)
        dropped = before_units - self.archived_offset

        referenced_end = self.commit_log.min_offset
        newest_timestamp: int | None = None
        if last_unit is not None:
            referenced_end = last_unit.commitlog_offset + last_unit.size
            if corrected or dropped:
                newest_timestamp = store_timestamp_of(await self.commit_log.record_head(last_unit.commitlog_offset))
        orphans = max(0, self.commit_log.commit_offset - referenced_end)
        completed = 0
        if orphans and self.lease is not None:
            completed, referenced_end, newest = await self._complete_cut_short_commit(referenced_end)
            if completed:
                newest_timestamp = newest
                orphans = max(0, self.commit_log.commit_offset - referenced_end)
        abandoned = 0
        cut_at = max(referenced_end, self.commit_log.min_offset)
        # (Nothing is buffered here: the files' recovery rebuilt their segments from metadata rows.)
        if orphans and await self._cut(self.commit_log, cut_at):
            abandoned, orphans = orphans, 0
        if newest_timestamp is not None:
            for flat_file in (self.commit_log, self.consume_queue):
                if flat_file.segments:
                    flat_file.segments[-1].max_timestamp = newest_timestamp
        previous = self._position.max_offset
        await self._record_positions()
        return RecoveryResult(
            archived_offset=self.archived_offset,
            previous_archived_offset=previous,
            dropped_units=dropped,
            orphan_bytes_removed=orphans,
            sizes_corrected=corrected,
            orphan_bytes_abandoned=abandoned,
            records_completed=completed,
        )

    async def _complete_cut_short_commit(self, referenced_end: int) -> tuple[int, int, int | None]:
        """Give the whole records a commit cut short left past ``referenced_end`` their consume-queue units.

        Under leases a cut must not delete (``_cut``), and where a commit that rolled to a new segment
        was cut short, a cut could not even abandon: the bytes fill that segment from its start. But
        those bytes are this queue's next records exactly as its archiver wrote them, so recovery can
        finish the commit instead of undoing it. Records are taken while each is a sound record (magic,
        sizes, body CRC) of this topic and queue, holds the next queue offset and its own PHYSICALOFFSET;
        the first that is not (a torn tail) ends them. Returns how many, where they end, and the newest
        store timestamp among them.
        """
        raw = await self.commit_log.read(referenced_end, self.commit_log.commit_offset - referenced_end)
        units, stamps = completing_units(
            raw, referenced_end, self.topic.encode("utf-8"), self.queue_id, self.archived_offset
        )
        if not units:
            return 0, referenced_end, None
        for unit, timestamp in zip(units, stamps.tolist(), strict=True):
            await self.consume_queue.append_unit(unit, timestamp)
        await self.consume_queue.commit()
        last = units[-1]
        return len(units), last.commitlog_offset + last.size, int(stamps.max())

    async def _cut(self, flat_file: FlatCommitLogFile | FlatConsumeQueueFile, offset: int) -> bool:
        """Recovery's cut of ``flat_file`` at ``offset``; True if the bytes were abandoned.

        Under a lease (``self.lease``) committed bytes are abandoned in place where they can be
        (``FlatAppendFile.abandon_tail``), never deleted: a stalled archiver waking up inside its own
        recovery after a successor took the queue over must not delete what the successor wrote since,
        and storage cannot refuse a deletion the way metadata refuses a stale epoch. Otherwise, and
        where abandoning cannot be done, the bytes are truncated (after ``check_lease``).
        """
        if self.lease is not None:
            if offset >= flat_file.commit_offset:
                return False  # nothing committed to cut
            if await flat_file.abandon_tail(offset):
                return True
        await flat_file.truncate(offset)
        return False

    async def _last_durable_unit(self) -> tuple[ConsumeQueueUnit | None, int]:
        """The last archived unit whose commit-log bytes are all durable, and where the consume queue must end.

        The end is the archived offset when every unit's bytes are durable, else the first unit whose
        bytes are not. The usual case costs one unit read (the last one); lost offsets are skipped.
        """
        held = HeldOffsets(self.consume_queue.held_runs())
        if not held:
            return None, self.archived_offset
        durable = self.commit_log.commit_offset
        units: dict[int, ConsumeQueueUnit] = {}

        async def unit_at(index: int) -> ConsumeQueueUnit:
            if index not in units:
                units[index] = await self.consume_queue.read_unit(held.offset(index))
            return units[index]

        async def within(index: int) -> bool:
            unit = await unit_at(index)
            return unit.commitlog_offset + unit.size <= durable

        last = len(held) - 1
        if await within(last):
            return units[last], self.archived_offset
        # Units point at increasing commit-log offsets: find the first one past the durable end.
        low, high = 0, last
        while low < high:
            middle = (low + high) // 2
            if await within(middle):
                low = middle + 1
            else:
                high = middle
        return (await unit_at(low - 1) if low > 0 else None), held.offset(low)
