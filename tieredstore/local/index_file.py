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
record it indexes is gone from the hot commit log. One file's writes, drops and lookups are in
``key_index_file``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import structlog

from tieredstore.basics import now_ms
from tieredstore.directories import ensure_directory
from tieredstore.errors import CorruptRecordError, IntegrityError
from tieredstore.formats.index_file import (
    ROCKETMQ_DEFAULT_ITEMS,
    ROCKETMQ_DEFAULT_SLOTS,
    index_file_name,
    index_file_size,
    key_hash,
    key_hashes,
    parse_index_file_name,
    record_key_hashes,
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
from tieredstore.formats.records import Int64Array
from tieredstore.local.commit_log import ScanStop
from tieredstore.local.key_index_file import KeyIndexFile, file_identity, file_lookup
from tieredstore.local.mapped_file import MappedFile, fsync_directory

log = structlog.get_logger(__name__)

# A key entry to add: topic, its keys, the record's commit-log offset and its store timestamp.
KeyEntry = tuple[str, Sequence[str], int, int]
# Below this many keys a batch is indexed record by record: array set-up costs more than it saves.
_BATCH_MIN_KEYS = 16


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
        self._files: list[KeyIndexFile] = []
        self._refused: set[str] = set()
        self._dirty: set[KeyIndexFile] = set()
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

    def _open(self, path: Path) -> KeyIndexFile | None:
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
                return KeyIndexFile(path, mapped, *capacities)
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
        files: list[KeyIndexFile] = []
        for name in names:
            file = known.pop(name, None)
            if file is not None and file.identity != file_identity(file.path):
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

    def _new_file(self) -> KeyIndexFile:
        now = now_ms()
        newest = parse_index_file_name(self._files[-1].path.name) if self._files else None
        created = max(now, newest + 1) if newest is not None else now
        file = KeyIndexFile.create(self.directory / index_file_name(created), self.slot_capacity, self.item_capacity)
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
                yield from file_lookup(file, hash_value, begin_timestamp, end_timestamp)
            except CorruptRecordError as exc:
                log.warning("hot index file skipped in a lookup", path=str(file.path), error=str(exc))
            except ValueError:
                continue  # unmapped by retention or a relist while it was read

    def close(self) -> None:
        with self._lock:
            for file in self._files:
                file.close()
            self._files = []


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
