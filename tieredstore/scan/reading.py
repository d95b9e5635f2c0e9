"""Reading one partition in a task: windows of commit-log bytes from the one cold reader, decoded straight
into Arrow.

Partitions run in an event loop and through a provider that a Python worker keeps from one partition
to the next (``tieredstore.scan.session``). A partition is read through ``ColdQueueReader`` like every
other cold read: windows of ``read_block_bytes`` split from the commit log, whose records lie back to back,
without the consume queue (which has the last word where a split does not check out); offsets lost before
they were archived come as a ``LostRange`` between windows. The consume queue is also read to step over
a corrupt record, whose length cannot be trusted.

Runs of records in the common layout (v1 magic, IPv4 hosts) are checked and turned into Arrow columns a
whole run at a time (``tieredstore.scan.columns``). A record that run path does not take is decoded
here on its own: field by field in the common layout, where a failed check gets its precise message,
and through ``tieredstore.formats.message.decode`` in any other layout. Every path checks the same
things: magic, sizes, body CRC, and that the record is the one the consume queue promised (topic, queue
id, queue offset). Only the columns the query asked for are built.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from tieredstore.errors import CorruptRecordError
from tieredstore.flat.cold_reader import ColdQueueReader, ColdReadOptions, FollowPoint, LostRange
from tieredstore.flat.served import ReadAheadBatch
from tieredstore.formats.checksum import body_crc
from tieredstore.formats.message import (
    MAGIC_V1,
    MIN_RECORD_SIZE,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_STOREHOST_V6,
    MessageRecord,
    decode,
)
from tieredstore.formats.naming import FileType
from tieredstore.formats.records import Int64Array, Layout, PackedRun, store_timestamps_of
from tieredstore.providers.base import Provider
from tieredstore.scan.columns import RunColumns, checked_prefix
from tieredstore.scan.layout import ArchiveView
from tieredstore.scan.options import OnCorrupt, ScanOptions
from tieredstore.scan.planning import PartitionPlan
from tieredstore.scan.properties import parse_properties, split_keys
from tieredstore.scan.schema import ARROW_SCHEMA
from tieredstore.scan.session import read_session

log = logging.getLogger(__name__)

# TOTALSIZE .. BODYLEN when both hosts are IPv4: 88 bytes.
_IPV4_HEADER = struct.Struct(">iIiiiqqiq8sq8siqi")
_SIZE = struct.Struct(">i")
_RUN_AFTER_ANOTHER_LAYOUT = 64
_PROPERTIES_LENGTH = struct.Struct(">h")
_PHYSICAL_OFFSET = struct.Struct(">q")
_IPV6_BITS = SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6
_KEYS_TYPE = ARROW_SCHEMA.field("keys").type
_PROPERTIES_TYPE = ARROW_SCHEMA.field("properties").type
_TIMESTAMP_TYPE = ARROW_SCHEMA.field("store_timestamp").type


class _Corrupt(Exception):
    """A record that does not decode; its reason, before the location is known."""


class ColumnBuilder:
    """Column lists for one Arrow batch."""

    def __init__(self) -> None:
        self.topic: list[str] = []
        self.queue_id: list[int] = []
        self.queue_offset: list[int] = []
        self.commitlog_offset: list[int] = []
        self.store_timestamp: list[int] = []
        self.born_timestamp: list[int] = []
        self.key_offsets: list[int] = [0]
        self.keys: list[str] = []
        self.tags: list[str | None] = []
        self.property_offsets: list[int] = [0]
        self.property_names: list[str] = []
        self.property_values: list[str] = []
        self.msg_id: list[str] = []
        self.body: list[bytes] = []
        self.body_crc: list[int] = []
        self.reconsume_times: list[int] = []
        self.sysflag: list[int] = []

    def __len__(self) -> int:
        return len(self.queue_offset)

    def add_properties(self, raw: bytes) -> dict[str, str]:
        properties = parse_properties(raw)
        self.property_names.extend(properties)
        self.property_values.extend(properties.values())
        self.property_offsets.append(len(self.property_names))
        self.keys.extend(split_keys(properties))
        self.key_offsets.append(len(self.keys))
        self.tags.append(properties.get(PROPERTY_TAGS) or None)
        return properties

    def add_record(self, record: MessageRecord) -> None:
        """A record decoded by the general decoder (v2 magic or IPv6 hosts)."""
        self.topic.append(record.topic)
        self.queue_id.append(record.queue_id)
        self.queue_offset.append(record.queue_offset)
        self.commitlog_offset.append(record.physical_offset)
        self.store_timestamp.append(record.store_timestamp * 1000)
        self.born_timestamp.append(record.born_timestamp * 1000)
        self.property_names.extend(record.properties)
        self.property_values.extend(record.properties.values())
        self.property_offsets.append(len(self.property_names))
        self.keys.extend(record.keys)
        self.key_offsets.append(len(self.keys))
        self.tags.append(record.tags)
        self.msg_id.append(record.unique_key or record.offset_msg_id)
        self.body.append(record.body)
        self.body_crc.append(record.stored_crc)
        self.reconsume_times.append(record.reconsume_times)
        self.sysflag.append(record.sysflag)

    def build(self, names: Sequence[str]) -> pa.RecordBatch:
        """The batch of the columns ``names``, in that order."""
        arrays = [
            pa.array(self.topic, pa.string()),
            pa.array(self.queue_id, pa.int32()),
            pa.array(self.queue_offset, pa.int64()),
            pa.array(self.commitlog_offset, pa.int64()),
            pa.array(self.store_timestamp, _TIMESTAMP_TYPE),
            pa.array(self.born_timestamp, _TIMESTAMP_TYPE),
            pa.ListArray.from_arrays(
                pa.array(self.key_offsets, pa.int32()), pa.array(self.keys, pa.string()), type=_KEYS_TYPE
            ),
            pa.array(self.tags, pa.string()),
            pa.MapArray.from_arrays(
                pa.array(self.property_offsets, pa.int32()),
                pa.array(self.property_names, pa.string()),
                pa.array(self.property_values, pa.string()),
                type=_PROPERTIES_TYPE,
            ),
            pa.array(self.msg_id, pa.string()),
            pa.array(self.body, pa.binary()),
            pa.array(self.body_crc, pa.int32()),
            pa.array(self.reconsume_times, pa.int32()),
            pa.array(self.sysflag, pa.int32()),
        ]
        return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA).select(list(names))


@dataclass(slots=True)
class ReadStats:
    """What reading a partition did; ``skipped`` counts corrupt records passed over (on_corrupt=skip)."""

    records: int = 0
    rows: int = 0
    skipped: int = 0
    bytes_read: int = 0
    reads: int = 0


class PartitionScanner:
    """Walks one partition's records window by window, as the one cold reader reads them (``ColdQueueReader``)."""

    def __init__(
        self,
        provider: Provider,
        plan: PartitionPlan,
        options: ScanOptions,
        stats: ReadStats | None = None,
        columns: Sequence[str] = tuple(ARROW_SCHEMA.names),
    ) -> None:
        self.plan = plan
        self.options = options
        self.columns = tuple(columns)
        self.view = ArchiveView(provider, plan.layout)
        self.segment = self.view.commit_log_segment(plan.commitlog_start)
        self.stats = stats if stats is not None else ReadStats()
        self._position = plan.commitlog_start  # commit-log offset of the next record
        self._queue_offset = plan.queue_start  # the queue offset that record must hold
        records = max(1, self.view.held_count(plan.queue_start, plan.queue_end))
        mean_size = max(MIN_RECORD_SIZE, (plan.commitlog_end - plan.commitlog_start) / records)
        # A window is a block of bytes: room for twice the records of a mean size keeps the record count
        # from cutting it short, and bounds the consume-queue units a window located by them reads.
        count = 2 * math.ceil(options.read_block_bytes / mean_size)
        # Spark checks every record in full itself, so the windows' records are only located.
        window_options = ColdReadOptions(count, options.read_block_bytes, check_records=False)
        self.reader = ColdQueueReader(self.view.flat_file, window_options, count_read=self._count_read)
        # The planner found where the partition's first record lies: its first window is split from there,
        # with no consume-queue read.
        self.reader.follow = FollowPoint(plan.queue_start, plan.commitlog_start, mean_size)
        self._windows = self.reader.windows(plan.queue_start, plan.queue_end)
        self._ahead: asyncio.Future[ReadAheadBatch | LostRange] | None = None  # the next window's read
        self._buffer = b""  # the commit-log bytes of the current window
        self._starts: Int64Array = np.empty(0, dtype=np.int64)  # its records' places in them
        self._sizes: Int64Array = np.empty(0, dtype=np.int64)
        self._index = 0  # the current record's index in the window
        self._first_offset = plan.queue_start  # the queue offset of the window's first record
        self._commitlog_start = plan.commitlog_start  # the commit-log offset of the window's bytes
        self._exhausted = False
        # How many records the next run may take: a whole batch at first, so a batch is one run, not pieces to join.
        self._run_limit = max(options.batch_rows, _RUN_AFTER_ANOTHER_LAYOUT)

    @property
    def done(self) -> bool:
        return self._exhausted

    def _count_read(self, _file_type: FileType) -> None:
        self.stats.reads += 1

    async def _next_window(self) -> bool:
        """Make the next window current (stepping over lost offsets); False once the partition is read."""
        while not self._exhausted:
            ahead, self._ahead = self._ahead, None
            try:
                found = await (ahead if ahead is not None else anext(self._windows))
            except StopAsyncIteration:
                if self._position < self.plan.commitlog_end and self._queue_offset < self.plan.queue_end:
                    raise self._error(
                        "storage holds no record from here, the archive's recorded size promised "
                        f"{self.plan.commitlog_end - self._position} (was it removed by retention during the scan?)"
                    ) from None
                self._exhausted = True
                return False
            # The next window is read while this one is decoded: its GET runs in a worker thread while Spark
            # takes in the batches of this one.
            self._ahead = asyncio.ensure_future(anext(self._windows))
            await asyncio.sleep(0)
            if isinstance(found, LostRange):
                self._queue_offset = found.end
                continue
            self.stats.bytes_read += len(found.data)
            self._buffer = found.data
            self._starts = np.asarray(found.starts, dtype=np.int64)
            self._sizes = np.asarray(found.ends, dtype=np.int64) - self._starts
            self._index = 0
            self._first_offset = self._queue_offset = found.first_offset
            self._commitlog_start = found.commitlog_start
            self._position = self._commitlog_start + int(self._starts[0])
            return True
        return False

    def _step(self, records: int) -> None:
        """Go past ``records`` records of the current window."""
        self._index += records
        if self._index < len(self._starts):
            self._queue_offset = self._first_offset + self._index
            self._position = self._commitlog_start + int(self._starts[self._index])
        else:
            self._queue_offset = self._first_offset + self._index
            last = self._index - 1
            self._position = self._commitlog_start + int(self._starts[last] + self._sizes[last])

    def cancel_read_ahead(self) -> None:
        """Drop the window read ahead (the partition ends before it is needed)."""
        if self._ahead is not None:
            self._ahead.cancel()
            self._ahead = None

    def _error(self, reason: str) -> CorruptRecordError:
        return CorruptRecordError(
            f"{reason}; record of queue {self.plan.topic}/{self.plan.queue_id} at queue offset "
            f"{self._queue_offset}, commit-log offset {self._position}",
            location=self.view.object_name(self.segment),
            offset=self._position - self.segment.base_offset,
        )

    async def next_batch(self) -> pa.RecordBatch | None:
        """Up to ``batch_rows`` matching rows; None once the partition is exhausted."""
        pieces: list[pa.RecordBatch] = []
        rows = 0
        builder = ColumnBuilder()
        while rows + len(builder) < self.options.batch_rows:
            # A batch ends with its window: rows of the next one would have to be copied again to join them.
            if self._index >= len(self._starts) and (rows or builder or not await self._next_window()):
                break
            piece = self._decode_run(self.options.batch_rows - rows - len(builder))
            if piece is None:
                await self._decode_one(builder)
            elif piece.num_rows:
                # Rows keep their record order: what the row path built so far goes first.
                if builder:
                    pieces.append(builder.build(self.columns))
                    builder = ColumnBuilder()
                pieces.append(piece)
                rows += piece.num_rows
        if builder:
            pieces.append(builder.build(self.columns))
        # Rows filtered out do not count towards a batch, so an empty one means the range is done.
        batch = pieces[0] if len(pieces) == 1 else pa.concat_batches(pieces) if pieces else None
        self.stats.rows += batch.num_rows if batch is not None else 0
        return batch

    def _decode_run(self, limit: int) -> pa.RecordBatch | None:
        """The matching rows of the leading records the run path takes; None when it takes none."""
        first = self._index
        last = min(len(self._starts), first + min(limit, self._run_limit))
        starts, sizes = self._starts[first:last], self._sizes[first:last]
        run = PackedRun.at(self._buffer, starts, sizes)
        layout = Layout.of(run)
        offsets = np.arange(self._queue_offset, self._queue_offset + len(starts), dtype=np.int64)
        taken = checked_prefix(run, layout, self.plan.topic, self.plan.queue_id, offsets)
        # Runs grow while every record takes this path and start small again after one that did not, so
        # records of other layouts mixed in often cost no second look at long runs.
        self._run_limit = self._run_limit * 2 if taken == len(starts) else _RUN_AFTER_ANOTHER_LAYOUT
        if not taken:
            return None
        if taken < len(starts):
            run, layout = _rows_of(run, layout, np.arange(taken, dtype=np.int64))
        self._step(taken)
        self.stats.records += taken
        matching = self.plan.scan_filter.matches_rows(offsets[:taken], store_timestamps_of(run.heads))
        if not matching.all():
            rows = np.flatnonzero(matching)
            run, layout = _rows_of(run, layout, rows)
        return RunColumns(run, layout, self.plan.topic, self.plan.queue_id).batch(self.columns)

    async def _decode_one(self, builder: ColumnBuilder) -> None:
        """Decode (or step over, when corrupt) the current record by itself."""
        at, located = int(self._starts[self._index]), int(self._sizes[self._index])
        (size,) = _SIZE.unpack_from(self._buffer, at) if located >= _SIZE.size else (located,)
        try:
            if size < MIN_RECORD_SIZE or self._position + size > self.plan.commitlog_end:
                raise _Corrupt(
                    f"record size {size} does not fit the {self.plan.commitlog_end - self._position} "
                    "bytes left in the partition"
                )
            if size != located:
                raise _Corrupt(f"record size {size} is not the {located} bytes the consume queue gives it")
            self._decode(builder, at, size)
        except _Corrupt as corrupt:
            await self._corrupt(str(corrupt))
            return
        self._step(1)
        self.stats.records += 1

    async def _corrupt(self, reason: str) -> None:
        error = self._error(reason)
        if self.options.on_corrupt is OnCorrupt.FAIL:
            raise error
        # The size field cannot be trusted: the consume queue must place this record where it was read.
        unit = await self.view.unit(self._queue_offset)
        if unit.commitlog_offset != self._position:
            raise CorruptRecordError(
                f"{error}; the consume queue places queue offset {self._queue_offset} at commit-log offset "
                f"{unit.commitlog_offset}, so the record cannot be skipped safely"
            ) from None
        log.warning("skipping %s", error)
        self.stats.skipped += 1
        self._step(1)

    def _decode(self, builder: ColumnBuilder, at: int, size: int) -> None:
        buffer = self._buffer
        if size < _IPV4_HEADER.size + 3:
            self._decode_general(builder, at, size)
            return
        (
            total,
            magic,
            crc,
            queue_id,
            _flag,
            queue_offset,
            physical_offset,
            sysflag,
            born_timestamp,
            _born_host,
            store_timestamp,
            store_host,
            reconsume_times,
            _prepared,
            body_length,
        ) = _IPV4_HEADER.unpack_from(buffer, at)
        if magic != MAGIC_V1 or sysflag & _IPV6_BITS:
            self._decode_general(builder, at, size)
            return
        end = at + total
        body_start = at + _IPV4_HEADER.size
        if body_length < 0 or body_start + body_length + 3 > end:
            raise _Corrupt(f"body length {body_length} runs past the record end")
        topic_at = body_start + body_length
        topic_length = buffer[topic_at]
        if topic_length > 127 or topic_at + 1 + topic_length + 2 > end:
            raise _Corrupt(f"topic length {topic_length} runs past the record end")
        properties_at = topic_at + 1 + topic_length
        (properties_length,) = _PROPERTIES_LENGTH.unpack_from(buffer, properties_at)
        if properties_length < 0 or properties_at + 2 + properties_length != end:
            raise _Corrupt(f"properties length {properties_length} does not end at the record size {total}")
        body = buffer[body_start:topic_at]
        computed = body_crc(body)
        if computed != crc:
            raise _Corrupt(f"body CRC mismatch: stored {crc}, computed {computed}")
        try:
            topic = buffer[topic_at + 1 : properties_at].decode("utf-8")
        except UnicodeDecodeError as error:
            raise _Corrupt(f"topic is not UTF-8: {error.reason}") from error
        self._check_identity(topic, queue_id, queue_offset)
        if not self.plan.scan_filter.matches_row(queue_offset, store_timestamp):
            return
        builder.topic.append(topic)
        builder.queue_id.append(queue_id)
        builder.queue_offset.append(queue_offset)
        builder.commitlog_offset.append(physical_offset)
        builder.store_timestamp.append(store_timestamp * 1000)
        builder.born_timestamp.append(born_timestamp * 1000)
        properties = builder.add_properties(buffer[properties_at + 2 : end])
        unique_key = properties.get(PROPERTY_UNIQ_KEY)
        builder.msg_id.append(unique_key or (store_host + _PHYSICAL_OFFSET.pack(physical_offset)).hex().upper())
        builder.body.append(body)
        builder.body_crc.append(crc)
        builder.reconsume_times.append(reconsume_times)
        builder.sysflag.append(sysflag)

    def _decode_general(self, builder: ColumnBuilder, at: int, size: int) -> None:
        try:
            record = decode(memoryview(self._buffer)[at : at + size])
        except CorruptRecordError as error:
            raise _Corrupt(str(error).removesuffix(" at offset 0")) from error
        self._check_identity(record.topic, record.queue_id, record.queue_offset)
        if self.plan.scan_filter.matches_row(record.queue_offset, record.store_timestamp):
            builder.add_record(record)

    def _check_identity(self, topic: str, queue_id: int, queue_offset: int) -> None:
        if (topic, queue_id, queue_offset) != (self.plan.topic, self.plan.queue_id, self._queue_offset):
            raise _Corrupt(f"the record holds {topic}/{queue_id} queue offset {queue_offset}")


def _rows_of(run: PackedRun, layout: Layout, rows: npt.NDArray[np.int64]) -> tuple[PackedRun, Layout]:
    """Some records of a run, and their layout."""
    fields = {field.name: getattr(layout, field.name)[rows] for field in dataclasses.fields(Layout)}
    return PackedRun(run.data, run.starts[rows], run.sizes[rows], run.heads[rows]), Layout(**fields)


def read_partition(
    plan: PartitionPlan,
    options: ScanOptions,
    stats: ReadStats | None = None,
    columns: Sequence[str] = tuple(ARROW_SCHEMA.names),
) -> Iterator[pa.RecordBatch]:
    """Arrow batches of ``columns`` of one partition, read in this thread's event loop (``read_session``);
    ``stats`` is filled as it goes."""
    with read_session(options) as session:
        scanner = PartitionScanner(session.provider, plan, options, stats, columns)
        try:
            while (batch := session.runner.run(scanner.next_batch())) is not None:
                yield batch
        finally:
            scanner.cancel_read_ahead()
    if scanner.stats.skipped:
        log.warning(
            "tieredstore: skipped %d corrupt record(s) of %d in partition %s (on_corrupt=skip)",
            scanner.stats.skipped,
            scanner.stats.records + scanner.stats.skipped,
            plan,
        )
