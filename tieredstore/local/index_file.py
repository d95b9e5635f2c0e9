"""The hot store's key index: RocketMQ's own IndexFile under ``<hot>/index/``, built off the put path.

Every message key (each of KEYS, and UNIQ_KEY) is added as ``topic#key`` with the record's commit-log
offset and store timestamp, so a key lookup finds messages the archiver has not moved yet. Files are
named by creation time (``yyyyMMddHHmmssSSS``, UTC); the newest takes items until it is full, then a
new one is created. Items are added in commit-log order, so each file covers a run of the commit log.
A put only records its keys; the store indexes them in batches (``add_many``) in its periodic flush,
before a key lookup of its own, and on close, as RocketMQ's reput thread feeds its index service.

Writing order makes a live file readable by another process (a follower, the CLI beside a running
producer): an item is written, then the header that counts it, then the slot that points to it.

Durability follows the commit log: ``flush`` syncs the index files before the store writes its
checkpoint, so every item of a record below the checkpoint is on disk. After an unclean stop,
``recover`` drops the items of records at or past the recovery start (the store re-adds them as it
re-reads the commit log) and a file whose header does not hold together (a torn file) goes with
every file after it, to be rebuilt from the commit log. ``delete_below`` removes a file once every
record it indexes is gone from the hot commit log.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
import structlog

from tieredstore.basics import now_ms
from tieredstore.directories import ensure_directory
from tieredstore.errors import CorruptRecordError, IntegrityError
from tieredstore.formats.index_file import (
    HEADER_SIZE,
    INT32_MAX,
    ITEM,
    ITEM_DTYPE,
    ITEM_SIZE,
    ROCKETMQ_DEFAULT_ITEMS,
    ROCKETMQ_DEFAULT_SLOTS,
    SLOT,
    SLOT_DTYPE,
    SLOT_SIZE,
    RocketMQIndexFile,
    index_file_name,
    index_file_size,
    item_position,
    key_hash,
    key_hashes,
    pack_header,
    pack_slot,
    parse_index_file_name,
    read_item,
    read_slot,
    record_key_hashes,
    slot_of,
    time_diff_seconds,
)
from tieredstore.formats.message import (
    MAGIC_V1,
    MAGIC_V2,
    MIN_RECORD_SIZE,
    PROPERTY_KEYS,
    PROPERTY_UNIQ_KEY,
    MessageRecord,
    decode,
    record_size_at,
)
from tieredstore.local.commit_log import ScanStop
from tieredstore.local.mapped_file import MappedFile, fsync_directory

log = structlog.get_logger(__name__)

# A key entry to add: topic, its keys, the record's commit-log offset and its store timestamp.
KeyEntry = tuple[str, Sequence[str], int, int]
# Whole seconds in the file: an item stored at ``stamp`` may be up to this many ms later.
_SECOND_SLACK_MS = 999
# Below this many keys a batch is indexed record by record: array set-up costs more than it saves.
_BATCH_MIN_KEYS = 16
Int64Array = npt.NDArray[np.int64]


class _IndexFile:
    """One index file mapped whole; a writer keeps the header fields in memory and writes them with each add."""

    def __init__(self, path: Path, mapped: MappedFile, slot_capacity: int, item_capacity: int) -> None:
        self.path = path
        self.mapped = mapped
        self.slot_capacity = slot_capacity
        self.item_capacity = item_capacity
        self.items_at = item_position(slot_capacity, 0)
        self.reader = RocketMQIndexFile(
            mapped.buffer, slot_capacity=slot_capacity, item_capacity=item_capacity, location=str(path)
        )
        header = self.reader.header
        self.begin_timestamp = header.begin_timestamp
        self.end_timestamp = header.end_timestamp
        self.begin_offset = header.begin_physical_offset
        self.end_offset = header.end_physical_offset
        self.slots_used = header.hash_slot_count
        self.index_count = header.index_count
        self.identity = _identity(path)

    @classmethod
    def create(cls, path: Path, slot_capacity: int, item_capacity: int) -> _IndexFile:
        """A new empty file: disk blocks reserved for all of it, so a full disk fails here, not in a page fault."""
        mapped = MappedFile(path, 0, writable=True, create_size=index_file_size(slot_capacity, item_capacity))
        try:
            mapped.reserve(0, mapped.size)
            pack_header(mapped.buffer, 0, 0, 0, 0, 0, 1)
        except BaseException:
            mapped.delete()
            raise
        fsync_directory(path.parent)
        return cls(path, mapped, slot_capacity, item_capacity)

    @property
    def full(self) -> bool:
        return self.index_count >= self.item_capacity

    @property
    def empty(self) -> bool:
        return self.index_count <= 1

    def holds_together(self) -> bool:
        """Whether the header and slots are what a writer could have left (a torn or foreign file's are not)."""
        count = self.index_count
        if not 1 <= count <= self.item_capacity or not 0 <= self.slots_used <= min(self.slot_capacity, count - 1):
            return False
        slots = np.frombuffer(self.mapped.read(HEADER_SIZE, self.slot_capacity * SLOT_SIZE), dtype=">i4")
        if int(slots.min()) < 0 or int(slots.max()) >= count:
            return False
        if count == 1:
            return True
        first = read_item(self.mapped.buffer, self.slot_capacity, 1)
        last = read_item(self.mapped.buffer, self.slot_capacity, count - 1)
        return (
            0 < self.begin_timestamp <= self.end_timestamp
            and 0 <= self.begin_offset <= self.end_offset
            and first.physical_offset == self.begin_offset
            and last.physical_offset == self.end_offset
        )

    @property
    def room(self) -> int:
        return self.item_capacity - self.index_count

    def add_record(self, hashes: Sequence[int], physical_offset: int, store_timestamp: int) -> None:
        """Write one record's items (the file has room for them all), then publish them."""
        buffer, slot_capacity = self.mapped.buffer, self.slot_capacity
        number = self.index_count
        if number == 1:
            self.begin_offset, self.begin_timestamp = physical_offset, store_timestamp
        diff = (store_timestamp - self.begin_timestamp) // 1000
        if not 0 <= diff <= INT32_MAX:
            diff = time_diff_seconds(store_timestamp, self.begin_timestamp)
        at = self.items_at + number * ITEM_SIZE
        pending: dict[int, int] = {}
        for hash_value in hashes:
            slot = hash_value % slot_capacity
            previous = pending.get(slot)
            if previous is None:
                (previous,) = SLOT.unpack_from(buffer, HEADER_SIZE + slot * SLOT_SIZE)
                if not 0 < previous < number:
                    previous = 0
                    self.slots_used += 1
            ITEM.pack_into(buffer, at, hash_value, physical_offset, diff, previous)
            pending[slot] = number
            number += 1
            at += ITEM_SIZE
        self.index_count = number
        self.end_offset, self.end_timestamp = physical_offset, store_timestamp
        self.publish(pending)

    def add_batch(self, hashes: Int64Array, offsets: Int64Array, stamps: Int64Array) -> int:
        """Write as many of the items (key hash, commit-log offset, store timestamp) as there is room for,
        as whole arrays into the map, then publish them; returns how many were written."""
        count = min(len(hashes), self.room)
        if count <= 0:
            return 0
        hashes, offsets, stamps = hashes[:count], offsets[:count], stamps[:count]
        number = self.index_count
        if number == 1:
            self.begin_offset, self.begin_timestamp = int(offsets[0]), int(stamps[0])
        begin = self.begin_timestamp
        diffs = (stamps - begin) // 1000
        outside = (diffs < 0) | (diffs > INT32_MAX)
        if outside.any():  # as time_diff_seconds clamps them
            diffs = np.where(outside, np.clip(diffs, 0, INT32_MAX) if begin > 0 else 0, diffs)
        # Items sorted by slot, stably: each item's previous is the item before it in its slot's run, and
        # the first of a run links to what the slot held (when that is an item of this file's past).
        slots = hashes % self.slot_capacity
        order = np.argsort(slots, kind="stable")
        ordered = slots[order]
        boundary = np.empty(count + 1, dtype=np.bool_)  # between items i - 1 and i (in order): a new slot
        boundary[0] = boundary[count] = True
        np.not_equal(ordered[1:], ordered[:-1], out=boundary[1:count])
        run_starts, run_ends = boundary[:count], boundary[1:]
        buffer = self.mapped.buffer
        slot_table = np.frombuffer(buffer, dtype=SLOT_DTYPE, count=self.slot_capacity, offset=HEADER_SIZE)
        stored = slot_table[ordered[run_starts]]
        unchained = (stored <= 0) | (stored >= number)
        stored[unchained] = 0
        previous = np.empty(count, dtype=np.int64)
        previous[1:] = order[:-1] + number
        previous[run_starts] = stored
        items = np.frombuffer(buffer, dtype=ITEM_DTYPE, count=count, offset=item_position(self.slot_capacity, number))
        items["key_hash"] = hashes
        items["physical_offset"] = offsets
        items["time_diff"] = diffs
        items["previous"][order] = previous
        self.slots_used += int(np.count_nonzero(unchained))
        self.index_count = number + count
        self.end_offset, self.end_timestamp = int(offsets[-1]), int(stamps[-1])
        self.publish({})
        slot_table[ordered[run_ends]] = order[run_ends] + number
        del items, slot_table  # views of the map: it cannot be closed while they live
        return count

    def publish(self, pending: dict[int, int]) -> None:
        """The header counting the items written, then the slots that point to them."""
        buffer = self.mapped.buffer
        pack_header(
            buffer, self.begin_timestamp, self.end_timestamp, self.begin_offset, self.end_offset, self.slots_used,
            self.index_count,
        )  # fmt: skip
        pack = SLOT.pack_into
        for slot, number in pending.items():
            pack(buffer, HEADER_SIZE + slot * SLOT_SIZE, number)
        pending.clear()

    def drop_items_from(self, physical_offset: int) -> int:
        """Forget the items of records at or past ``physical_offset`` (the newest ones); returns how many."""
        buffer, slots = self.mapped.buffer, self.slot_capacity
        low, high = 1, self.index_count  # the first item at or past the offset is in [low, high]
        while low < high:
            middle = (low + high) // 2
            if read_item(buffer, slots, middle).physical_offset < physical_offset:
                low = middle + 1
            else:
                high = middle
        dropped = self.index_count - low
        if not dropped:
            return 0
        for number in range(self.index_count - 1, low - 1, -1):
            item = read_item(buffer, slots, number)
            slot = slot_of(item.key_hash, slots)
            if read_slot(buffer, slot) == number:
                pack_slot(buffer, slot, item.previous if 0 < item.previous < number else 0)
                if not 0 < item.previous < number:
                    self.slots_used -= 1
        start = item_position(slots, low)
        end = item_position(slots, self.index_count)
        buffer[start:end] = bytes(end - start)
        self.index_count = low
        if low == 1:
            self.begin_timestamp = self.end_timestamp = self.begin_offset = self.end_offset = 0
            self.slots_used = 0
        else:
            last = read_item(buffer, slots, low - 1)
            self.end_offset = last.physical_offset
            # Whole seconds are all the item keeps: the end is bounded from above.
            self.end_timestamp = self.begin_timestamp + last.time_diff_seconds * 1000 + _SECOND_SLACK_MS
        self.publish({})
        return dropped

    def close(self) -> None:
        self.mapped.close()

    def delete(self) -> None:
        self.mapped.delete()


def _identity(path: Path) -> tuple[int, int]:
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return (0, 0)
    return (stat.st_dev, stat.st_ino)


class HotKeyIndex:
    """The index files of one hot store: written by its writer, or read (and relisted) by a reader.

    ``slot_capacity`` and ``item_capacity`` are the writer's settings; a reader also takes files of
    RocketMQ's default capacities (a broker's store directory). Thread-safe: the writer adds under
    the store's index lock (one batch at a time); lookups run beside it and read the maps as they stand.
    """

    def __init__(self, directory: Path, *, slot_capacity: int, item_capacity: int, writable: bool) -> None:
        self.directory = directory
        self.slot_capacity = slot_capacity
        self.item_capacity = item_capacity
        self.writable = writable
        self._lock = threading.Lock()
        self._files: list[_IndexFile] = []
        self._refused: set[str] = set()
        self._dirty: set[_IndexFile] = set()
        # False when the store must index its whole commit log: a first open, or files it cannot use.
        self.existed = directory.is_dir()
        if not writable:
            self._relist()
            return
        ensure_directory(directory, "the hot store's index directory")
        try:
            self._relist()
        except (IntegrityError, CorruptRecordError) as exc:
            # Files of other capacities (the settings changed) or torn at creation: the store rebuilds
            # the whole index from its commit log, as for a store that never had one.
            log.warning("hot index unreadable; rebuilt from the commit log", error=str(exc))
            for file in self._files:
                file.close()
            self._files = []
            for name in os.listdir(directory):
                if parse_index_file_name(name) is not None:
                    (directory / name).unlink()
            self.existed = False

    # ---- the files -----------------------------------------------------------------------------------

    def _capacities(self, path: Path) -> tuple[int, int] | None:
        size = path.stat().st_size
        choices = ((self.slot_capacity, self.item_capacity), (ROCKETMQ_DEFAULT_SLOTS, ROCKETMQ_DEFAULT_ITEMS))
        for slots, items in choices:
            if size == index_file_size(slots, items):
                return slots, items
        return None

    def _open(self, path: Path) -> _IndexFile | None:
        """The file mapped, or None (with a warning, once) when it is not an index file this store can read."""
        try:
            capacities = self._capacities(path)
            if capacities is None:
                raise IntegrityError(
                    f"{path.stat().st_size} bytes fit neither {self.slot_capacity} slots and {self.item_capacity} "
                    f"items (hot.index_slot_count, hot.index_max_items) nor RocketMQ's defaults"
                )
            mapped = MappedFile(path, 0, writable=self.writable)
            try:
                return _IndexFile(path, mapped, *capacities)
            except BaseException:
                mapped.close()
                raise
        except FileNotFoundError:
            return None
        except IntegrityError as exc:
            if not self.writable and path.name not in self._refused:
                self._refused.add(path.name)
                log.warning("hot index file skipped", path=str(path), error=str(exc))
            if self.writable:
                raise
            return None

    def _relist(self) -> None:
        """Map the files the directory holds now, in name (creation) order; unmap those gone or replaced."""
        try:
            names = sorted(n for n in os.listdir(self.directory) if parse_index_file_name(n) is not None)
        except FileNotFoundError:
            names = []
        known = {file.path.name: file for file in self._files}
        files: list[_IndexFile] = []
        for name in names:
            file = known.pop(name, None)
            if file is not None and file.identity != _identity(file.path):
                file.close()
                file = None
            if file is None:
                try:
                    file = self._open(self.directory / name)
                except BaseException:
                    for opened in (*files, *known.values()):
                        opened.close()
                    raise
            if file is not None:
                files.append(file)
        for gone in known.values():
            gone.close()
        self._files = files

    def files(self) -> list[str]:
        """Names of the index files, oldest first."""
        with self._lock:
            return [file.path.name for file in self._files]

    def _new_file(self) -> _IndexFile:
        now = now_ms()
        newest = parse_index_file_name(self._files[-1].path.name) if self._files else None
        created = max(now, newest + 1) if newest is not None else now
        file = _IndexFile.create(self.directory / index_file_name(created), self.slot_capacity, self.item_capacity)
        with self._lock:
            self._files.append(file)
        log.debug("hot index file created", path=str(file.path))
        return file

    # ---- writing -------------------------------------------------------------------------------------

    def add(self, topic: str, keys: Sequence[str], physical_offset: int, store_timestamp: int) -> None:
        """Index one record's keys (the caller serialises adds: the store's index lock)."""
        if not keys:
            return
        hashes = record_key_hashes(topic, keys)
        file = self._files[-1] if self._files else None
        if file is not None and file.index_count + len(hashes) <= file.item_capacity:
            file.add_record(hashes, physical_offset, store_timestamp)
            self._dirty.add(file)
            return
        count = len(hashes)
        self._add_arrays(
            np.array(hashes, dtype=np.int64),
            np.full(count, physical_offset, dtype=np.int64),
            np.full(count, store_timestamp, dtype=np.int64),
        )

    def add_many(self, entries: Sequence[KeyEntry]) -> None:
        """Index records' keys, in commit-log order: each file gets its items, header and slots in one write each."""
        counts = [len(keys) for _, keys, _, _ in entries]
        if sum(counts) < _BATCH_MIN_KEYS:
            for topic, keys, physical_offset, store_timestamp in entries:
                self.add(topic, keys, physical_offset, store_timestamp)
            return
        topic = entries[0][0]
        topics: str | list[str] = topic
        if any(entry[0] != topic for entry in entries):
            topics = [entry[0] for entry, count in zip(entries, counts, strict=True) for _ in range(count)]
        keys = [key for entry in entries for key in entry[1]]
        repeats = np.array(counts, dtype=np.int64)
        self._add_arrays(
            key_hashes(topics, keys),
            np.repeat(np.array([entry[2] for entry in entries], dtype=np.int64), repeats),
            np.repeat(np.array([entry[3] for entry in entries], dtype=np.int64), repeats),
        )

    def _add_arrays(self, hashes: Int64Array, offsets: Int64Array, stamps: Int64Array) -> None:
        file = self._files[-1] if self._files else None
        position = 0
        while position < len(hashes):
            if file is None or file.full:
                try:
                    file = self._new_file()
                except OSError as exc:  # StoreFullError among them: the put itself is stored already
                    log.error("hot key index file not created; keys left out of the hot index", error=str(exc))
                    return
            position += file.add_batch(hashes[position:], offsets[position:], stamps[position:])
            self._dirty.add(file)

    def reindex(self, scan: Iterable[tuple[int, int, MessageRecord] | ScanStop], end: int) -> None:
        """Add the keys of the records a commit-log ``scan`` yields below ``end``: records known sound (below
        the recovery start), of a store whose index is missing or was unusable."""
        indexed, begin = 0, None
        for item in scan:
            if isinstance(item, ScanStop) or item[0] >= end:
                break
            offset, _size, record = item
            begin = offset if begin is None else begin
            keys = record_index_keys(record)
            if keys:
                self.add(record.topic, keys, offset, record.store_timestamp)
                indexed += 1
        if begin is not None:
            log.info("hot key index rebuilt from the commit log", begin=begin, end=end, records=indexed)

    def flush(self) -> None:
        """Make every item added so far durable."""
        while self._dirty:
            file = self._dirty.pop()
            try:
                file.mapped.flush()
            except ValueError:
                continue  # deleted by retention since it was written
            if file.full:
                # Written for good and clean now: a lookup maps back what it reads, the writer's RSS
                # keeps only the file it is filling.
                file.mapped.release_pages(0, file.mapped.size)

    def recover(self, trusted_end: int) -> int:
        """After an unclean stop: keep the items of records below ``trusted_end`` (durable with the checkpoint).

        A torn file goes with every later one. Returns where the commit log must be re-indexed from:
        ``trusted_end``, or the end of the last sound file before a torn one (0 when there is none).
        """
        rescan_from = trusted_end
        with self._lock:
            for position, file in enumerate(self._files):
                if not file.holds_together():
                    rescan_from = min(rescan_from, self._files[position - 1].end_offset if position else 0)
                    for torn in self._files[position:]:
                        log.warning("hot index file torn; rebuilt from the commit log", path=str(torn.path))
                        torn.delete()
                    del self._files[position:]
                    break
            while self._files and (self._files[-1].empty or self._files[-1].begin_offset >= rescan_from):
                self._files.pop().delete()
        if self._files:
            dropped = self._files[-1].drop_items_from(rescan_from)
            if dropped:
                self._dirty.add(self._files[-1])
        fsync_directory(self.directory)
        return rescan_from

    def delete_below(self, commitlog_min_offset: int) -> list[str]:
        """Delete the files every record of which is gone from the hot commit log (the writer's last stays
        while it takes items); returns their names."""
        removed: list[str] = []
        with self._lock:
            while self._files:
                file = self._files[0]
                last = len(self._files) == 1
                if file.empty or file.end_offset >= commitlog_min_offset or (last and not file.full):
                    break
                self._files.pop(0)
                self._dirty.discard(file)
                file.delete()
                removed.append(file.path.name)
        if removed:
            fsync_directory(self.directory)
            log.info("hot index files deleted", files=removed)
        return removed

    # ---- reading -------------------------------------------------------------------------------------

    def lookup(self, topic: str, key: str, begin_timestamp: int, end_timestamp: int) -> Iterator[int]:
        """Commit-log offsets of records indexed under ``key`` of ``topic`` in the time range, newest first.

        A hash match only: the caller confirms each against the record's real keys. A file that does
        not read (corrupt) is skipped with a warning, so the other files still answer.
        """
        hash_value = key_hash(topic, key)
        with self._lock:
            if not self.writable:
                self._relist()
            files = list(self._files)
        for file in reversed(files):
            try:
                yield from _file_lookup(file, hash_value, begin_timestamp, end_timestamp)
            except CorruptRecordError as exc:
                log.warning("hot index file skipped in a lookup", path=str(file.path), error=str(exc))
            except ValueError:
                continue  # unmapped by retention or a relist while it was read

    def close(self) -> None:
        with self._lock:
            for file in self._files:
                file.close()
            self._files = []


def _file_lookup(file: _IndexFile, hash_value: int, begin_timestamp: int, end_timestamp: int) -> Iterator[int]:
    header = file.reader.header
    if header.index_count <= 1 or header.begin_timestamp > end_timestamp or header.end_timestamp < begin_timestamp:
        return
    for _, item in file.reader.chain(hash_value):
        stamp = header.begin_timestamp + item.time_diff_seconds * 1000
        if stamp + _SECOND_SLACK_MS < begin_timestamp:
            return  # a chain runs newest to oldest
        if item.key_hash == hash_value and stamp <= end_timestamp:
            yield item.physical_offset


def put_index_keys(keys: Sequence[str], properties: Mapping[str, str] | None) -> tuple[str, ...]:
    """The keys a validated put is indexed by: its UNIQ_KEY, then each of its KEYS (as RocketMQ adds them)."""
    listed = [keys] if isinstance(keys, str) else list(keys)
    if not listed and properties:
        listed = [key for key in properties.get(PROPERTY_KEYS, "").split(" ") if key]
    unique = properties.get(PROPERTY_UNIQ_KEY) if properties else None
    return (unique, *listed) if unique else tuple(listed)


def record_index_keys(record: MessageRecord) -> tuple[str, ...]:
    """The keys a stored record is indexed by, in the order ``put_index_keys`` gives them."""
    unique = record.unique_key
    return (unique, *record.keys) if unique else tuple(record.keys)


class KeyedRecord(NamedTuple):
    """A hot record found by key: its queue position, store timestamp, bytes and decoded form."""

    queue_id: int
    queue_offset: int
    store_timestamp: int
    raw: bytes
    record: MessageRecord


def whole_record(read: Callable[[int, int], bytes | None], offset: int) -> bytes | None:
    """The record at ``offset`` read through ``read(offset, length)`` (None when those bytes are not there),
    as long as its header says it is one; None otherwise."""
    head = read(offset, 8)
    if head is None or len(head) < 8:
        return None
    size, magic = record_size_at(head)
    if magic not in (MAGIC_V1, MAGIC_V2) or size < MIN_RECORD_SIZE:
        return None
    return read(offset, size)


def find_records(
    index: HotKeyIndex,
    topic: str,
    key: str,
    max_count: int,
    begin_timestamp: int,
    end_timestamp: int,
    record_at: Callable[[int], bytes | None],
) -> list[KeyedRecord]:
    """Up to ``max_count`` records of ``topic`` whose real keys (KEYS, UNIQ_KEY) include ``key``, newest first.

    ``record_at(offset)`` gives the record bytes at a commit-log offset, or None when they are gone.
    Each index hit is confirmed against the record itself (whole, at that offset, of that topic, stored
    in the range, with that key), so a hash collision or a stale item never returns another message.
    """
    found: list[KeyedRecord] = []
    seen: set[int] = set()
    for offset in index.lookup(topic, key, begin_timestamp, end_timestamp):
        if offset in seen:
            continue
        seen.add(offset)
        raw = record_at(offset)
        if raw is None:
            continue  # deleted by retention (or truncated by recovery) since it was indexed
        try:
            record = decode(raw, location=f"commitlog@{offset}")
        except CorruptRecordError:
            continue
        if (
            record.physical_offset != offset
            or record.topic != topic
            or not begin_timestamp <= record.store_timestamp <= end_timestamp
            or (key not in record.keys and record.unique_key != key)
        ):
            continue
        found.append(KeyedRecord(record.queue_id, record.queue_offset, record.store_timestamp, raw, record))
        if len(found) >= max_count:
            break
    found.sort(key=lambda hit: (hit.store_timestamp, hit.queue_id, hit.queue_offset), reverse=True)
    return found
