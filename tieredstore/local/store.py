"""LocalMessageStore: the hot tier producers write to and the archiver reads from.

Layout is RocketMQ's: ``<dir>/commitlog/<20-digit start>``, ``<dir>/consumequeue/<topic>/<queueId>/
<20-digit start>``, ``<dir>/index/<yyyyMMddHHmmssSSS>`` (the key index, ``tieredstore.local.index_file``),
``<dir>/checkpoint``, plus ``<dir>/lock`` (one writer per directory) and
``<dir>/abort`` (present while open: finding it at open means the last run did not close cleanly).
Opened ``read_only`` it reads a RocketMQ broker's store directory without writing a byte to it.
"""

from __future__ import annotations

import functools
import itertools
import os
import shutil
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, NamedTuple, overload

import numpy as np
import numpy.typing as npt
import structlog

from tieredstore.directories import ensure_directory
from tieredstore.errors import (
    CorruptRecordError,
    InvalidPropertyError,
    InvalidQueueError,
    MessageTooLargeError,
    NotFoundError,
    StoreFullError,
    ValidationError,
)
from tieredstore.formats.arrays import IPV4_RECORD_HEAD_DTYPE, UNIT_DTYPE, gather
from tieredstore.formats.checksum import BODY_CRC_MASK, body_crc, crc32
from tieredstore.formats.consume_queue import UNIT_SIZE, ConsumeQueueUnit
from tieredstore.formats.message import (
    MAGIC_V1,
    MAGIC_V2,
    NAME_VALUE_SEPARATOR,
    POS_BORN_HOST,
    POS_PHYSICAL_OFFSET,
    PROPERTY_KEYS,
    PROPERTY_SEPARATOR,
    PROPERTY_TAGS,
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_STOREHOST_V6,
    MessageRecord,
    RecordFields,
    RecordLayout,
    decode,
    decode_properties,
    encode_properties,
    property_value,
    store_timestamp_of,
    tag_hash,
    verify_record,
)
from tieredstore.formats.naming import validate_topic
from tieredstore.local.batch import HotBatch, parse_units, read_written
from tieredstore.local.checkpoint import Checkpoint
from tieredstore.local.commit_log import CommitLog, ScanStop
from tieredstore.local.config import LocalStoreConfig, check_commit_log_file_size
from tieredstore.local.file_sizes import StoreFileSizes
from tieredstore.local.flusher import Flusher, FlushStats
from tieredstore.local.index_file import (
    HotKeyIndex,
    KeyedRecord,
    KeyEntry,
    find_records,
    put_index_keys,
    record_index_keys,
    whole_record,
)
from tieredstore.local.queue import ConsumeQueue
from tieredstore.local.store_lock import take_writer_lock

log = structlog.get_logger(__name__)

Boundary = Literal["lower", "upper"]
_OFFSET = struct.Struct(">q")
_HEAD = struct.Struct(">iI")
# Enough of a record to reach STORETIMESTAMP behind an IPv6 born host.
_TIMESTAMP_PREFIX = POS_BORN_HOST + 20 + 8
# A batched put that passed validation: topic, queue id, the topic's layout, body, record tail, tag hash,
# record size, body CRC and the keys it is indexed by.
_Batched = tuple[str, int, RecordLayout, bytes, bytes, int, int, int, tuple[str, ...]]
# How long a disk-usage look stays good: statvfs on every put would cost more than the put.
_DISK_CHECK_INTERVAL_MS = 200


def check_unit_record(raw: bytes, unit: ConsumeQueueUnit) -> bytes:
    """``raw`` if it is a whole record of the unit's size (size and magic agree); CorruptRecordError otherwise."""
    size, magic = _HEAD.unpack_from(raw) if len(raw) >= _HEAD.size else (0, 0)
    if size != unit.size or magic not in (MAGIC_V1, MAGIC_V2):
        raise CorruptRecordError(
            f"consume-queue unit says {unit.size} bytes but the record header says {size} (magic 0x{magic:08x})",
            location="commitlog",
            offset=unit.commitlog_offset,
        )
    return raw


def check_boundary(boundary: str) -> None:
    if boundary not in ("lower", "upper"):
        raise ValidationError(f"boundary must be 'lower' or 'upper', not {boundary!r}")


def search_timestamp(
    min_offset: int, max_offset: int, timestamp: int, boundary: Boundary, stamp_at: Callable[[int], int]
) -> int:
    """Binary search of non-decreasing store timestamps over [min_offset, max_offset).

    ``lower``: the first offset stored at or after ``timestamp`` (max_offset if none); ``upper``: the last
    offset stored at or before it (min_offset if none).
    """
    check_boundary(boundary)
    low, high = min_offset, max_offset
    while low < high:
        middle = (low + high) // 2
        stamp = stamp_at(middle)
        if stamp < timestamp or (boundary == "upper" and stamp == timestamp):
            low = middle + 1
        else:
            high = middle
    return low if boundary == "lower" else max(min_offset, low - 1)


class PutRequest(NamedTuple):
    """One message of a batch for ``put_messages`` (a named tuple: cheap to build by the thousand)."""

    topic: str
    queue_id: int
    body: bytes
    keys: Sequence[str] = ()
    tags: str | None = None
    properties: Mapping[str, str] | None = None


class PutResult(NamedTuple):
    """Where a put landed (a named tuple: one is built per put, and a frozen dataclass costs 4x as much)."""

    topic: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    size: int
    store_timestamp: int


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


_TAGS_NAME = (PROPERTY_TAGS + NAME_VALUE_SEPARATOR).encode()


@functools.lru_cache(maxsize=1024)
def _restore_tag_hash(tags: str | None) -> int:
    """``tag_hash`` remembered: a topic's messages carry few distinct tags, and the hash is a loop per character."""
    return tag_hash(tags)


class StoredMessage(NamedTuple):
    """One message as the archiver moves it: its queue offset, the record bytes and its consume-queue unit."""

    queue_offset: int
    raw: bytes
    unit: ConsumeQueueUnit


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What open found and repaired. ``clean`` means the checkpoint was trusted and nothing was scanned."""

    clean: bool
    scanned_from: int
    valid_end: int
    records_scanned: int = 0
    stop_reason: str | None = None
    bytes_cleared: int = 0
    files_removed: list[str] = field(default_factory=list)
    queue_units_dropped: int = 0
    queue_units_rebuilt: int = 0
    seconds: float = 0.0

    @property
    def repaired(self) -> bool:
        """Whether anything on disk was wrong: a torn tail, stray files or consume queues out of step

        (units dropped past the checkpoint and rewritten identically from the commit log are not a repair).
        """
        return bool(
            self.stop_reason
            or self.bytes_cleared
            or self.files_removed
            or self.queue_units_dropped != self.queue_units_rebuilt
        )


@dataclass(frozen=True, slots=True)
class RetentionReport:
    """What ``delete_expired`` removed."""

    commit_log_files: list[str]
    consume_queue_files: int
    commitlog_min_offset: int
    index_files: list[str] = field(default_factory=list)


class LocalMessageStore:
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
        # fault in a fresh 16 MiB buffer per batch (measured: that was ~15% of a 1M-message restore).
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

    # ----------------------------------------------------------------- open, recovery, close

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

    def _load_queues(self) -> None:
        base = self.root / "consumequeue"
        if not base.is_dir():
            return
        for topic_dir in sorted(base.iterdir()):
            try:
                validate_topic(topic_dir.name)
            except ValidationError:
                log.warning("ignoring a consume-queue folder that is not a topic", path=str(topic_dir))
                continue
            for queue_dir in sorted(topic_dir.iterdir()):
                if not queue_dir.name.isdigit():
                    continue
                queue = ConsumeQueue.load(
                    topic_dir.name,
                    int(queue_dir.name),
                    queue_dir,
                    file_size=self.file_sizes.consume_queue,
                    writable=not self.read_only,
                )
                self._queues[(queue.topic, queue.queue_id)] = queue

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

    def _recover(self) -> RecoveryReport:
        started = time.monotonic()
        log_ = self._commit_log
        data_end = log_.files[-1].end_offset if log_.files else log_.write_offset
        checkpoint = Checkpoint.read(self.root / "checkpoint")
        if not self.read_only and checkpoint is not None and not (self.root / "abort").exists():
            end = checkpoint.confirmed_offset
            if self._clean_end_is_consistent(end, data_end):
                log_.write_offset = log_.flushed_offset = end
                if not self._key_index.existed:
                    self._key_index.reindex(log_.scan(log_.min_offset), end)
                return RecoveryReport(clean=True, scanned_from=end, valid_end=end, seconds=time.monotonic() - started)
        if not log_.files and not self._queues:
            return RecoveryReport(clean=True, scanned_from=0, valid_end=0, seconds=time.monotonic() - started)
        start = self._recovery_start(checkpoint, data_end)
        if not self.read_only:
            # Items of records from ``start`` on are re-added by the scan below; a torn index file is
            # rebuilt from the commit log up to there first.
            rescan = log_.min_offset if not self._key_index.existed else self._key_index.recover(start)
            self._key_index.reindex(log_.scan(max(rescan, log_.min_offset)), start)
        # Rewound, not cleared: the units rebuilt below overwrite the old ones in place, and only what lies
        # past the rebuilt end is zeroed at the end, so a follower never sees a sound unit vanish.
        dropped = sum(q.rewind_to(q.lower_bound(start)) for q in self._queues.values())
        scanned = 0
        stop = ScanStop(start, None)
        for item in log_.scan(start):
            if isinstance(item, ScanStop):
                stop = item
                break
            offset, size, record = item
            problem = self._unacceptable(record, allow_rebase=self.read_only or start == log_.min_offset)
            if problem is None and not self.read_only:
                problem = self._torn_properties(offset, size, record)
            if problem is not None:
                stop = ScanStop(offset, problem)
                break
            queue = self._queue(record.topic, record.queue_id)
            try:
                queue.append(ConsumeQueueUnit(offset, size, tag_hash(record.tags)), record.queue_offset)
            except CorruptRecordError as exc:
                stop = ScanStop(offset, str(exc))
                break
            self._last_store_timestamp = max(self._last_store_timestamp, record.store_timestamp)
            if not self.read_only:
                self._key_index.add(record.topic, record_index_keys(record), offset, record.store_timestamp)
            scanned += 1
        cleared, removed = 0, list[str]()
        if self.read_only:
            log_.write_offset = log_.flushed_offset = stop.offset
        else:
            for queue in self._queues.values():
                queue.clear_past_end()  # units past the rebuilt end point at bytes truncated next
            cleared, removed = log_.truncate(stop.offset)
            for queue in self._queues.values():
                queue.flush()
            self._write_checkpoint(stop.offset)
        report = RecoveryReport(
            clean=False,
            scanned_from=start,
            valid_end=stop.offset,
            records_scanned=scanned,
            stop_reason=stop.reason,
            bytes_cleared=cleared,
            files_removed=removed,
            queue_units_dropped=dropped,
            queue_units_rebuilt=scanned,
            seconds=time.monotonic() - started,
        )
        if report.repaired:
            log.warning("hot store repaired", **{k: getattr(report, k) for k in report.__slots__})
        return report

    def _unacceptable(self, record: MessageRecord, *, allow_rebase: bool) -> str | None:
        """Why a record that decoded cleanly still cannot be ours (header bits the CRC does not cover)."""
        try:
            validate_topic(record.topic)
        except ValidationError as exc:
            return f"record names an invalid topic: {exc}"
        if record.queue_id < 0 or (not self.read_only and record.queue_id >= self.config.max_queues_per_topic):
            return f"record names queue id {record.queue_id}, outside 0..{self.config.max_queues_per_topic - 1}"
        queue = self._queues.get((record.topic, record.queue_id))
        expected = queue.max_offset if queue is not None else 0
        if record.queue_offset != expected and not (allow_rebase and (queue is None or queue.max_offset == 0)):
            return f"record has queue offset {record.queue_offset}, its queue expects {expected}"
        return None

    def _torn_properties(self, offset: int, size: int, record: MessageRecord) -> str | None:
        """Our writer ends every property block in 0x02; a zeroed tail (a torn page) would not.

        Properties are outside the body CRC, so without this a record whose last page never reached
        the disk would be served with its KEYS and TAGS silently gone.
        """
        file = self._commit_log.file_for(offset)
        assert file is not None
        local = offset - file.start_offset
        props_len_at = (
            POS_BORN_HOST
            + (20 if record.born_host.is_ipv6 else 8)
            + 8
            + (20 if record.store_host.is_ipv6 else 8)
            + 16
            + len(record.body)
            + (2 if record.magic == MAGIC_V2 else 1)
            + len(record.topic.encode("utf-8"))
        )
        (props_len,) = struct.unpack_from(">h", file.buffer, local + props_len_at)
        if props_len and file.buffer[local + size - 1] != 0x02:
            return "record's properties do not end in the 0x02 separator (a torn tail)"
        return None

    def _clean_end_is_consistent(self, end: int, data_end: int) -> bool:
        """After a clean close the checkpoint holds the exact end; check it against the files cheaply."""
        log_ = self._commit_log
        if not log_.files:
            return end == log_.write_offset == 0 or not (self.root / "commitlog").exists()
        if not log_.min_offset <= end <= data_end:
            return False
        file = log_.file_for(end)
        if file is not None and file.size - (end - file.start_offset) >= _HEAD.size:
            size, magic = _HEAD.unpack_from(file.buffer, end - file.start_offset)
            if size or magic:
                return False
        for queue in self._queues.values():
            if queue.max_offset > queue.min_offset:
                offset, size = queue.commitlog_position_at(queue.max_offset - 1)
                if offset + size > end:
                    return False
        return True

    def _recovery_start(self, checkpoint: Checkpoint | None, data_end: int) -> int:
        log_ = self._commit_log
        if not self.read_only:
            if checkpoint is not None and log_.min_offset <= checkpoint.confirmed_offset <= data_end:
                return checkpoint.confirmed_offset
            return log_.min_offset
        # A broker's consume queues are trusted up to the last unit that points at a valid record.
        best_end = log_.min_offset
        for queue in self._queues.values():
            if queue.max_offset > queue.min_offset:
                offset, size = queue.commitlog_position_at(queue.max_offset - 1)
                if offset + size > best_end and self._valid_record_at(offset, size):
                    best_end = offset + size
        return best_end

    def _valid_record_at(self, offset: int, size: int) -> bool:
        file = self._commit_log.file_for(offset)
        if file is None or offset + size > file.end_offset:
            return False
        try:
            with memoryview(file.buffer) as view:
                record = decode(view[: offset - file.start_offset + size], offset - file.start_offset)
        except CorruptRecordError:
            return False
        return record.physical_offset == offset

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

    @property
    def flush_stats(self) -> FlushStats:
        """Commit-log syncs done and sync puts served: their ratio is what group commit saves."""
        return self._flusher.stats if self._flusher else FlushStats()

    # ----------------------------------------------------------------- puts

    def put_message(
        self,
        topic: str,
        queue_id: int,
        body: bytes,
        keys: Sequence[str] = (),
        tags: str | None = None,
        properties: Mapping[str, str] | None = None,
    ) -> PutResult:
        """Append one message; under sync flush it returns only once the message is on disk."""
        layout = self._layouts.get(topic) if type(topic) is str else None
        # The common case is checked inline (a known topic, an int queue id in range, bytes within the
        # size limit, no properties); anything else gets every rule, and its error, from _validated.
        if (
            layout is None
            or type(queue_id) is not int
            or type(body) is not bytes
            or keys
            or tags is not None
            or properties
            or not 0 <= queue_id < self._max_queues
            or len(body) > self._max_message_size
        ):
            layout, body, tail, tag_code = self._validated(topic, queue_id, body, keys, tags, properties)
            index_keys = put_index_keys(keys, properties)
        else:
            tail, tag_code, index_keys = layout.empty_tail, 0, ()
        result = self._append(topic, queue_id, layout, body, tail, tag_code, index_keys)
        if self._sync_flusher is not None:
            self._sync_flusher.wait_durable(result.commitlog_offset + result.size)
        return result

    def put_messages(self, requests: Iterable[PutRequest]) -> list[PutResult]:
        """Append a batch atomically with respect to validation and the disk guard: all or nothing."""
        layouts, max_queues, max_size = self._layouts, self._max_queues, self._max_message_size
        batch: list[_Batched] = []
        total = 0
        for topic, queue_id, body, keys, tags, properties in requests:
            layout = layouts.get(topic) if type(topic) is str else None
            # As in put_message: the common case inline, anything else through every rule.
            if (
                layout is None
                or type(queue_id) is not int
                or type(body) is not bytes
                or keys
                or tags is not None
                or properties
                or not 0 <= queue_id < max_queues
                or len(body) > max_size
            ):
                layout, body, tail, tag_code = self._validated(topic, queue_id, body, keys, tags, properties)
                index_keys = put_index_keys(keys, properties)
            else:
                tail, tag_code, index_keys = layout.empty_tail, 0, ()
            size = layout.fixed_size + len(body) + len(tail)
            total += size
            batch.append((topic, queue_id, layout, body, tail, tag_code, size, body_crc(body), index_keys))
        if not batch:
            return []
        results = self._append_batch(batch, total)
        if self._sync_flusher is not None:
            last = results[-1]
            self._sync_flusher.wait_durable(last.commitlog_offset + last.size)
        return results

    def _validated(
        self,
        topic: str,
        queue_id: int,
        body: bytes,
        keys: Sequence[str],
        tags: str | None,
        properties: Mapping[str, str] | None,
    ) -> tuple[RecordLayout, bytes, bytes, int]:
        """Check one message against every rule: (layout of its topic, body, record tail, tag hash)."""
        layout = self._layouts.get(topic) if type(topic) is str else None
        if layout is None:
            layout = self._layout_for(topic)
        if type(queue_id) is not int or not 0 <= queue_id < self._max_queues:
            _check_queue_id(queue_id, self._max_queues)
        if type(body) is not bytes:
            if not isinstance(body, bytes | bytearray | memoryview):
                raise ValidationError(f"message body must be bytes, not {type(body).__name__}")
            body = bytes(body)
        if len(body) > self._max_message_size:
            raise MessageTooLargeError(
                f"message body is {len(body)} bytes; max_message_size is {self._max_message_size}"
            )
        if not keys and tags is None and not properties:
            return layout, body, layout.empty_tail, 0
        properties_raw, tags_value = _encode_message_properties(keys, tags, properties)
        return layout, body, layout.tail(properties_raw), tag_hash(tags_value)

    def _layout_for(self, topic: str) -> RecordLayout:
        validate_topic(topic)
        topic_raw = topic.encode("ascii")
        layout = RecordLayout(topic_raw, born_host=self._store_host, store_host=self._store_host)
        if type(topic) is str:
            self._layouts[topic] = layout
        return layout

    def _append(
        self,
        topic: str,
        queue_id: int,
        layout: RecordLayout,
        body: bytes,
        tail: bytes,
        tag_code: int,
        index_keys: tuple[str, ...],
    ) -> PutResult:
        """Write one validated record and its unit under the put lock; the common case touches no file metadata."""
        body_size = len(body)
        size = layout.fixed_size + body_size + len(tail)
        crc = body_crc(body)
        now = int(time.time() * 1000)
        log_ = self._commit_log
        with self._put_lock:
            if self._put_refusal is not None:
                raise ValidationError(self._put_refusal)
            if self._disk_cap is not None or not self._disk_checked_ms <= now < self._disk_ok_until:
                self._check_disk(size + UNIT_SIZE, now)
            queue = self._queues.get((topic, queue_id)) or self._queue(topic, queue_id)
            offset = log_.write_offset
            if (
                log_.tail_start <= offset
                and offset + size <= log_.tail_limit
                and (queue.max_offset + 1) * UNIT_SIZE <= queue.ready_upto
            ):
                buffer = log_.tail_buffer
                position = offset - log_.tail_start
            else:
                offset = self._make_room([size], {queue: 1})[0]
                file = log_.file_for(offset)
                assert file is not None
                buffer, position = file.buffer, offset - file.start_offset
            store_timestamp = self._last_store_timestamp
            if now > store_timestamp:
                store_timestamp = self._last_store_timestamp = now
            layout.fixed.pack_into(
                buffer, position, size, layout.magic, crc, queue_id, 0, queue.max_offset, offset,
                layout.sysflag, now, layout.born_raw, store_timestamp, layout.store_raw, 0, 0, body_size,
            )  # fmt: skip
            body_at = position + layout.fixed_size
            buffer[body_at : body_at + body_size] = body
            buffer[body_at + body_size : position + size] = tail
            end = offset + size
            # Publish the record before the unit that points at it: a reader holding a unit can read it.
            log_.write_offset = end
            queue_offset = queue.append_unit(offset, size, tag_code)
            if index_keys:
                # Before the dispatched offset moves: a flush that covers the record covers its keys.
                self._pending_keys.append((topic, index_keys, offset, store_timestamp))
            self._dispatched_offset = end
            self._unit_count += 1
        return PutResult(topic, queue_id, queue_offset, offset, size, store_timestamp)

    def _append_batch(self, batch: list[_Batched], total: int) -> list[PutResult]:
        """Write validated records of ``total`` bytes and their units under one put lock, reserving room once."""
        now = int(time.time() * 1000)
        log_ = self._commit_log
        with self._put_lock:
            if self._put_refusal is not None:
                raise ValidationError(self._put_refusal)
            if self._disk_cap is not None or not self._disk_checked_ms <= now < self._disk_ok_until:
                self._check_disk(total + UNIT_SIZE * len(batch), now)
            queues = self._queues
            targets = [queues.get((item[0], item[1])) or self._queue(item[0], item[1]) for item in batch]
            per_queue = Counter(targets)
            offset = log_.write_offset
            contiguous = (
                log_.tail_start <= offset
                and offset + total <= log_.tail_limit
                and all(queue.room_for(count) for queue, count in per_queue.items())
            )
            positions = None if contiguous else self._make_room([item[6] for item in batch], per_queue)
            store_timestamp = self._last_store_timestamp
            if now > store_timestamp:
                store_timestamp = self._last_store_timestamp = now
            units: dict[ConsumeQueue, list[tuple[int, int, int]]] = {queue: [] for queue in per_queue}
            results: list[PutResult] = []
            parts: list[bytes] = []
            keyed: list[KeyEntry] = []
            record_offset = offset
            for (topic, queue_id, layout, body, tail, tag_code, size, crc, index_keys), queue in zip(
                batch, targets, strict=True
            ):
                if positions is not None:
                    record_offset = positions[len(results)]
                queue_units = units[queue]
                queue_offset = queue.max_offset + len(queue_units)
                queue_units.append((record_offset, size, tag_code))
                header = layout.fixed.pack(
                    size, layout.magic, crc, queue_id, 0, queue_offset, record_offset, layout.sysflag, now,
                    layout.born_raw, store_timestamp, layout.store_raw, 0, 0, len(body),
                )  # fmt: skip
                if positions is None:
                    parts += (header, body, tail)
                else:
                    log_.write(record_offset, b"".join((header, body, tail)))
                results.append(PutResult(topic, queue_id, queue_offset, record_offset, size, store_timestamp))
                if index_keys:
                    keyed.append((topic, index_keys, record_offset, store_timestamp))
                record_offset += size
            if positions is None:
                position = offset - log_.tail_start
                log_.tail_buffer[position : position + total] = b"".join(parts)
            end = results[-1].commitlog_offset + results[-1].size
            # As in _append: records are published before the units that point at them.
            log_.write_offset = end
            for queue, queue_units in units.items():
                queue.append_units(queue_units)
            if keyed:
                self._pending_keys += keyed
            self._dispatched_offset = end
            self._unit_count += len(batch)
        return results

    def _make_room(self, sizes: list[int], per_queue: Mapping[ConsumeQueue, int]) -> list[int]:
        """Create and reserve every file the records and units need, then write the blanks; their offsets.

        All reservations come before any byte is written, so a StoreFullError leaves the data untouched.
        """
        log_ = self._commit_log
        plan = log_.plan(sizes)
        log_.prepare(plan)
        for queue, count in per_queue.items():
            queue.prepare(count)
        for blank_offset, blank_size in plan.blanks:
            log_.write_blank(blank_offset, blank_size)
        return plan.positions

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
        if isinstance(queue_id, bool) or not isinstance(queue_id, int) or queue_id < 0:
            raise InvalidQueueError(f"queue id must be a non-negative integer, not {queue_id!r}")
        if queue_id >= self.config.max_queues_per_topic:
            limit = self.config.max_queues_per_topic
            raise InvalidQueueError(f"queue id {queue_id} is outside 0..{limit - 1} (max_queues_per_topic={limit})")
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

        The fixed-position fields of all records are gathered and compared together; only the body
        CRC (formats.checksum) and a TAGS lookup are per record. A record the batch check cannot prove sound goes
        through ``_restorable_one``, which raises the error it deserves (or accepts a layout the
        batch check does not take the short way, such as IPv6 hosts).
        """
        topic_raw = topic.encode("utf-8")
        count = len(record_sizes)
        sizes = np.array(record_sizes, dtype=np.int64)
        starts = np.zeros(count, dtype=np.int64)
        np.cumsum(sizes[:-1], out=starts[1:])
        flat = np.frombuffer(data, dtype=np.uint8)
        heads = gather(flat, starts, IPV4_RECORD_HEAD_DTYPE)
        magic = heads["magic"]
        v2 = magic == MAGIC_V2
        suspect = (
            (sizes < IPV4_RECORD_HEAD_DTYPE.itemsize) | (heads["total_size"] != sizes) | ((magic != MAGIC_V1) & ~v2)
        )
        # The short way takes IPv4 hosts only (the writer's own layout): BODYLEN at a fixed position.
        suspect |= (heads["sysflag"] & (SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6)) != 0
        suspect |= heads["queue_id"] != queue_id
        body_len = heads["body_len"].astype(np.int64)
        suspect |= (body_len < 0) | (body_len > self.config.max_message_size)
        topic_len_at = IPV4_RECORD_HEAD_DTYPE.itemsize + body_len
        topic_at = topic_len_at + np.where(v2, 2, 1)
        tail_at = topic_at + len(topic_raw)
        suspect |= tail_at + 2 > sizes
        # Past the body, only records whose fields lie inside them are read (suspects read position 0).
        sound = ~suspect
        topic_len = np.where(
            v2,
            gather(flat, np.where(sound, starts + topic_len_at, 0), np.dtype(">i2")).astype(np.int64),
            gather(flat, np.where(sound, starts + topic_len_at, 0), np.dtype("i1")).astype(np.int64),
        )
        suspect |= topic_len != len(topic_raw)
        if topic_raw:
            topics = gather(flat, np.where(sound, starts + topic_at, 0), np.dtype(f"V{len(topic_raw)}"))
            suspect |= topics != np.void(topic_raw)
        props_len = gather(flat, np.where(sound, starts + tail_at, 0), np.dtype(">i2")).astype(np.int64)
        suspect |= (props_len < 0) | (tail_at + 2 + props_len != sizes)
        del flat
        body_ats = (starts + IPV4_RECORD_HEAD_DTYPE.itemsize).tolist()
        # A suspect's body may run anywhere: its CRC is taken by the per-record check.
        body_ends = (starts + IPV4_RECORD_HEAD_DTYPE.itemsize + np.where(suspect, 0, body_len)).tolist()
        with memoryview(data) as view:
            computed = [crc32(view[begin:end]) for begin, end in zip(body_ats, body_ends, strict=True)]
        suspect |= (np.array(computed, dtype=np.int64) & BODY_CRC_MASK) != heads["body_crc"]
        queue_offsets = heads["queue_offset"].astype(np.int64)
        stamps = heads["store_timestamp"].astype(np.int64)
        tag_hashes = np.zeros(count, dtype=np.int64)
        ends = (starts + sizes).tolist()
        # In order, so that the first broken record is the one reported.
        for index in np.flatnonzero(suspect).tolist():
            # Raises for a broken record; a sound one of another layout comes back with its fields.
            raw = bytes(data[ends[index] - record_sizes[index] : ends[index]])
            fields = self._restorable_one(topic, topic_raw, queue_id, raw)
            queue_offsets[index], stamps[index] = fields.queue_offset, fields.store_timestamp
            tag_hashes[index] = _restore_tag_hash(property_value(raw, fields, PROPERTY_TAGS))
        props_ats = (starts + tail_at + 2).tolist()
        for index in np.flatnonzero(~suspect & (props_len >= len(_TAGS_NAME))).tolist():
            if data.find(_TAGS_NAME, props_ats[index], ends[index]) >= 0:
                properties = bytes(data[props_ats[index] : ends[index]])
                tag_hashes[index] = _restore_tag_hash(decode_properties(properties).get(PROPERTY_TAGS))
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
        # As in _put: records are published before the units that point at them.
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

    def _check_disk(self, incoming: int, now_ms: int | None = None) -> None:
        cap = self.config.hot_disk_max_bytes
        if cap is not None:
            held = self._commit_log.write_offset - self._commit_log.min_offset + self._unit_count * UNIT_SIZE
            if held + incoming > cap:
                raise StoreFullError(
                    f"the hot store holds {held} bytes and this put adds {incoming}; hot_disk_max_bytes is {cap}"
                )
        now = int(time.time() * 1000) if now_ms is None else now_ms
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

    # ----------------------------------------------------------------- reads

    def queues(self) -> list[tuple[str, int]]:
        """Every (topic, queue id) that holds or held messages, sorted."""
        return sorted(key for key, q in list(self._queues.items()) if q.max_offset > 0)

    def min_offset(self, topic: str, queue_id: int) -> int:
        """The first queue offset still in the hot store (0 for a queue never written)."""
        queue = self._existing_queue(topic, queue_id)
        return queue.min_offset if queue else 0

    def max_offset(self, topic: str, queue_id: int) -> int:
        """The offset the next message of this queue will get (0 for a queue never written)."""
        queue = self._existing_queue(topic, queue_id)
        return queue.max_offset if queue else 0

    def durable_max_offset(self, topic: str, queue_id: int) -> int:
        """One past the last message whose record is flushed (0 for a queue never written): what a machine
        crash cannot take back, so all the archiver may take (see ``tieredstore.local.durable``)."""
        queue = self._existing_queue(topic, queue_id)
        if queue is None:
            return 0
        return queue.durable_end.find(
            self._commit_log.flushed_offset, queue.min_offset, queue.max_offset, queue.commitlog_position_at
        )

    def flush_queue(self, topic: str, queue_id: int) -> int:
        """Make the queue's messages written so far durable now; returns its ``durable_max_offset``.

        One commit-log sync up to the queue's last record, shared with sync puts and other callers (group
        commit). Its consume queue and the checkpoint wait for the periodic flush: recovery rebuilds the
        units past the checkpoint from the commit log, so a crash does not need them.
        """
        queue = self._existing_queue(topic, queue_id)
        if queue is None:
            return 0
        end = queue.max_offset
        if self._flusher is not None and end > queue.min_offset:
            offset, size = queue.commitlog_position_at(end - 1)
            if self._commit_log.flushed_offset < offset + size:
                self._flusher.wait_durable(offset + size)
        return self.durable_max_offset(topic, queue_id)

    @property
    def commitlog_min_offset(self) -> int:
        return self._commit_log.min_offset

    @property
    def commitlog_max_offset(self) -> int:
        """End of the valid commit-log data: the offset the next record is written at (or its file's start)."""
        return self._commit_log.write_offset

    @property
    def commitlog_flushed_offset(self) -> int:
        return self._commit_log.flushed_offset

    def release_pages(self, below: int) -> int:
        """Unmap this process's pages of the commit log below ``below``: a reader that is done with
        those bytes (the archiver, below every queue's next unread record) tells the kernel so.

        The bytes stay on disk and in the page cache, and a later read maps them again; without this a
        process that reads the whole hot store once keeps every page of it in its RSS (as mapped file
        pages) until the files are deleted. Only flushed bytes are released here. Returns the bytes
        newly released.
        """
        return self._commit_log.release_pages_below(min(below, self._commit_log.flushed_offset))

    def _existing_queue(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        validate_topic(topic)
        if isinstance(queue_id, bool) or not isinstance(queue_id, int) or queue_id < 0:
            raise InvalidQueueError(f"queue id must be a non-negative integer, not {queue_id!r}")
        return self._queues.get((topic, queue_id))

    def _require_queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        queue = self._existing_queue(topic, queue_id)
        if queue is None:
            raise NotFoundError(f"queue {topic}/{queue_id} holds no messages in the hot store")
        return queue

    def cq_unit(self, topic: str, queue_id: int, queue_offset: int) -> ConsumeQueueUnit:
        """The consume-queue unit at ``queue_offset``; NotFoundError outside [min_offset, max_offset)."""
        return self._require_queue(topic, queue_id).unit_at(queue_offset)

    def read_record(self, unit: ConsumeQueueUnit) -> bytes:
        """The record bytes a unit points at, checked to be a whole record of the unit's size."""
        return check_unit_record(self._commit_log.read(unit.commitlog_offset, unit.size), unit)

    def read_messages(
        self, topic: str, queue_id: int, queue_offset: int, max_count: int = 32, max_bytes: int = 4 << 20
    ) -> list[StoredMessage]:
        """Consecutive messages from ``queue_offset``: at most ``max_count``, and stopping before ``max_bytes``
        except that the first message is always returned, however large.

        An offset at or past max_offset gives an empty list; one below min_offset is a NotFoundError.
        """
        queue = self._existing_queue(topic, queue_id)
        if queue is None:
            return []
        if queue_offset < queue.min_offset:
            raise NotFoundError(
                f"offset {queue_offset} of {topic}/{queue_id} is below the hot store's min offset {queue.min_offset}"
            )
        messages: list[StoredMessage] = []
        total = 0
        for offset, unit in queue.units(queue_offset, max_count):
            if messages and total + unit.size > max_bytes:
                break
            messages.append(StoredMessage(offset, self.read_record(unit), unit))
            total += unit.size
        return messages

    def read_batch(
        self,
        topic: str,
        queue_id: int,
        queue_offset: int,
        max_count: int = 32,
        max_bytes: int = 4 << 20,
        *,
        unmap: bool = False,
    ) -> HotBatch:
        """The messages ``read_messages`` gives, as one HotBatch: records joined in one buffer, units in
        one array, checked all at once (see ``tieredstore.local.batch``).

        ``unmap`` is for a reader that reads each record once (the archiver): the (flushed) commit-log
        pages the batch was copied from are unmapped from this process as the copy goes, so reading a
        queue among many does not map the whole stretch of commit log its records are spread over.
        """
        queue = self._existing_queue(topic, queue_id)
        if queue is None:
            return HotBatch.empty(topic, queue_id, queue_offset)
        if queue_offset < queue.min_offset:
            raise NotFoundError(
                f"offset {queue_offset} of {topic}/{queue_id} is below the hot store's min offset {queue.min_offset}"
            )
        units = parse_units(queue.unit_bytes(queue_offset, max_count), max_bytes)
        return read_written(self._commit_log, topic, queue_id, queue_offset, units, unmap=unmap)

    def get_message(self, topic: str, queue_id: int, queue_offset: int) -> MessageRecord:
        """The decoded message at ``queue_offset`` (body CRC checked)."""
        unit = self.cq_unit(topic, queue_id, queue_offset)
        return decode(self.read_record(unit), location=f"commitlog@{unit.commitlog_offset}")

    def store_timestamp(self, topic: str, queue_id: int, queue_offset: int) -> int:
        return self._store_timestamp_of(self.cq_unit(topic, queue_id, queue_offset))

    def _store_timestamp_of(self, unit: ConsumeQueueUnit) -> int:
        head = self._commit_log.read(unit.commitlog_offset, min(unit.size, _TIMESTAMP_PREFIX))
        return store_timestamp_of(head)

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp: int, boundary: Boundary = "lower") -> int:
        """``lower``: the first offset stored at or after ``timestamp`` (max_offset if none);
        ``upper``: the last offset stored at or before it (min_offset if none). Store timestamps never decrease.
        """
        check_boundary(boundary)
        queue = self._existing_queue(topic, queue_id)
        if queue is None:
            return 0
        return search_timestamp(
            queue.min_offset,
            queue.max_offset,
            timestamp,
            boundary,
            lambda offset: self._store_timestamp_of(queue.unit_at(offset)),
        )

    def query_keys(
        self, topic: str, key: str, max_count: int = 32, begin_timestamp: int = 0, end_timestamp: int = (1 << 63) - 1
    ) -> list[KeyedRecord]:
        """Messages still in the hot store whose KEYS or UNIQ_KEY include ``key``, stored in [begin, end],
        newest first, at most ``max_count``; found through the key index under ``index/``."""
        validate_topic(topic)
        if not self.read_only:
            self._index_pending()  # the keys of every put that returned are found at once
        return find_records(self._key_index, topic, key, max_count, begin_timestamp, end_timestamp, self._record_at)

    def record_at(self, commitlog_offset: int) -> bytes:
        """The whole record starting at ``commitlog_offset``, in whichever commit-log file holds it (its header
        gives its size); NotFoundError when no record of the hot store starts there."""
        raw = self._record_at(commitlog_offset)
        if raw is None:
            raise NotFoundError(f"no record starts at hot commit-log offset {commitlog_offset}")
        return raw

    def _record_at(self, commitlog_offset: int) -> bytes | None:
        """The whole record starting at ``commitlog_offset``; None when no record of the hot store is there."""
        return whole_record(self._read_or_none, commitlog_offset)

    def _read_or_none(self, offset: int, size: int) -> bytes | None:
        try:
            return self._commit_log.read(offset, size)
        except NotFoundError:
            return None

    def offset_msg_id(self, commitlog_offset: int) -> str:
        """RocketMQ's offset message id of a record this store wrote."""
        return (self._store_host.encode() + _OFFSET.pack(commitlog_offset)).hex().upper()

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
        now = int(time.time() * 1000) if now_ms is None else now_ms
        horizon = now - int(self.config.hot_retention_hours * 3_600_000)
        log_ = self._commit_log
        removed: list[str] = []
        while len(log_.files) > 1:
            file, successor = log_.files[0], log_.files[1]
            if successor.start_offset >= self._dispatched_offset:
                break
            head = successor.read(0, _TIMESTAMP_PREFIX)
            if _HEAD.unpack_from(head)[1] not in (MAGIC_V1, MAGIC_V2) or store_timestamp_of(head) > horizon:
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


def _check_queue_id(queue_id: object, limit: int) -> None:
    """Raise the InvalidQueueError that ``queue_id`` deserves, if any."""
    if isinstance(queue_id, bool) or not isinstance(queue_id, int):
        raise InvalidQueueError(f"queue id must be an integer, not {type(queue_id).__name__}")
    if not 0 <= queue_id < limit:
        raise InvalidQueueError(f"queue id {queue_id} is outside 0..{limit - 1} (max_queues_per_topic={limit})")


def _encode_message_properties(
    keys: Sequence[str], tags: str | None, properties: Mapping[str, str] | None
) -> tuple[bytes, str | None]:
    """The PROPERTIES bytes of a put and its TAGS value; every rule broken is an InvalidPropertyError."""
    if not keys and tags is None and not properties:
        return b"", None
    merged: dict[str, str] = {}
    for name, value in (properties or {}).items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise InvalidPropertyError(f"property names and values must be strings, not {name!r}: {value!r}")
        if not name:
            raise InvalidPropertyError("a property name must not be empty")
        merged[name] = value
    if isinstance(keys, str):
        keys = [keys]
    if keys:
        if PROPERTY_KEYS in merged:
            raise InvalidPropertyError("message keys were given both as keys= and as property KEYS")
        for key in keys:
            if not isinstance(key, str) or not key or " " in key:
                raise InvalidPropertyError(
                    f"message key {key!r} must be a non-empty string without spaces (KEYS is space separated)"
                )
            if NAME_VALUE_SEPARATOR in key or PROPERTY_SEPARATOR in key:
                raise InvalidPropertyError(f"message key {key!r} contains a separator byte (0x01 or 0x02)")
        merged[PROPERTY_KEYS] = " ".join(keys)
    if tags is not None:
        if PROPERTY_TAGS in merged:
            raise InvalidPropertyError("tags were given both as tags= and as property TAGS")
        if not isinstance(tags, str) or not tags:
            raise InvalidPropertyError(f"tags must be a non-empty string, not {tags!r}")
        merged[PROPERTY_TAGS] = tags
    return encode_properties(merged), merged.get(PROPERTY_TAGS)
