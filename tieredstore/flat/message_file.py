"""FlatMessageFile: one queue in cold storage — its commit log and consume queue, committed in order.

Commit order is commit log, then consume queue, then metadata (queue positions and segment sizes in
one transaction with the optimistic version check). A queue's archived offset is its consume queue's
commit offset: a message counts as archived only once both its unit and its bytes are durable.

Recovery after a crash rebuilds both files from metadata, corrects their last segments' sizes from
the provider, then restores the invariant "every durable unit points at durable bytes, and every
durable commit-log byte is pointed at": a trailing partial unit is cut, units whose bytes did not
survive are cut, and commit-log bytes no unit references are removed. Under leases (an epoch fence
installed) a cut deletes nothing: the segment is sealed at the cut and the file goes on in a new one,
the cut bytes left in storage past the recorded size (``_cut``), so an archiver stalled inside its
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
import itertools
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import sliding_window_view

from tieredstore.errors import CorruptRecordError, NotFoundError, ReadOnlyError, StorageError, ValidationError
from tieredstore.flat.append_file import Clock, wall_clock_ms
from tieredstore.flat.commit_log import FlatCommitLogFile
from tieredstore.flat.consume_queue import BoundaryType, FlatConsumeQueueFile, HeldOffsets
from tieredstore.formats.arrays import UNIT_DTYPE
from tieredstore.formats.consume_queue import UNIT_SIZE, ConsumeQueueUnit
from tieredstore.formats.message import (
    MAGIC_V1,
    MAGIC_V2,
    MIN_RECORD_SIZE,
    POS_PHYSICAL_OFFSET,
    POS_QUEUE_OFFSET,
    PROPERTY_TAGS,
    property_value,
    rewrite_physical_offset,
    split_back_to_back,
    store_timestamp_of,
    tag_hash,
    verify_record,
)
from tieredstore.formats.naming import FileType
from tieredstore.formats.records import Expected, PackedRun, first_problem
from tieredstore.metadata import MetadataStore, QueuePosition, SegmentRecord
from tieredstore.providers.base import Provider

GIB = 1 << 30
MIB = 1 << 20
# The files of a queue a read-only view loads from metadata (its segment rows).
_VIEW_FILE_TYPES = (FileType.COMMIT_LOG.value, FileType.CONSUME_QUEUE.value)


async def read_view_rows(
    metadata: MetadataStore, topic: str, queue_id: int, path: str
) -> tuple[QueuePosition, list[SegmentRecord], list[SegmentRecord]]:
    """What a read-only view loads: the queue's position, then its commit log's and consume queue's live
    segment rows, in one metadata call (the position first: a commit in between only lengthens the rows)."""
    position, rows = await asyncio.to_thread(metadata.get_queue_with_segments, topic, queue_id, path, _VIEW_FILE_TYPES)
    return position, rows[FileType.COMMIT_LOG.value], rows[FileType.CONSUME_QUEUE.value]


@dataclass(frozen=True, slots=True)
class FlatFileSettings:
    """Segment sizes, rolling by time and recovery concurrency (the ``[segments]`` config section)."""

    commit_log_max_size: int = GIB
    consume_queue_max_size: int = 100 * MIB
    # Seconds after which both files' open segments roll, whatever their size (retention's bound).
    commit_log_rolling_interval: float = 24 * 3600.0
    recovery_concurrency: int = 64


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


_HEADER = struct.Struct(">iI")
_PHYSICAL_OFFSET = struct.Struct(">q")

# One message for ``append_batch``: its raw record, queue offset, store timestamp and tag hash.
BatchRecord = tuple[bytes, int, int, int]
Int64Array = npt.NDArray[np.int64]
# A cold consume-queue unit (commit-log offset, size, tag hash) and the record header fields checked on append.


class PackedRecords(Protocol):
    """Consecutive records of one queue from ``first_offset``, back to back in ``data``, with per-record
    sizes, tag hashes and store timestamps as arrays (a hot store's ``HotBatch`` is one)."""

    @property
    def first_offset(self) -> int: ...

    @property
    def data(self) -> bytearray: ...

    @property
    def sizes(self) -> Int64Array: ...

    @property
    def tag_hashes(self) -> Int64Array: ...

    @property
    def store_timestamps(self) -> Int64Array: ...


@dataclass(frozen=True, slots=True)
class RecordRun:
    """PackedRecords built from separate records."""

    first_offset: int
    data: bytearray
    sizes: Int64Array
    tag_hashes: Int64Array
    store_timestamps: Int64Array

    @classmethod
    def of(cls, records: Sequence[BatchRecord]) -> RecordRun:
        """The records (consecutive queue offsets from the first one's) packed into one buffer."""
        return cls(
            first_offset=records[0][1] if records else 0,
            data=bytearray().join(record[0] for record in records),
            sizes=np.fromiter((len(record[0]) for record in records), dtype=np.int64, count=len(records)),
            tag_hashes=np.fromiter((record[3] for record in records), dtype=np.int64, count=len(records)),
            store_timestamps=np.fromiter((record[2] for record in records), dtype=np.int64, count=len(records)),
        )


class FlatMessageFile:
    """The cold files of one queue and its positions."""

    def __init__(
        self,
        provider: Provider,
        metadata: MetadataStore,
        path: str,
        position: QueuePosition,
        *,
        settings: FlatFileSettings | None = None,
        clock: Clock = wall_clock_ms,
    ) -> None:
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
            queue=(self.topic, self.queue_id),
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
            queue=(self.topic, self.queue_id),
        )
        self._position = position
        # Serialises commits, expiry and recovery: two concurrent records would race on one version.
        self._commit_lock = asyncio.Lock()

    def __repr__(self) -> str:
        return (
            f"FlatMessageFile({self.topic}/{self.queue_id}, min={self.min_offset}, "
            f"archived={self.archived_offset}, append={self.append_offset})"
        )

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

    # ---- positions -------------------------------------------------------------------------------

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
        """The next queue offset ``append`` expects (archived offset plus buffered messages)."""
        return self.consume_queue.append_queue_offset

    @property
    def position(self) -> QueuePosition:
        """The positions as last recorded in metadata."""
        return self._position

    @property
    def read_only(self) -> bool:
        """Loaded from metadata as recorded (``load``): readable, never written or repaired."""
        return self.consume_queue.read_only

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

    @property
    def has_pending(self) -> bool:
        return self.commit_log.pending_bytes > 0 or self.consume_queue.pending_bytes > 0

    # ---- the write path --------------------------------------------------------------------------

    async def append(self, record: bytes, queue_offset: int, store_timestamp: int, tag_hash: int) -> int:
        """Buffer one encoded message at ``queue_offset``; returns its offset in the cold commit log.

        The record's PHYSICALOFFSET is rewritten to that offset; nothing is durable until ``commit``.
        The first message of an empty queue may start at any offset; later ones must follow on.
        """
        self._require_writable("append")
        if queue_offset < 0:
            raise ValidationError(f"queue offset {queue_offset} must not be negative")
        self._validate_record(record, queue_offset)
        if self.consume_queue.is_empty:
            if self.commit_log.pending_bytes or self.consume_queue.pending_bytes:
                raise ValidationError(f"{self}: buffered bytes without a consume-queue segment")
            self.consume_queue.reset_initial_queue_offset(queue_offset)
        elif queue_offset != self.append_offset:
            raise ValidationError(
                f"queue {self.topic}/{self.queue_id} expects offset {self.append_offset} next, not {queue_offset}"
            )
        # The consume queue rolls or commits first if it must: were that to fail after the record was
        # buffered, the commit log would hold a record no unit points at, and its retry a second copy.
        await self._roll_by_time(store_timestamp)
        await self.consume_queue.prepare_append(UNIT_SIZE, store_timestamp)
        physical_offset = self.commit_log.append_offset
        landed = await self.commit_log.append(rewrite_physical_offset(record, physical_offset), store_timestamp)
        if landed != physical_offset:
            raise StorageError(f"{self}: commit log appended at {landed}, expected {physical_offset}")
        await self.consume_queue.append_unit(ConsumeQueueUnit(physical_offset, len(record), tag_hash), store_timestamp)
        return physical_offset

    async def append_batch(self, records: Sequence[BatchRecord]) -> int:
        """Buffer a run of consecutive messages in one pass; returns the cold commit-log offset of the first.

        Each record is ``(raw, queue_offset, store_timestamp, tag_hash)``, queue offsets consecutive: the
        records are packed into one buffer and appended by ``append_records``.
        """
        self._require_writable("append")
        if not records:
            return self.commit_log.append_offset
        first_offset = records[0][1]
        for index, (_raw, queue_offset, _timestamp, _tag) in enumerate(records):
            if queue_offset != first_offset + index:
                raise ValidationError(
                    f"a batch for {self.topic}/{self.queue_id} must hold consecutive offsets: {queue_offset} "
                    f"follows {first_offset + index - 1}"
                )
        return await self.append_records(RecordRun.of(records))

    async def append_records(self, run: PackedRecords) -> int:
        """Buffer consecutive messages packed in one buffer; returns the cold commit-log offset of the first.

        The same as ``append`` for each in turn, without Python work per message: every record is
        validated (size, magic, TOTALSIZE, QUEUEOFFSET following on from ``run.first_offset``) before
        anything is buffered, all PHYSICALOFFSETs are rewritten in place in one operation, and the
        consume-queue units are built as one array. A run crossing a segment's max size is split there
        and rolls as ``append`` would. ``run.data`` is taken over (rewritten, then handed to the
        commit log without a copy when the run fits one segment): the caller must not use it again.
        """
        self._require_writable("append")
        sizes = np.asarray(run.sizes, dtype=np.int64)
        count = len(sizes)
        if count == 0:
            return self.commit_log.append_offset
        first_offset = run.first_offset
        if first_offset < 0:
            raise ValidationError(f"queue offset {first_offset} must not be negative")
        data = run.data
        starts = np.zeros(count, dtype=np.int64)
        np.cumsum(sizes[:-1], out=starts[1:])
        self._validate_packed(data, starts, sizes, first_offset)
        if self.consume_queue.is_empty:
            if self.commit_log.pending_bytes or self.consume_queue.pending_bytes:
                raise ValidationError(f"{self}: buffered bytes without a consume-queue segment")
            self.consume_queue.reset_initial_queue_offset(first_offset)
        elif first_offset != self.append_offset:
            raise ValidationError(
                f"queue {self.topic}/{self.queue_id} expects offset {self.append_offset} next, not {first_offset}"
            )
        timestamps = np.asarray(run.store_timestamps, dtype=np.int64)
        await self._roll_by_time(int(timestamps[0]))
        tags = np.asarray(run.tag_hashes, dtype=np.int64)
        first_physical = self.commit_log.append_offset
        start = 0
        while start < count:
            end = start + min(
                self.commit_log.fitting(sizes[start:]), self.consume_queue.fitting_items(UNIT_SIZE, count - start)
            )
            begin, finish = int(starts[start]), int(starts[end - 1] + sizes[end - 1])
            # One segment takes the whole buffer as it is; a split run copies each part out.
            part = data if begin == 0 and finish == len(data) else data[begin:finish]
            await self._append_run(
                part, starts[start:end] - begin, sizes[start:end], tags[start:end], timestamps[start:end]
            )
            start = end
        return first_physical

    async def _append_run(
        self, data: bytearray, starts: Int64Array, sizes: Int64Array, tags: Int64Array, timestamps: Int64Array
    ) -> None:
        """Buffer records (back to back in ``data``) that all go to the current (or next) segment of both files."""
        oldest, newest = int(timestamps.min()), int(timestamps.max())
        # Both files start, roll or commit first if they must, so the appends below only buffer: a
        # failure there can never leave records in the commit log without their units.
        await self.consume_queue.prepare_append(len(sizes) * UNIT_SIZE, oldest)
        await self.commit_log.prepare_append(len(data), oldest)
        physical_offset = self.commit_log.append_offset
        physical = starts + physical_offset
        fields = sliding_window_view(np.frombuffer(data, dtype=np.uint8)[POS_PHYSICAL_OFFSET:], 8, writeable=True)
        # Rows at distinct record starts never overlap: each assignment writes one record's 8 bytes.
        fields[starts] = physical.astype(">i8").view(np.uint8).reshape(-1, 8)
        del fields  # the commit log takes the buffer over: no view of it may stay behind
        units = np.empty(len(sizes), dtype=UNIT_DTYPE)
        units["commitlog_offset"] = physical
        units["size"] = sizes
        units["tag_hash"] = tags
        landed = await self.commit_log.append(data, oldest, newest)
        if landed != physical_offset:
            raise StorageError(f"{self}: commit log appended at {landed}, expected {physical_offset}")
        await self.consume_queue.append(units.tobytes(), oldest, newest)

    def _validate_packed(self, data: bytearray, starts: Int64Array, sizes: Int64Array, first_offset: int) -> None:
        """Every record of a packed run is a message of its size at its queue offset; the first that is
        not raises what ``_validate_record`` raises for it."""
        if int(sizes.sum()) != len(data):
            raise ValidationError(f"records of {int(sizes.sum())} bytes in total were given {len(data)} bytes")
        # Whole messages at consecutive queue offsets: the archiver checked the rest of each record.
        rule = Expected(queue_offsets=first_offset, check_crc=False, head_only=True)
        first = first_problem(PackedRun.at(data, starts, sizes), rule)
        if first is not None:
            begin = int(starts[first])
            self._validate_record(bytes(data[begin : begin + int(sizes[first])]), first_offset + first)
            raise ValidationError(f"the record for queue offset {first_offset + first} does not check out")

    def _validate_record(self, record: bytes, queue_offset: int) -> None:
        if len(record) < MIN_RECORD_SIZE:
            raise CorruptRecordError(f"a {len(record)}-byte record is shorter than any message")
        total, magic = _HEADER.unpack_from(record, 0)
        if magic not in (MAGIC_V1, MAGIC_V2):
            raise CorruptRecordError(f"bad magic code 0x{magic:08x} in the record for queue offset {queue_offset}")
        if total != len(record):
            raise CorruptRecordError(f"record TOTALSIZE {total} but {len(record)} bytes were given")
        (stored_offset,) = struct.unpack_from(">q", record, POS_QUEUE_OFFSET)
        if stored_offset != queue_offset:
            raise ValidationError(f"record holds queue offset {stored_offset}, appended as {queue_offset}")

    async def commit(self) -> int:
        """Commit the commit log, then the consume queue, then record positions; returns the archived offset.

        A StorageError keeps every buffer for the next call; a metadata failure leaves the files
        committed and the record is written by the next call (or corrected by recovery).
        """
        self._require_writable("commit")
        async with self._commit_lock:
            await self.commit_log.commit()
            await self.consume_queue.commit()
            await self._record_positions()
            return self.archived_offset

    async def skip_to(self, queue_offset: int) -> int:
        """Continue the queue at ``queue_offset``, durably recording [archived offset, queue_offset) as lost.

        For offsets the hot store dropped before they were archived. Nothing may be buffered (commit
        first). An empty queue simply starts at ``queue_offset``; otherwise the consume queue seals its
        last segment and starts a new one there, and the commit log carries on. Returns the archived
        offset, which is then ``queue_offset``.
        """
        self._require_writable("skip offsets")
        async with self._commit_lock:
            if self.has_pending:
                raise ValidationError(f"{self}: commit buffered messages before skipping offsets")
            if queue_offset < self.archived_offset:
                raise ValidationError(
                    f"queue {self.topic}/{self.queue_id} is archived up to {self.archived_offset}; "
                    f"it cannot skip back to {queue_offset}"
                )
            if queue_offset == self.archived_offset:
                return queue_offset
            await self.consume_queue.start_segment_at(queue_offset * UNIT_SIZE)
            nothing_archived = self.archived_offset == self.min_offset and not self.consume_queue.segments
            await self._record_positions(min_offset=queue_offset if nothing_archived else None)
            return self.archived_offset

    async def roll_if_due(self, now_ms: int | None = None) -> bool:
        """Roll both files whose open segment began a rolling interval ago, also when no message arrives.

        For a quiet queue's maintenance pass: retention never removes a file's last segment, so data
        in a segment that never rolled would outlive its retention. Nothing is done while a batch is
        buffered (its commit comes first); an empty open segment is never sealed, and the next message
        goes to the new segment. Returns whether either file rolled.
        """
        self._require_writable("roll segments")
        async with self._commit_lock:
            if self.has_pending:
                return False
            return await self._roll_by_time(self.clock() if now_ms is None else now_ms)

    async def _roll_by_time(self, now_ms: int) -> bool:
        """Roll both files if due at ``now_ms``: the clock on a maintenance pass, the store time of the
        next message when one is appended (so a backlog of old messages is cut by store time, not
        into a segment per batch because the clock says its first message is old)."""
        rolled = await self.consume_queue.try_rolling(now_ms)
        return await self.commit_log.try_rolling(now_ms) or rolled

    def _require_writable(self, action: str) -> None:
        if self.read_only:
            raise ReadOnlyError(f"queue {self.topic}/{self.queue_id} is open read-only: cannot {action}")

    async def _record_positions(self, *, min_offset: int | None = None) -> None:
        updates = [u for u in (self.commit_log.segment_update(), self.consume_queue.segment_update()) if u]
        archived = self.archived_offset
        if not updates and archived == self._position.max_offset and min_offset is None:
            return
        self._position = await asyncio.to_thread(
            self.metadata.record_commit,
            self.topic,
            self.queue_id,
            expected_version=self._position.version,
            max_offset=archived,
            min_offset=min_offset,
            segments=updates,
        )
        for update in updates:
            (self.commit_log if update.file_type == self.commit_log.file_type else self.consume_queue).mark_recorded(
                update
            )

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

    # ---- recovery --------------------------------------------------------------------------------

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
        if orphans and self.metadata.fenced:
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
        ends = split_back_to_back(raw, len(raw) // MIN_RECORD_SIZE + 1)
        topic = self.topic.encode("utf-8")
        first = self.archived_offset
        units: list[tuple[ConsumeQueueUnit, int]] = []
        for start, end in itertools.pairwise(ends):
            record = raw[start:end]
            try:
                fields = verify_record(record)
            except CorruptRecordError:
                break
            if (
                fields.queue_id != self.queue_id
                or fields.queue_offset != first + len(units)
                or fields.physical_offset != referenced_end + start
                or record[fields.topic_at : fields.topic_at + fields.topic_len] != topic
            ):
                break
            tags = property_value(record, fields, PROPERTY_TAGS)
            unit = ConsumeQueueUnit(referenced_end + start, end - start, tag_hash(tags))
            units.append((unit, fields.store_timestamp))
        if not units:
            return 0, referenced_end, None
        for unit, timestamp in units:
            await self.consume_queue.append_unit(unit, timestamp)
        await self.consume_queue.commit()
        last = units[-1][0]
        return len(units), last.commitlog_offset + last.size, max(timestamp for _, timestamp in units)

    async def _cut(self, flat_file: FlatCommitLogFile | FlatConsumeQueueFile, offset: int) -> bool:
        """Recovery's cut of ``flat_file`` at ``offset``; True if the bytes were abandoned.

        Under leases (an epoch fence installed) committed bytes are abandoned in place where they can be
        (``FlatAppendFile.abandon_tail``), never deleted: a stalled archiver waking up inside its own
        recovery after a successor took the queue over must not delete what the successor wrote since,
        and storage cannot refuse a deletion the way metadata refuses a stale epoch. Otherwise, and
        where abandoning cannot be done, the bytes are truncated (after ``check_lease``).
        """
        if self.metadata.fenced:
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
