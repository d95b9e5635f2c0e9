"""The write path of a FlatMessageFile: runs of packed records buffered, then committed in order."""

from __future__ import annotations

import struct
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import sliding_window_view

from tieredstore.errors import CorruptRecordError, StorageError, ValidationError
from tieredstore.flat.queue_state import QueueFiles
from tieredstore.formats.arrays import UNIT_DTYPE
from tieredstore.formats.consume_queue import UNIT_SIZE
from tieredstore.formats.message import (
    MAGIC_V1,
    MAGIC_V2,
    MIN_RECORD_SIZE,
    POS_PHYSICAL_OFFSET,
    POS_QUEUE_OFFSET,
)
from tieredstore.formats.records import Expected, PackedRun, first_problem

_HEADER = struct.Struct(">iI")

# One message for ``RecordRun.of``: its raw record, queue offset, store timestamp and tag hash.
BatchRecord = tuple[bytes, int, int, int]
Int64Array = npt.NDArray[np.int64]


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
        first_offset = records[0][1] if records else 0
        for index, (_raw, queue_offset, _timestamp, _tag) in enumerate(records):
            if queue_offset != first_offset + index:
                raise ValidationError(
                    f"a run must hold consecutive queue offsets: {queue_offset} follows {first_offset + index - 1}"
                )
        return cls(
            first_offset=first_offset,
            data=bytearray().join(record[0] for record in records),
            sizes=np.fromiter((len(record[0]) for record in records), dtype=np.int64, count=len(records)),
            tag_hashes=np.fromiter((record[3] for record in records), dtype=np.int64, count=len(records)),
            store_timestamps=np.fromiter((record[2] for record in records), dtype=np.int64, count=len(records)),
        )


class QueueWrites(QueueFiles):
    """Appends, commits, offset skips and time rolls of a queue's cold files."""

    async def append_records(self, run: PackedRecords) -> int:
        """Buffer consecutive messages packed in one buffer; returns the cold commit-log offset of the first.

        The one way messages enter a queue: the first run of an empty queue may start at any offset,
        later ones must follow on. Nothing is durable until ``commit``. Without Python work per
        message: every record is validated (size, magic, TOTALSIZE, QUEUEOFFSET following on from
        ``run.first_offset``) before anything is buffered, all PHYSICALOFFSETs are rewritten in place in
        one operation to the records' offsets in the cold commit log, and the consume-queue units are
        built as one array. A run crossing a segment's max size is split there, each part rolling the
        segments it fills. ``run.data`` is taken over (rewritten, then handed to the commit log without a
        copy when the run fits one segment): the caller must not use it again.
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

    async def commit(self, *, on_durable: Callable[[], Awaitable[object]] | None = None) -> int:
        """Commit the commit log, then the consume queue, then call ``on_durable``, then record positions;
        returns the archived offset.

        ``on_durable`` is where the archiver puts the batch's key-index entries: after the units they
        point at are durable, before metadata counts them archived, so an entry never names a message
        that is not archived and a crash before the record re-indexes them (recovery's ``RecoveryResult``).
        A StorageError (or the hook's error) keeps every buffer for the next call; a metadata failure
        leaves the files committed and the record is written by the next call (or corrected by recovery).
        """
        self._require_writable("commit")
        async with self._commit_lock:
            await self.commit_log.commit()
            await self.consume_queue.commit()
            if on_durable is not None:
                await on_durable()
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
