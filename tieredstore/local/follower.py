"""HotStoreFollower: reads a hot store that another process writes, following it as it grows and shrinks.

The archiver runs as its own process (``tieredstore run``) next to the producer applications that own
the hot store. The writer holds the directory's lock; a follower never takes it and never writes a
byte into the directory. It maps the writer's consume-queue and commit-log files read-only and
follows them:

* **growth**: a queue's end is found by reading units past the last one known; new consume-queue and
  commit-log files are picked up when a unit needs them; new queues are found by listing
  ``consumequeue/`` at most every ``refresh_interval`` seconds;
* **retention**: files the writer deleted are unmapped at the next listing, the commit log's min
  offset moves to its first remaining file and each queue's min offset to its first unit at or
  after it; an offset whose file vanished reads as below the min offset (NotFoundError), never as
  a crash;
* **writer restarts**: a file the writer's recovery replaced (another inode) is mapped again;
* **an early start**: a directory holding no commit log yet is followed as an empty store;
* **queues without consume-queue files** (a store copied without ``consumequeue/``): their units are
  rebuilt from the flushed commit log in memory (``tieredstore.local.commit_log_dispatch``), from where
  the other queues' units end.

A unit is served only once the record it points at checks out: magic, TOTALSIZE equal to the unit's
size, PHYSICALOFFSET equal to the unit's offset, topic, queue id and queue offset of this queue, a
properties block that ends where the record ends (in 0x02 when present) and the body CRC. The writer
publishes a record before its unit, but a zero unit, or one whose record does not check out yet, is
simply the end of the queue for now; the next call looks again.

Durability: a follower reads the page cache, so it serves records the writer has written but not yet
fsynced (under async flush, up to ``flush_interval`` of them). A machine crash can take those back,
so the archiver takes only what ``durable_max_offset`` gives: the messages the checkpoint the writer
wrote at its last flush says are flushed (re-read at every listing). That is ours, or a RocketMQ
broker's own (see ``FlushedBound``: its records stored before its flush timestamp, or below its
confirmed offset). A missing checkpoint means nothing is known to be flushed yet.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import NoReturn

import numpy as np
import structlog

from tieredstore.errors import CorruptRecordError, InvalidQueueError, NotFoundError, ValidationError
from tieredstore.formats.checksum import body_crc
from tieredstore.formats.consume_queue import UNIT_SIZE, ConsumeQueueUnit
from tieredstore.formats.message import (
    HEADER_PREFIX,
    MAGIC_V1,
    MAGIC_V2,
    POS_BORN_HOST,
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_STOREHOST_V6,
    store_timestamp_of,
)
from tieredstore.formats.naming import hot_file_name, validate_topic
from tieredstore.local.batch import (
    HotBatch,
    build,
    copy_records,
    followed_problems,
    located_prefix,
    parse_units,
    tag_hash_of,
    units_from,
)
from tieredstore.local.checkpoint import CheckpointSource, FlushedBound
from tieredstore.local.commit_log_dispatch import CommitLogDispatch, RebuiltUnits
from tieredstore.local.config import LocalStoreConfig
from tieredstore.local.durable import DurableEnd
from tieredstore.local.file_sizes import StoreFileSizes
from tieredstore.local.flusher import FlushStats
from tieredstore.local.index_file import HotKeyIndex, whole_record
from tieredstore.local.mapped_file import release_files_below, release_mapped_pages
from tieredstore.local.queue import list_offset_files
from tieredstore.local.store import (
    Boundary,
    LocalMessageStore,
    PutRequest,
    PutResult,
    RecoveryReport,
    RetentionReport,
    StoredMessage,
    check_boundary,
    check_unit_record,
    search_timestamp,
)

log = structlog.get_logger(__name__)

_UNIT = struct.Struct(">qiq")
_INT = struct.Struct(">i")
_SHORT = struct.Struct(">h")
_BYTE = struct.Struct(">b")
# Enough of a record to reach STORETIMESTAMP behind an IPv6 born host.
_TIMESTAMP_PREFIX = POS_BORN_HOST + 20 + 8
DEFAULT_REFRESH_INTERVAL = 0.2
# A queue's check of new units unmaps the pages behind it each time it has moved this far (see _grow).
GROW_RELEASE_BYTES = 8 << 20


class _Mapping:
    """One store file mapped read-only, with the identity (device, inode, size) it had when mapped."""

    __slots__ = ("buffer", "identity", "path", "released_upto", "size", "start_offset")

    def __init__(self, path: Path, start_offset: int, buffer: mmap.mmap, identity: tuple[int, int, int]) -> None:
        self.path = path
        self.start_offset = start_offset
        self.buffer = buffer
        self.identity = identity
        self.size = identity[2]
        self.released_upto = 0  # bytes from the file start whose pages release_files_below unmapped

    @classmethod
    def open(cls, path: Path, start_offset: int) -> _Mapping | None:
        """The file mapped, or None when it is gone or still empty (the writer creates, then sizes it)."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            stat = os.fstat(fd)
            if stat.st_size == 0:
                return None
            buffer = mmap.mmap(fd, stat.st_size, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        return cls(path, start_offset, buffer, (stat.st_dev, stat.st_ino, stat.st_size))

    @property
    def end_offset(self) -> int:
        return self.start_offset + self.size

    def is_current(self) -> bool:
        """Whether the path still names the file that is mapped (not deleted, replaced or resized)."""
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            return False
        return (stat.st_dev, stat.st_ino, stat.st_size) == self.identity

    def close(self) -> None:
        self.buffer.close()


def _find(files: Sequence[_Mapping], offset: int) -> _Mapping | None:
    """The mapping holding byte ``offset`` of its address space, by binary search over start offsets."""
    low, high = 0, len(files)
    while low < high:
        middle = (low + high) // 2
        if files[middle].start_offset <= offset:
            low = middle + 1
        else:
            high = middle
    if low == 0 or offset >= files[low - 1].end_offset:
        return None
    return files[low - 1]


def _relist(directory: Path, current: list[_Mapping]) -> list[_Mapping]:
    """The directory's 20-digit files mapped: unchanged mappings kept, vanished or replaced ones closed."""
    by_path = {mapping.path: mapping for mapping in current}
    fresh: list[_Mapping] = []
    for start, path in list_offset_files(directory):
        mapping = by_path.pop(path, None)
        if mapping is not None and not mapping.is_current():
            by_path[path] = mapping  # closed below, mapped again here
            mapping = None
        if mapping is None:
            mapping = _Mapping.open(path, start)
        if mapping is not None:
            fresh.append(mapping)
    for stale in by_path.values():
        stale.close()
    return fresh


class _FollowedLog:
    """The writer's commit-log files, mapped read-only."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.files: list[_Mapping] = []

    def refresh(self) -> None:
        self.files = _relist(self.directory, self.files)

    @property
    def min_offset(self) -> int:
        return self.files[0].start_offset if self.files else 0

    @property
    def max_offset(self) -> int:
        """End of the last mapped file: an upper bound of the data, not the writer's write position."""
        return self.files[-1].end_offset if self.files else 0

    def read(self, offset: int, size: int) -> bytes | None:
        """The bytes at ``[offset, offset + size)`` of one file; None when no mapped file holds them all."""
        file = _find(self.files, offset)
        if file is None or offset + size > file.end_offset:
            return None
        local = offset - file.start_offset
        return file.buffer[local : local + size]

    def release_range(self, begin: int, end: int) -> None:
        """Unmap this process's pages of ``[begin, end)``, whatever was released before."""
        for file in self.files:
            if file.end_offset > begin and file.start_offset < end:
                local = max(begin, file.start_offset) - file.start_offset
                release_mapped_pages(file.buffer, local, min(end, file.end_offset) - file.start_offset)

    def release_pages_below(self, offset: int) -> int:
        return release_files_below(self.files, offset)

    def holder_replaced(self, offset: int) -> bool:
        """Whether the file mapped for ``offset`` is missing or no longer the one on disk."""
        file = _find(self.files, offset)
        return file is None or not file.is_current()

    def close(self) -> None:
        for file in self.files:
            file.close()
        self.files = []


class _FollowedQueue:
    """One (topic, queue id): its consume-queue files mapped read-only and the range of checked units."""

    def __init__(self, topic: str, queue_id: int, directory: Path) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.topic_raw = topic.encode("utf-8")
        self.directory = directory
        self.files: list[_Mapping] = []
        self.min_offset = 0
        self.max_offset = 0
        self.refreshed_at = -1.0
        self.durable_end = DurableEnd()

    def refresh(self, log_min_offset: int, now: float) -> None:
        """Relist the files; the min offset follows the first file and the commit log's retention."""
        self.refreshed_at = now
        self.files = _relist(self.directory, self.files)
        if not self.files:
            self.min_offset = self.max_offset
            return
        first = self.files[0]
        # A broker's retention may also have deleted every file past the last checked unit: start over as new.
        if self.max_offset <= self.min_offset or first.start_offset // UNIT_SIZE > self.max_offset:
            # Nothing checked yet: the first unit may be anywhere in the first file (a rebased queue),
            # and the units before the commit log's first file point at data retention deleted.
            # A first file of zeros holds no unit yet (the writer sizes a file before writing into it,
            # and its recovery zeroes units it rebuilds): the queue starts at the file's first slot,
            # empty, and a later look finds where its first unit really lands.
            data = first.buffer[: first.size - first.size % UNIT_SIZE]
            written = data.lstrip(b"\x00")
            leading_zeros = len(data) - len(written) if written else 0
            self.min_offset = (first.start_offset + leading_zeros) // UNIT_SIZE
            self.min_offset = self.max_offset = self._first_written_at_or_after(log_min_offset)
            return
        self.min_offset = max(self.min_offset, first.start_offset // UNIT_SIZE)
        self.min_offset = min(self._lower_bound(log_min_offset), self.max_offset)

    def _lower_bound(self, commitlog_offset: int) -> int:
        """The first checked queue offset whose unit points at or after ``commitlog_offset``."""
        low, high = self.min_offset, self.max_offset
        while low < high:
            middle = (low + high) // 2
            unit = self.raw_unit(middle)
            if unit is None or unit[0] < commitlog_offset:
                low = middle + 1
            else:
                high = middle
        return low

    def _first_written_at_or_after(self, commitlog_offset: int) -> int:
        """From min_offset, the first slot that is unwritten or points at or after ``commitlog_offset``."""
        low, high = self.min_offset, max(self.min_offset, self.files[-1].end_offset // UNIT_SIZE)
        while low < high:
            middle = (low + high) // 2
            unit = self.raw_unit(middle)
            # Written units ascend in commit-log offset and unwritten (zero) slots only follow them.
            if unit is not None and unit[1] != 0 and unit[0] < commitlog_offset:
                low = middle + 1
            else:
                high = middle
        return low

    def dispatched_end(self) -> int | None:
        """The commit-log offset past the record of the queue's last written unit, unchecked; None with no unit."""
        if not self.files:
            return None
        end = self._first_written_at_or_after(1 << 63)  # the first unwritten slot
        unit = self.raw_unit(end - 1) if end > self.min_offset else None
        return None if unit is None or unit[1] <= 0 else unit[0] + unit[1]

    def raw_unit(self, queue_offset: int) -> tuple[int, int, int] | None:
        """(commit-log offset, size, tag hash) of the slot, unchecked; None when no mapped file holds it."""
        byte_offset = queue_offset * UNIT_SIZE
        file = _find(self.files, byte_offset)
        if file is None or byte_offset + UNIT_SIZE > file.end_offset:
            return None
        return _UNIT.unpack_from(file.buffer, byte_offset - file.start_offset)

    def position_at(self, queue_offset: int) -> tuple[int, int] | None:
        """(commit-log offset, size) of the slot's unit, unchecked; None when no mapped file holds it."""
        unit = self.raw_unit(queue_offset)
        return None if unit is None else (unit[0], unit[1])

    def map_next_file(self) -> bool:
        """Map the file after the last one (the writer rolled over); whether there was one."""
        if not self.files:
            return False
        mapping = _Mapping.open(self.directory / hot_file_name(self.files[-1].end_offset), self.files[-1].end_offset)
        if mapping is None:
            return False
        self.files.append(mapping)
        return True

    def close(self) -> None:
        for file in self.files:
            file.close()
        self.files = []


class _RebuiltQueue(_FollowedQueue):
    """A queue with no consume-queue files: its units are the ones ``CommitLogDispatch`` rebuilt, read as a file."""

    def __init__(self, topic: str, queue_id: int, directory: Path, units: RebuiltUnits) -> None:
        super().__init__(topic, queue_id, directory)
        self.units = units

    def refresh(self, log_min_offset: int, now: float) -> None:
        """Take the units the dispatch added, less those whose records retention deleted."""
        self.refreshed_at = now
        units = self.units
        units.drop_below(log_min_offset)
        self.min_offset, self.max_offset = units.first, units.end
        size = units.count * UNIT_SIZE
        self.files = [_Mapping(self.directory, units.first * UNIT_SIZE, units.buffer, (0, 0, size))] if size else []

    def map_next_file(self) -> bool:
        return False

    def close(self) -> None:
        """The units are the dispatch's to release."""


def record_problem(
    raw: bytes, unit: tuple[int, int, int], topic_raw: bytes, queue_id: int, queue_offset: int
) -> str | None:
    """Why ``raw`` is not yet the whole record ``unit`` points at for this queue offset; None when it is."""
    commitlog_offset, size, tag = unit
    if len(raw) != size or size < HEADER_PREFIX.size:
        return f"{len(raw)} bytes where the unit says {size}"
    try:
        total, magic, crc, record_queue_id, _flag, record_queue_offset, physical, sysflag, _born = (
            HEADER_PREFIX.unpack_from(raw)
        )
        if magic not in (MAGIC_V1, MAGIC_V2):
            return f"magic 0x{magic & 0xFFFFFFFF:08x}"
        if total != size:
            return f"TOTALSIZE {total} where the unit says {size}"
        if physical != commitlog_offset or record_queue_id != queue_id or record_queue_offset != queue_offset:
            return (
                f"record of queue {record_queue_id} offset {record_queue_offset} at {physical}, "
                f"expected queue {queue_id} offset {queue_offset} at {commitlog_offset}"
            )
        cursor = POS_BORN_HOST + (20 if sysflag & SYSFLAG_BORNHOST_V6 else 8) + 8
        cursor += (20 if sysflag & SYSFLAG_STOREHOST_V6 else 8) + 12
        (body_len,) = _INT.unpack_from(raw, cursor)
        cursor += 4
        if body_len < 0 or cursor + body_len > size:
            return f"body length {body_len} runs past the record"
        body_at = cursor
        cursor += body_len
        topic_len = _SHORT.unpack_from(raw, cursor)[0] if magic == MAGIC_V2 else _BYTE.unpack_from(raw, cursor)[0]
        cursor += 2 if magic == MAGIC_V2 else 1
        if raw[cursor : cursor + topic_len] != topic_raw:
            return "record of another topic"
        cursor += topic_len
        (properties_len,) = _SHORT.unpack_from(raw, cursor)
        cursor += 2
        if properties_len < 0 or cursor + properties_len != size:
            return f"properties length {properties_len} does not end at the record size"
        if properties_len and raw[-1] != 0x02:
            return "properties do not end in 0x02 (not fully written)"
        expected_tag = tag_hash_of(raw[cursor:]) if properties_len else 0
        if expected_tag != tag:
            return f"unit tag hash {tag} where the record's TAGS give {expected_tag}"
    except struct.error as exc:
        return f"undecodable header: {exc}"
    with memoryview(raw) as view:
        computed = body_crc(view[body_at : body_at + body_len])
    if computed != crc:
        return f"body CRC {computed} where the record says {crc}"
    return None


class HotStoreFollower(LocalMessageStore):
    """A LocalMessageStore that reads a directory another process writes, and follows it; never writes.

    It is a LocalMessageStore so that every reader (the archiver, the fetcher, the CLI) takes it
    unchanged; every read method is its own, and every writing method raises ValidationError.
    ``refresh_interval`` (seconds) bounds how often directories are listed; reads between listings
    cost no system call except when a unit needs a file not mapped yet. Thread-safe.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        config: LocalStoreConfig | None = None,
        refresh_interval: float = DEFAULT_REFRESH_INTERVAL,
    ) -> None:
        # LocalMessageStore.__init__ is not called: it opens the files writable (or rebuilds consume
        # queues in memory); a follower keeps only what its own read methods use.
        self.root = Path(data_dir)
        self.config = config or LocalStoreConfig()
        self.read_only = True
        self.refresh_interval = refresh_interval
        self._store_host = self.config.store_host_address
        self._closed = False
        self._lock = threading.RLock()
        if not self.root.is_dir():
            raise NotFoundError(f"{self.root} is not a directory; there is no hot store to follow")
        self._log = _FollowedLog(self.root / "commitlog")
        self._key_index = HotKeyIndex(
            self.root / "index",
            slot_capacity=self.config.index_slot_count,
            item_capacity=self.config.index_max_items,
            writable=False,
        )
        self._followed: dict[tuple[str, int], _FollowedQueue] = {}
        self.file_sizes = StoreFileSizes.learn(self.root, self.config)
        self._dispatch = CommitLogDispatch(self._has_queue_files)
        self._listed_at = -1.0
        # What the writer's checkpoint says is flushed. Read again at every listing.
        self._flushed = FlushedBound("missing")
        self._flushed_said: tuple[CheckpointSource, bool] | None = None  # (source, known) the log last said
        self.recovery = RecoveryReport(clean=True, scanned_from=0, valid_end=0)
        with self._lock:
            self._refresh(time.monotonic())
        log.info("following a hot store", data_dir=str(self.root), queues=len(self._followed))

    # ---- refreshing ----------------------------------------------------------------------------------

    def _refresh(self, now: float) -> None:
        """Relist the commit log and the queue directories (new queues; vanished files)."""
        self._listed_at = now
        self._log.refresh()
        flushed = FlushedBound.read(self.root / "checkpoint")
        if (flushed.source, flushed.known) != self._flushed_said:
            self._flushed_said = (flushed.source, flushed.known)
            self._log_flushed_source(flushed)
        self._flushed = flushed
        self._list_queues(now)
        self._rebuild(now)

    def _list_queues(self, now: float) -> None:
        """Follow the queue directories not followed yet."""
        base = self.root / "consumequeue"
        if not base.is_dir():
            return
        for topic_dir in base.iterdir():
            try:
                validate_topic(topic_dir.name)
            except ValidationError:
                continue
            try:
                queue_dirs = list(topic_dir.iterdir())
            except (FileNotFoundError, NotADirectoryError):
                continue
            for queue_dir in queue_dirs:
                if queue_dir.name.isdigit() and (topic_dir.name, int(queue_dir.name)) not in self._followed:
                    self._follow(topic_dir.name, int(queue_dir.name), now)

    def _rebuild(self, now: float) -> None:
        """Dispatch the newly flushed records of queues without consume-queue files (``CommitLogDispatch``)."""
        if self._dispatch.position is None:
            # RocketMQ's own recovery dispatches from where its consume queues end; so does this first scan,
            # so that a broker's start is not a read of its whole commit log (a store without any consume
            # queue is scanned from its first file).
            ends = [end for queue in self._followed.values() if (end := queue.dispatched_end()) is not None]
            self._dispatch.position = max(ends, default=None)
        for key in self._dispatch.advance(self._log.files, self._flushed):
            followed = self._followed.get(key)
            if not isinstance(followed, _RebuiltQueue):
                if followed is not None:
                    followed.close()  # its directory was there, without a file
                self._followed[key] = _RebuiltQueue(
                    *key, self.root / "consumequeue" / key[0] / str(key[1]), self._dispatch.queues[key]
                )
        for queue in self._followed.values():
            if isinstance(queue, _RebuiltQueue):
                queue.refresh(self._log.min_offset, now)  # the dispatch may have moved its units

    def _has_queue_files(self, topic: str, queue_id: int) -> bool:
        return bool(list_offset_files(self.root / "consumequeue" / topic / str(queue_id)))

    def _log_flushed_source(self, flushed: FlushedBound) -> None:
        """Say once, when it changes, where the durable bound comes from: else an archiver that takes
        nothing from a store that never flushed would not say why."""
        path = str(self.root / "checkpoint")
        if not flushed.known:
            log.info(
                "the hot store's checkpoint says nothing is flushed yet; nothing is archived until its writer flushes",
                checkpoint=path,
                source=flushed.source,
            )
        elif flushed.source == "rocketmq":
            log.info(
                "following a RocketMQ broker's checkpoint: archiving records stored before its flush time",
                checkpoint=path,
                stored_until=flushed.stored_until,
                confirmed_offset=flushed.offset,
            )
        else:
            log.info("following the writer's checkpoint", checkpoint=path, confirmed_offset=flushed.offset)

    def _follow(self, topic: str, queue_id: int, now: float) -> _FollowedQueue:
        queue = _FollowedQueue(topic, queue_id, self.root / "consumequeue" / topic / str(queue_id))
        queue.refresh(self._log.min_offset, now)
        self._followed[(topic, queue_id)] = queue
        return queue

    def _listed(self) -> float:
        """Relist if the last listing is stale (ValidationError once closed); returns the time now."""
        if self._closed:
            raise ValidationError("the hot store follower is closed")
        now = time.monotonic()
        if now - self._listed_at >= self.refresh_interval:
            self._refresh(now)
        return now

    def _fresh(self, topic: str, queue_id: int) -> _FollowedQueue | None:
        """The queue, relisted if stale and grown to its last checked unit; None if it has no directory yet."""
        validate_topic(topic)
        if isinstance(queue_id, bool) or not isinstance(queue_id, int) or queue_id < 0:
            raise InvalidQueueError(f"queue id must be a non-negative integer, not {queue_id!r}")
        now = self._listed()
        queue = self._followed.get((topic, queue_id))
        if queue is None:
            if not (self.root / "consumequeue" / topic / str(queue_id)).is_dir():
                return None
            queue = self._follow(topic, queue_id, now)
        elif now - queue.refreshed_at >= self.refresh_interval:
            queue.refresh(self._log.min_offset, now)
        self._grow(queue)
        return queue

    def _grow(self, queue: _FollowedQueue) -> None:
        """Extend the queue over every new unit whose record checks out; stop at the first that does not.

        Checking reads each record through the mapping. Every GROW_RELEASE_BYTES of commit log a check
        moves through (a queue first followed, or long unread), the pages behind it are unmapped again:
        a new follower would otherwise hold the whole hot store in its RSS from its first look.
        """
        retried = False
        checked_from: int | None = None  # where in the commit log this call's checks started
        while True:
            offset = queue.max_offset
            unit = queue.raw_unit(offset)
            if unit is None:
                if queue.map_next_file():
                    continue
                return
            if unit[1] == 0:
                # The end for now. A file the writer's recovery replaced is mapped again by the
                # queue's next refresh, so an idle queue costs no system call here.
                return
            if unit[0] < self._log.min_offset and offset == queue.min_offset:
                # Retention deleted the record after this follower last looked: it is below the min now.
                queue.min_offset = queue.max_offset = offset + 1
                continue
            raw = self._log.read(unit[0], unit[1])
            if raw is None or record_problem(raw, unit, queue.topic_raw, queue.queue_id, offset) is not None:
                if not retried and (raw is None or self._log.holder_replaced(unit[0])):
                    retried = True
                    self._log.refresh()
                    continue
                return
            queue.max_offset = offset + 1
            retried = False
            if checked_from is None:
                checked_from = unit[0]
            elif unit[0] - checked_from >= GROW_RELEASE_BYTES:
                self._log.release_range(checked_from, unit[0])
                checked_from = unit[0]

    # ---- the read API --------------------------------------------------------------------------------

    def queues(self) -> list[tuple[str, int]]:
        """Every (topic, queue id) that holds or held messages, sorted."""
        with self._lock:
            self._listed()
            for queue in self._followed.values():
                if queue.max_offset == 0:
                    self._grow(queue)
            return sorted(key for key, queue in self._followed.items() if queue.max_offset > 0)

    def min_offset(self, topic: str, queue_id: int) -> int:
        """The first queue offset still in the hot store (0 for a queue never written)."""
        with self._lock:
            queue = self._fresh(topic, queue_id)
            return queue.min_offset if queue is not None else 0

    def max_offset(self, topic: str, queue_id: int) -> int:
        """One past the last message whose record is whole on disk (0 for a queue never written)."""
        with self._lock:
            queue = self._fresh(topic, queue_id)
            return queue.max_offset if queue is not None else 0

    @property
    def commitlog_min_offset(self) -> int:
        with self._lock:
            return self._log.min_offset

    @property
    def commitlog_max_offset(self) -> int:
        """The end of the last commit-log file: a follower does not know the writer's exact write position."""
        with self._lock:
            return self._log.max_offset

    def durable_max_offset(self, topic: str, queue_id: int) -> int:
        """One past the last message the writer's checkpoint covers (0 for a queue never written): what the
        writer had flushed at its last checkpoint, at most ``flush_interval`` (plus ``refresh_interval``) ago."""
        with self._lock:
            queue = self._fresh(topic, queue_id)
            if queue is None:
                return 0
            flushed = self._flushed

            def is_flushed(queue_offset: int) -> bool:
                return self._covers(flushed, queue, queue_offset)

            return queue.durable_end.search(
                (flushed.offset, flushed.stored_until), queue.min_offset, queue.max_offset, is_flushed
            )

    def _covers(self, flushed: FlushedBound, queue: _FollowedQueue, queue_offset: int) -> bool:
        """Whether ``flushed`` covers the message at a checked queue offset: by where its record ends, else
        by its store timestamp (a RocketMQ broker's checkpoint), read from the record's header only."""
        unit = queue.raw_unit(queue_offset)
        if unit is None:
            return False
        if unit[0] + unit[1] <= flushed.offset:
            return True
        if flushed.stored_until <= 0:
            return False
        head = self._log.read(unit[0], min(unit[1], _TIMESTAMP_PREFIX))
        return head is not None and store_timestamp_of(head) <= flushed.stored_until

    def flush_queue(self, topic: str, queue_id: int) -> int:
        """Flushing is the writer's: only its ``durable_max_offset``."""
        return self.durable_max_offset(topic, queue_id)

    @property
    def commitlog_flushed_offset(self) -> int:
        """Up to where the writer's last checkpoint says the commit log is flushed (0 before its first one).

        A RocketMQ broker's checkpoint bounds what is flushed by time too: see ``durable_max_offset``."""
        with self._lock:
            self._listed()
            return self._flushed.offset

    def release_pages(self, below: int) -> int:
        """Unmap this process's pages of the commit log below ``below`` (see LocalMessageStore's)."""
        with self._lock:
            return self._log.release_pages_below(below)

    def _checked_unit(self, queue: _FollowedQueue, queue_offset: int) -> ConsumeQueueUnit:
        if not queue.min_offset <= queue_offset < queue.max_offset:
            raise NotFoundError(
                f"offset {queue_offset} of {queue.topic}/{queue.queue_id} is outside "
                f"[{queue.min_offset}, {queue.max_offset})"
            )
        unit = queue.raw_unit(queue_offset)
        if unit is None:
            raise NotFoundError(f"offset {queue_offset} of {queue.topic}/{queue.queue_id} was just deleted")
        return ConsumeQueueUnit(*unit)

    def cq_unit(self, topic: str, queue_id: int, queue_offset: int) -> ConsumeQueueUnit:
        """The consume-queue unit at ``queue_offset``; NotFoundError outside [min_offset, max_offset)."""
        with self._lock:
            queue = self._fresh(topic, queue_id)
            if queue is None:
                raise NotFoundError(f"queue {topic}/{queue_id} holds no messages in the hot store")
            return self._checked_unit(queue, queue_offset)

    def read_record(self, unit: ConsumeQueueUnit) -> bytes:
        """The record bytes a unit points at, checked to be a whole record of the unit's size."""
        with self._lock:
            raw = self._log.read(unit.commitlog_offset, unit.size)
            if raw is None and self._log.holder_replaced(unit.commitlog_offset):
                self._log.refresh()
                raw = self._log.read(unit.commitlog_offset, unit.size)
        if raw is None:
            raise NotFoundError(f"commit-log range [{unit.commitlog_offset}, +{unit.size}) is not in the hot store")
        return check_unit_record(raw, unit)

    def read_messages(
        self, topic: str, queue_id: int, queue_offset: int, max_count: int = 32, max_bytes: int = 4 << 20
    ) -> list[StoredMessage]:
        """Consecutive messages from ``queue_offset``: at most ``max_count``, and stopping before ``max_bytes``
        except that the first message is always returned, however large.

        An offset at or past max_offset gives an empty list; one below min_offset (or whose file the
        writer just deleted) is a NotFoundError. Every record is checked again as it is copied out.
        """
        with self._lock:
            queue = self._fresh(topic, queue_id)
            if queue is None:
                return []
            if queue_offset < queue.min_offset:
                raise NotFoundError(
                    f"offset {queue_offset} of {topic}/{queue_id} is below the hot store's min offset "
                    f"{queue.min_offset}"
                )
            messages: list[StoredMessage] = []
            total = 0
            for offset in range(queue_offset, min(queue.max_offset, queue_offset + max_count)):
                unit = queue.raw_unit(offset)
                raw = self._log.read(unit[0], unit[1]) if unit is not None else None
                if unit is None or raw is None:
                    if messages:
                        break
                    # Retention took the file: relist now, so min_offset says so to the next caller.
                    self._log.refresh()
                    queue.refresh(self._log.min_offset, time.monotonic())
                    raise NotFoundError(f"offset {offset} of {topic}/{queue_id} was just deleted by retention")
                if messages and total + unit[1] > max_bytes:
                    break
                problem = record_problem(raw, unit, queue.topic_raw, queue_id, offset)
                if problem is not None:
                    raise CorruptRecordError(
                        f"hot record of {topic}/{queue_id} offset {offset} changed after it was checked: {problem}",
                        location="commitlog",
                        offset=unit[0],
                    )
                messages.append(StoredMessage(offset, raw, ConsumeQueueUnit(*unit)))
                total += unit[1]
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
        """``read_messages`` as one HotBatch (see ``tieredstore.local.batch``): the same records, each
        checked again as it is copied out, all at once instead of one by one. ``unmap`` as the writer's."""
        with self._lock:
            queue = self._fresh(topic, queue_id)
            if queue is None:
                return HotBatch.empty(topic, queue_id, queue_offset)
            if queue_offset < queue.min_offset:
                raise NotFoundError(
                    f"offset {queue_offset} of {topic}/{queue_id} is below the hot store's min offset "
                    f"{queue.min_offset}"
                )
            count = min(max_count, queue.max_offset - queue_offset)
            if count <= 0:
                return HotBatch.empty(topic, queue_id, queue_offset)
            units = parse_units(units_from(queue.files, queue_offset, count), max_bytes)
            held, which, local = located_prefix(self._log.files, units)
            if held == 0:
                # Retention took the file: relist now, so min_offset says so to the next caller.
                self._log.refresh()
                queue.refresh(self._log.min_offset, time.monotonic())
                raise NotFoundError(f"offset {queue_offset} of {topic}/{queue_id} was just deleted by retention")
            units = units[:held]
            batch = build(
                topic,
                queue_id,
                queue_offset,
                units,
                copy_records(
                    self._log.files,
                    which,
                    local,
                    units["size"].astype(np.int64),
                    # A follower's mapping is read-only: every page it maps is on disk already.
                    unmap_below=self._log.files[-1].end_offset if unmap else None,
                ),
            )
            bad = followed_problems(batch, queue.topic_raw)
            if bad is not None:
                unit = tuple(int(field) for field in batch.units[bad].tolist())
                problem = record_problem(
                    batch.record(bad), (unit[0], unit[1], unit[2]), queue.topic_raw, queue_id, queue_offset + bad
                )
                raise CorruptRecordError(
                    f"hot record of {topic}/{queue_id} offset {queue_offset + bad} changed after it was checked: "
                    f"{problem or 'it fails the batch check'}",
                    location="commitlog",
                    offset=unit[0],
                )
            return batch

    def _store_timestamp_of(self, unit: ConsumeQueueUnit) -> int:
        with self._lock:
            head = self._log.read(unit.commitlog_offset, min(unit.size, _TIMESTAMP_PREFIX))
        if head is None:
            raise NotFoundError(f"commit-log offset {unit.commitlog_offset} was just deleted by retention")
        return store_timestamp_of(head)

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp: int, boundary: Boundary = "lower") -> int:
        """As the writer's, over the units this follower has checked (see ``search_timestamp``)."""
        check_boundary(boundary)
        with self._lock:
            queue = self._fresh(topic, queue_id)
            if queue is None:
                return 0
            return search_timestamp(
                queue.min_offset,
                queue.max_offset,
                timestamp,
                boundary,
                lambda offset: self._store_timestamp_of(self._checked_unit(queue, offset)),
            )

    def _record_at(self, commitlog_offset: int) -> bytes | None:
        """The whole record the writer wrote at ``commitlog_offset``; None when no mapped file holds one."""
        with self._lock:
            if self._closed:
                raise ValidationError("the hot store follower is closed")
            if self._log.read(commitlog_offset, 1) is None:
                self._log.refresh()  # a commit-log file the writer created since the last listing
            return whole_record(self._log.read, commitlog_offset)

    # ---- lifecycle and refusals ----------------------------------------------------------------------

    def close(self) -> None:
        """Unmap every file; the writer's directory is left exactly as it was."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for queue in self._followed.values():
                queue.close()
            self._followed.clear()
            self._dispatch.close()
            self._log.close()
            self._key_index.close()

    def __enter__(self) -> HotStoreFollower:
        return self

    def _refuse(self, what: str) -> NoReturn:
        raise ValidationError(f"{self.root} is followed, not owned: {what} belong to the writer process")

    def flush(self) -> None:
        """Nothing to flush: a follower writes nothing."""

    @property
    def flush_stats(self) -> FlushStats:
        return FlushStats()

    def put_message(
        self,
        topic: str,
        queue_id: int,
        body: bytes,
        keys: Sequence[str] = (),
        tags: str | None = None,
        properties: Mapping[str, str] | None = None,
    ) -> PutResult:
        self._refuse("puts")

    def put_messages(self, requests: Iterable[PutRequest]) -> list[PutResult]:
        self._refuse("puts")

    def restore_messages(self, topic: str, queue_id: int, records: Sequence[bytes | memoryview]) -> list[PutResult]:
        self._refuse("restores")

    def delete_expired(
        self, archived_offset: Callable[[str, int], int], *, now_ms: int | None = None
    ) -> RetentionReport:
        self._refuse("hot retention deletes")
