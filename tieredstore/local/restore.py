"""Restores into a LocalMessageStore: archived records appended at the queue offsets they carry."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import NamedTuple, overload

import numpy as np
import numpy.typing as npt
import structlog

from tieredstore.basics import check_queue_id
from tieredstore.errors import CorruptRecordError, MessageTooLargeError, ValidationError
from tieredstore.formats.arrays import UNIT_DTYPE
from tieredstore.formats.consume_queue import UNIT_SIZE, ConsumeQueueUnit
from tieredstore.formats.message import POS_PHYSICAL_OFFSET, RecordFields, verify_record
from tieredstore.formats.naming import validate_topic
from tieredstore.formats.records import Expected, Layout, PackedRun, first_problem, store_timestamps_of, tag_hashes_of
from tieredstore.local.queue import ConsumeQueue
from tieredstore.local.results import PutResult
from tieredstore.local.store_state import StoreState

log = structlog.get_logger(__name__)


class _Restorable(NamedTuple):
    """A checked batch for a restore: the records joined, and what their units and results need."""

    data: bytes
    sizes: list[int]
    size_array: npt.NDArray[np.int64]
    starts: npt.NDArray[np.int64]
    first_offset: int
    tag_hashes: npt.NDArray[np.int64]
    store_timestamps: npt.NDArray[np.int64]
    total: int


class JoinedRecords(Sequence[memoryview]):
    """Records back to back in one buffer, ``sizes[i]`` bytes each, as a cold commit log holds a queue's.

    A sequence of the records (views of ``data``); ``restore_messages`` takes the buffer as it is.
    """

    __slots__ = ("_ends", "data", "sizes")

    def __init__(self, data: bytes, sizes: list[int]) -> None:
        if sum(sizes) != len(data) or (sizes and min(sizes) < 0):
            raise ValidationError(f"record sizes add up to {sum(sizes)} but the buffer holds {len(data)} bytes")
        self.data = data
        self.sizes = sizes
        self._ends = list(itertools.accumulate(sizes))

    def __len__(self) -> int:
        return len(self.sizes)

    @overload
    def __getitem__(self, index: int) -> memoryview: ...

    @overload
    def __getitem__(self, index: slice) -> list[memoryview]: ...

    def __getitem__(self, index: int | slice) -> memoryview | list[memoryview]:
        if isinstance(index, slice):
            return [self[i] for i in range(len(self))[index]]
        at = range(len(self))[index]  # IndexError outside, negative indexes from the end
        end = self._ends[at]
        return memoryview(self.data)[end - self.sizes[at] : end]


class _RestoredResults(Sequence[PutResult]):
    """Where each record of a restore landed, a PutResult built only when asked for (a restore asks for none)."""

    __slots__ = ("_first", "_positions", "_queue_id", "_sizes", "_stamps", "_topic")

    def __init__(
        self,
        topic: str,
        queue_id: int,
        first: int,
        positions: list[int],
        sizes: list[int],
        stamps: npt.NDArray[np.int64],
    ) -> None:
        self._topic, self._queue_id, self._first = topic, queue_id, first
        self._positions, self._sizes, self._stamps = positions, sizes, stamps

    def __len__(self) -> int:
        return len(self._positions)

    @overload
    def __getitem__(self, index: int) -> PutResult: ...

    @overload
    def __getitem__(self, index: slice) -> list[PutResult]: ...

    def __getitem__(self, index: int | slice) -> PutResult | list[PutResult]:
        if isinstance(index, slice):
            return [self[i] for i in range(len(self))[index]]
        at = range(len(self))[index]  # IndexError outside, negative indexes from the end
        return PutResult(
            self._topic, self._queue_id, self._first + at, self._positions[at], self._sizes[at], int(self._stamps[at])
        )

    def __iter__(self) -> Iterator[PutResult]:
        return (self[i] for i in range(len(self)))


class StoreRestore(StoreState):
    """``restore_messages``: whole runs of checked records written at once, keeping every byte but PHYSICALOFFSET."""

    def restore_messages(self, topic: str, queue_id: int, records: Sequence[bytes | memoryview]) -> Sequence[PutResult]:
        """Append archived records at the queue offsets they carry: a restore from cold storage.

        The first record must carry the queue's max offset, or any offset when the queue has never
        held a message (a fresh node keeps the offsets consumers committed); the others follow on one
        by one. Every byte is kept except PHYSICALOFFSET, which becomes where the record lands here,
        so store timestamps, hosts and properties survive. Every record is checked (magic, sizes and
        lengths, body CRC, topic and queue) before anything is written, without being decoded whole; a
        record that breaks a rule fails the whole call. ``JoinedRecords`` (records back to back in one
        buffer, as a cold commit log holds them) are taken as they are, not cut into records.
        """
        validate_topic(topic)
        check_queue_id(queue_id, self.config.max_queues_per_topic)
        if self.read_only:
            raise ValidationError(f"{self.root} is open read-only; restores are refused")
        if self._closed:
            raise ValidationError("the hot store is closed")
        if not records:
            return []
        data: bytes
        if isinstance(records, JoinedRecords):
            # Immutable bytes are checked and copied as they are: no second copy of a 16 MiB batch.
            data = records.data if type(records.data) is bytes else bytes(records.data)
            sizes = records.sizes
        else:
            data, sizes = b"".join(records), [len(raw) for raw in records]
        checked = self._restorable(topic, queue_id, data, sizes)
        first = checked.first_offset
        with self._put_lock:
            self._check_disk(checked.total + UNIT_SIZE * len(checked.sizes))
            queue = self._queue(topic, queue_id)
            if queue.max_offset != first and not (queue.max_offset == 0 and queue.min_offset == 0):
                raise ValidationError(
                    f"queue {topic}/{queue_id} holds offsets up to {queue.max_offset}; "
                    f"a restore must continue there, not at {first}"
                )
            if queue.max_offset != first:
                # A queue that never held a message is rebased by its first unit, which must come before
                # any reservation: reserving would create its files at offset 0.
                positions = self._restore_locked(queue, checked, 0, 1, reserve_units=False)
                positions += self._restore_locked(queue, checked, 1, len(checked.sizes), reserve_units=True)
            else:
                positions = self._restore_locked(queue, checked, 0, len(checked.sizes), reserve_units=True)
        return _RestoredResults(topic, queue_id, first, positions, checked.sizes, checked.store_timestamps)

    def _restorable(self, topic: str, queue_id: int, data: bytes, record_sizes: Sequence[int]) -> _Restorable:
        """The records of ``data`` (back to back, ``record_sizes`` bytes each) checked at once; the first bad raises.

        The batch record engine checks them all with the restore's rule; the first it flags goes through
        ``_restorable_one``, which raises the error it deserves.
        """
        topic_raw = topic.encode("utf-8")
        run = PackedRun.back_to_back(data, record_sizes)
        rule = Expected(topic=topic_raw, queue_id=queue_id, max_body_length=self.config.max_message_size)
        bad = first_problem(run, rule)
        if bad is not None:
            begin = int(run.starts[bad])
            self._restorable_one(topic, topic_raw, queue_id, bytes(data[begin : begin + record_sizes[bad]]))
            # The engine and the per-record check flag the same records; this is never reached.
            raise CorruptRecordError(f"restored record {bad} of {topic}/{queue_id} does not check out")
        sizes, starts = run.sizes, run.starts
        count = len(sizes)
        queue_offsets = run.heads["queue_offset"].astype(np.int64)
        stamps = store_timestamps_of(run.heads)
        tag_hashes = tag_hashes_of(run, Layout.of(run), np.arange(count, dtype=np.int64))
        first = int(queue_offsets[0])
        jumps = np.flatnonzero(queue_offsets != first + np.arange(count))
        if len(jumps):
            index = int(jumps[0])
            raise ValidationError(
                f"restored records of {topic}/{queue_id} must have consecutive queue offsets: "
                f"{queue_offsets[index]} follows {first + index - 1}"
            )
        return _Restorable(data, list(record_sizes), sizes, starts, first, tag_hashes, stamps, len(data))

    def _restorable_one(self, topic: str, topic_raw: bytes, queue_id: int, raw: bytes) -> RecordFields:
        """One record checked on its own, every rule in turn: the errors a bad record of a restore gets."""
        location = f"restored record of {topic}/{queue_id}"
        fields = verify_record(raw, location=location)
        owner_raw = raw[fields.topic_at : fields.topic_at + fields.topic_len]
        if owner_raw != topic_raw or fields.queue_id != queue_id:
            try:
                owner = owner_raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise CorruptRecordError(f"undecodable topic: {exc}", location=location) from exc
            raise ValidationError(f"a record of {owner}/{fields.queue_id} cannot be restored into {topic}/{queue_id}")
        if fields.total != len(raw):
            raise CorruptRecordError(f"record TOTALSIZE {fields.total} but {len(raw)} bytes were given")
        if fields.body_len > self.config.max_message_size:
            raise MessageTooLargeError(
                f"restored body is {fields.body_len} bytes; max_message_size is {self.config.max_message_size}"
            )
        return fields

    def _restore_locked(
        self, queue: ConsumeQueue, batch: _Restorable, begin: int, end: int, *, reserve_units: bool
    ) -> list[int]:
        """Records [begin, end) of a checked batch: one commit-log write per file they land in, one units append.

        Returns where each record landed in the commit log.
        """
        if begin >= end:
            return []
        sizes = batch.sizes[begin:end]
        starts = batch.starts[begin:end]
        log_ = self._commit_log
        self._check_disk(sum(sizes) + UNIT_SIZE * len(sizes))
        plan = log_.plan(sizes)
        log_.prepare(plan)
        if reserve_units:
            queue.prepare(len(sizes))
        for blank_offset, blank_size in plan.blanks:
            log_.write_blank(blank_offset, blank_size)
        positions = np.array(plan.positions, dtype=np.int64)
        physical = positions.astype(">i8").view(np.uint8).reshape(len(sizes), 8)
        # Records are laid back to back except where a blank ends a file: one write per run. PHYSICALOFFSET
        # becomes where each record lands here, patched in a copy of the run in the store's reused buffer
        # (the caller's stays as it was), which goes to the file through its descriptor: the kernel's copy
        # runs without the GIL.
        breaks = np.flatnonzero(np.diff(positions) != np.diff(starts)) + 1
        bounds = [0, *breaks.tolist(), len(sizes)]
        with memoryview(batch.data) as view:
            for low, high in itertools.pairwise(bounds):
                source = int(starts[low])
                length = int(starts[high - 1]) + sizes[high - 1] - source
                offset = int(positions[low])
                file = log_.file_for(offset)
                assert file is not None and offset + length <= file.end_offset
                run = self._restore_scratch(length)
                run[:] = view[source : source + length]
                patched = np.frombuffer(run, dtype=np.uint8)
                patched[(starts[low:high] - source + POS_PHYSICAL_OFFSET)[:, None] + np.arange(8)] = physical[low:high]
                file.write_through(offset - file.start_offset, run)
        offsets = plan.positions
        tags = batch.tag_hashes[begin:end]
        first = batch.first_offset + begin
        self._last_store_timestamp = max(self._last_store_timestamp, int(batch.store_timestamps[begin:end].max()))
        # As for puts (StorePuts._append): records are published before the units that point at them.
        log_.write_offset = plan.end_offset
        if reserve_units:
            units = np.empty(len(sizes), dtype=UNIT_DTYPE)
            units["commitlog_offset"], units["size"], units["tag_hash"] = positions, batch.size_array[begin:end], tags
            queue.append_unit_array(units)
        else:
            for index, (offset, size, tag) in enumerate(zip(offsets, sizes, tags.tolist(), strict=True)):
                queue.append(ConsumeQueueUnit(offset, size, tag), first + index)
        queue.release_pages(first, first + len(sizes))
        self._dispatched_offset = plan.end_offset
        self._unit_count += len(sizes)
        return offsets

    def _restore_scratch(self, length: int) -> memoryview:
        """``length`` bytes of the reused restore buffer, grown when too small (the caller holds _put_lock)."""
        if len(self._restore_buffer) < length:
            self._restore_buffer = bytearray(length)
        return memoryview(self._restore_buffer)[:length]
