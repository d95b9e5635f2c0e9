"""The key-index service: indexes archived messages by ``topic#key``, rolls files to cold storage, answers lookups.

Life of an index file (``IndexFileStatus``)::

    UNSEALED   local, taking items           --full or older than index_seal_interval-->  SEALED
    SEALED     local, immutable               --compacted, then uploaded as INDEX segment-->  UPLOAD
    UPLOAD     in cold storage only           --its whole interval is older than retention-->  (removed)

Compaction writes ``<id>.compacted`` beside the sealed ``<id>.index`` through a temp file and a rename,
so a SEALED file whose compacted twin exists only needs uploading; the local files are removed only
after the upload has committed and the catalogue says UPLOAD. Every state change is written to an
``IndexCatalogue`` first, so a restart (``start``) resumes from the catalogue and the index directory
whatever step was interrupted.

Lookups choose files whose [begin, end] time interval overlaps the query (not by start time), newest
first, and confirm every hash hit against the message's real keys before returning it.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Protocol, TypeVar, runtime_checkable

from tieredstore.basics import MIB, now_ms
from tieredstore.config import IndexSettings
from tieredstore.errors import IntegrityError, ReadOnlyError, ValidationError
from tieredstore.formats.index_file import key_hash
from tieredstore.formats.message import MessageRecord
from tieredstore.formats.naming import FileType, index_path
from tieredstore.index.file import (
    CompactedIndexFile,
    UnsealedIndexFile,
    compact_file,
    fsync_directory,
    lookup_segment,
    select_items,
)
from tieredstore.index.format import CompactedHeader, IndexItem
from tieredstore.providers.base import Provider

logger = logging.getLogger(__name__)


class IndexFileStatus(enum.StrEnum):
    """Where an index file is in its life; the values match the metadata store's."""

    UNSEALED = "UNSEALED"
    SEALED = "SEALED"
    UPLOAD = "UPLOAD"


@dataclass(frozen=True, slots=True)
class IndexFileRecord:
    """What the catalogue keeps about one index file. ``size`` is the compacted size once uploaded."""

    file_id: int
    status: IndexFileStatus
    created: int
    begin_timestamp: int | None = None
    end_timestamp: int | None = None
    item_count: int = 0
    size: int = 0

    def overlaps(self, begin_timestamp: int, end_timestamp: int) -> bool:
        """Whether any item of this file can lie in [begin, end] (an empty file overlaps nothing)."""
        if self.begin_timestamp is None or self.end_timestamp is None or self.item_count == 0:
            return False
        return self.begin_timestamp <= end_timestamp and self.end_timestamp >= begin_timestamp

    def compacted_header(self) -> CompactedHeader:
        if self.begin_timestamp is None or self.end_timestamp is None:
            raise IntegrityError(f"index file {self.file_id} is catalogued as uploaded without a time interval")
        return CompactedHeader.from_catalogue(
            self.file_id,
            begin_timestamp=self.begin_timestamp,
            end_timestamp=self.end_timestamp,
            item_count=self.item_count,
            size=self.size,
        )


@runtime_checkable
class IndexCatalogue(Protocol):
    """Where index-file records are kept durably (the metadata store implements this too).

    Each call is one short, durable change; calls may come from worker threads.
    """

    def list_files(self) -> list[IndexFileRecord]:
        """Every record, in ascending file id."""
        ...

    def save(self, record: IndexFileRecord) -> None:
        """Insert or replace the record with ``record.file_id``."""
        ...

    def remove(self, file_id: int) -> None:
        """Forget the record; removing an unknown id is not an error."""
        ...


class MemoryIndexCatalogue:
    """An in-process catalogue (tests, and services that rebuild their index on every start)."""

    def __init__(self) -> None:
        self._records: dict[int, IndexFileRecord] = {}
        self._lock = threading.Lock()

    def list_files(self) -> list[IndexFileRecord]:
        with self._lock:
            return [self._records[file_id] for file_id in sorted(self._records)]

    def save(self, record: IndexFileRecord) -> None:
        with self._lock:
            self._records[record.file_id] = record

    def remove(self, file_id: int) -> None:
        with self._lock:
            self._records.pop(file_id, None)


class JsonIndexCatalogue:
    """A catalogue in one JSON file, rewritten atomically (temp file, fsync, rename) on every change."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._records = self._load()

    def _load(self) -> dict[int, IndexFileRecord]:
        try:
            raw = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        try:
            document = json.loads(raw)
            records = [
                IndexFileRecord(**{**entry, "status": IndexFileStatus(entry["status"])}) for entry in document["files"]
            ]
        except (ValueError, KeyError, TypeError) as exc:
            raise IntegrityError(f"index catalogue {self.path} does not decode: {exc}") from exc
        return {record.file_id: record for record in records}

    def _write(self) -> None:
        document = {"version": 1, "files": [asdict(self._records[file_id]) for file_id in sorted(self._records)]}
        temp_path = self.path.with_name(self.path.name + ".tmp")
        with temp_path.open("w", encoding="utf-8") as handle:
            json.dump(document, handle, indent=1)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp_path, self.path)
        fsync_directory(self.path.parent)

    def list_files(self) -> list[IndexFileRecord]:
        with self._lock:
            return [self._records[file_id] for file_id in sorted(self._records)]

    def save(self, record: IndexFileRecord) -> None:
        with self._lock:
            self._records[record.file_id] = record
            self._write()

    def remove(self, file_id: int) -> None:
        with self._lock:
            if self._records.pop(file_id, None) is not None:
                self._write()


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """One archived message to index: where it is, when it was stored, and its keys (KEYS and UNIQ_KEY)."""

    topic: str
    topic_id: int
    queue_id: int
    queue_offset: int
    size: int
    timestamp: int
    keys: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class IndexHit:
    """A message whose keys really contain the key asked for."""

    topic_id: int
    queue_id: int
    queue_offset: int
    size: int
    timestamp: int


ConfirmKeys = Callable[[int, int, int], Awaitable[Sequence[str]]]
"""``confirm(topic_id, queue_id, queue_offset)``: the keys the stored message really has ([] if it is gone)."""


class _Found(Protocol):
    @property
    def record(self) -> MessageRecord: ...


FoundT = TypeVar("FoundT", bound=_Found)


def newest_first(messages: Iterable[FoundT], max_count: int) -> list[FoundT]:
    """The ``max_count`` most recently stored of ``messages`` found by key (from either tier), newest first."""
    ordered = sorted(
        messages, key=lambda m: (m.record.store_timestamp, m.record.queue_id, m.record.queue_offset), reverse=True
    )
    return ordered[:max_count]


def namespace_path(broker_index_path: str, namespace: str) -> str:
    """Where a namespace's index files live in cold storage (and its catalogue rows): ``<index path>[/<ns>]``."""
    return f"{broker_index_path}/{namespace}" if namespace else broker_index_path


async def stored_namespaces(provider: Provider, broker_index_path: str) -> set[str]:
    """The namespaces whose folders cold storage holds beside the root's own INDEX folder."""
    return {child for child in await provider.list_children(broker_index_path) if child != FileType.INDEX.value}


class IndexService:
    """Holds the current unsealed file, moves sealed files to cold storage and answers key lookups."""

    def __init__(
        self,
        directory: Path,
        provider: Provider,
        *,
        cluster: str,
        broker: str,
        catalogue: IndexCatalogue | None = None,
        settings: IndexSettings | None = None,
        upload_chunk_size: int = 8 * MIB,
        clock: Callable[[], int] = now_ms,
        read_only: bool = False,
        namespace: str = "",
    ) -> None:
        if upload_chunk_size < 1:
            raise ValidationError(f"upload_chunk_size must be positive, got {upload_chunk_size}")
        self.directory = directory
        self.provider = provider
        # Archivers sharing queues by lease each write their own namespace (see ``index.namespaces``);
        # the single archiver writes the broker's index path itself.
        self.namespace = namespace
        self.index_path = namespace_path(index_path(cluster, broker), namespace)
        self.settings = settings or IndexSettings()
        self.upload_chunk_size = upload_chunk_size
        self._catalogue: IndexCatalogue = catalogue or JsonIndexCatalogue(directory / "catalogue.json")
        self._clock = clock
        self._records: dict[int, IndexFileRecord] = {}
        self._current: UnsealedIndexFile | None = None
        self._readers: dict[int, UnsealedIndexFile] = {}
        self._write_lock = asyncio.Lock()
        self._maintain_lock = asyncio.Lock()
        self._started = False
        # A reader beside the archiver that owns the directory: queries only, nothing on disk is touched.
        self.read_only = read_only

    # ---- paths --------------------------------------------------------------------------------------

    def _sealed_path(self, file_id: int) -> Path:
        return self.directory / f"{file_id:020d}.index"

    def _compacted_path(self, file_id: int) -> Path:
        return self.directory / f"{file_id:020d}.compacted"

    # ---- start and stop -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Recover from the catalogue and the index directory; resumes any interrupted seal/compact/upload.

        A read-only service only loads the catalogue: the archiver that owns the directory does the rest.
        """
        await asyncio.to_thread(self._reload_catalogue if self.read_only else self._recover)
        self._started = True

    def _reload_catalogue(self) -> None:
        """Read-only: take the catalogue as the owner last wrote it (new files, seals, uploads, deletions)."""
        records = {record.file_id: record for record in self._catalogue.list_files()}
        for file_id in [
            f for f in self._readers if records.get(f) is None or records[f].status is IndexFileStatus.UPLOAD
        ]:
            self._readers.pop(file_id).close()
        self._records = records

    def _refuse_if_read_only(self, what: str) -> None:
        if self.read_only:
            raise ReadOnlyError(f"cannot {what}: this index service reads a directory another process owns")

    def _recover(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        for stale in self.directory.glob("*.tmp"):
            stale.unlink()
        unsealed: list[IndexFileRecord] = []
        for record in self._catalogue.list_files():
            sealed_path = self._sealed_path(record.file_id)
            if record.status is IndexFileStatus.UPLOAD:
                sealed_path.unlink(missing_ok=True)
                self._compacted_path(record.file_id).unlink(missing_ok=True)
            elif not sealed_path.exists():
                # only a file whose create never completed: its record is written first
                logger.warning("index file %s has no local file; forgetting it", record.file_id)
                self._catalogue.remove(record.file_id)
                continue
            elif record.status is IndexFileStatus.UNSEALED:
                unsealed.append(record)
                continue
            self._records[record.file_id] = record
        for position, record in enumerate(unsealed):
            index_file = UnsealedIndexFile.open(self._sealed_path(record.file_id))
            self._records[record.file_id] = record
            if position == len(unsealed) - 1 and not index_file.is_sealed:
                self._current = index_file
            else:
                # an older file left unsealed, or one sealed on disk just before the catalogue heard of it
                self._seal(index_file)

    async def close(self) -> None:
        """Flush the current file and release every local file; the service can be started again."""
        async with self._write_lock:
            if self._current is not None:
                current = self._current
                await asyncio.to_thread(current.flush)
                current.close()
                self._current = None
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()
        self._records.clear()
        self._started = False

    # ---- records ------------------------------------------------------------------------------------

    def files(self) -> list[IndexFileRecord]:
        """Every index file, oldest first; the current file's counts are live.

        Read-only, a file the owner is still filling is catalogued without its time range: its counts
        are then read from the local file's header where there is one.
        """
        return [self._live_record(file_id) for file_id in sorted(self._records)]

    def _live_record(self, file_id: int) -> IndexFileRecord:
        record = self._records[file_id]
        current = self._current
        if self.read_only and record.status is IndexFileStatus.UNSEALED:
            try:
                current = self._local_reader(record)
            except (FileNotFoundError, IntegrityError):
                return record  # on another machine, or just being created: the catalogue is all there is
        if current is not None and current.file_id == file_id and current.item_count:
            return replace(
                record,
                begin_timestamp=current.begin_timestamp,
                end_timestamp=current.end_timestamp,
                item_count=current.item_count,
            )
        return record

    def _save(self, record: IndexFileRecord) -> None:
        self._catalogue.save(record)
        self._records[record.file_id] = record

    # ---- writes -------------------------------------------------------------------------------------

    async def put(self, entries: Iterable[IndexEntry]) -> int:
        """Index every key of every entry (``topic#key``) and make it durable; returns items written.

        Call after the entries' commit succeeded. A full or old current file is sealed and a new one
        started; sealed files go to cold storage on ``maintain``.
        """
        self._refuse_if_read_only("index messages")
        self._require_started()
        batch = list(entries)
        async with self._write_lock:
            return await asyncio.to_thread(self._put_batch, batch)

    def _put_batch(self, entries: list[IndexEntry]) -> int:
        written = 0
        for entry in entries:
            for key in dict.fromkeys(entry.keys):
                if not key:
                    continue
                item = IndexItem(
                    topic_id=entry.topic_id,
                    queue_id=entry.queue_id,
                    queue_offset=entry.queue_offset,
                    size=entry.size,
                    key_hash=key_hash(entry.topic, key),
                    timestamp=entry.timestamp,
                )
                self._put_item(item)
                written += 1
        if self._current is not None:
            self._current.flush()
        return written

    def _put_item(self, item: IndexItem) -> None:
        current = self._current
        if current is not None and current.item_count and self._is_old(current):
            self._seal(current)
            current = None
        if current is not None and current.put(item):
            return
        if current is not None:
            self._seal(current)
        current = self._create_file(item.timestamp)
        if not current.put(item):
            raise ValidationError(f"index item {item} does not fit an empty index file")

    def _is_old(self, index_file: UnsealedIndexFile) -> bool:
        return self._clock() - index_file.created_at >= self.settings.index_seal_interval * 1000

    def _create_file(self, base_timestamp: int) -> UnsealedIndexFile:
        now = self._clock()
        file_id = max([now, *(known + 1 for known in self._records)])
        self._save(IndexFileRecord(file_id=file_id, status=IndexFileStatus.UNSEALED, created=now))
        self._current = UnsealedIndexFile.create(
            self._sealed_path(file_id),
            file_id=file_id,
            created_at=now,
            base_timestamp=base_timestamp,
            slot_count=self.settings.index_slot_count,
            max_items=self.settings.index_max_items,
        )
        return self._current

    def _seal(self, index_file: UnsealedIndexFile) -> None:
        index_file.seal()
        record = self._records[index_file.file_id]
        self._save(
            replace(
                record,
                status=IndexFileStatus.SEALED,
                begin_timestamp=index_file.begin_timestamp if index_file.item_count else None,
                end_timestamp=index_file.end_timestamp if index_file.item_count else None,
                item_count=index_file.item_count,
            )
        )
        self._readers[index_file.file_id] = index_file
        if self._current is index_file:
            self._current = None

    async def seal_current(self) -> None:
        """Seal the file being filled whatever its age, so that the next ``maintain`` uploads everything.

        For a namespace nobody writes any more (its archiver is gone): its items then reach cold storage.
        """
        self._refuse_if_read_only("seal index files")
        self._require_started()
        async with self._write_lock:
            current = self._current
            if current is not None:
                await asyncio.to_thread(self._seal, current)

    # ---- sealing, compaction and upload -------------------------------------------------------------

    async def maintain(self) -> list[int]:
        """Seal the current file if it is old, then compact and upload every sealed file; returns uploaded ids.

        A storage error stops the pass and is raised; everything done so far is recorded, and the
        next pass carries on from there.
        """
        self._refuse_if_read_only("seal, compact or upload index files")
        self._require_started()
        async with self._maintain_lock:
            async with self._write_lock:
                current = self._current
                if current is not None and current.item_count and self._is_old(current):
                    await asyncio.to_thread(self._seal, current)
            uploaded = []
            for file_id in sorted(self._records):
                record = self._records.get(file_id)
                if record is None or record.status is not IndexFileStatus.SEALED:
                    continue
                if record.item_count == 0:
                    async with self._write_lock:
                        await self._forget(record)
                    continue
                await self._upload(record)
                uploaded.append(file_id)
            return uploaded

    async def _upload(self, record: IndexFileRecord) -> None:
        compacted_path = self._compacted_path(record.file_id)
        if not compacted_path.exists():
            await asyncio.to_thread(compact_file, self._sealed_path(record.file_id), compacted_path)
        header = await asyncio.to_thread(self._read_compacted_header, compacted_path)
        size = header.file_size
        segment = self.provider.segment(FileType.INDEX, self.index_path, record.file_id)
        position = await segment.correct_commit_position()
        if position > size:
            # bytes from some other file under this name; ours replaces them
            await segment.destroy()
            segment = self.provider.segment(FileType.INDEX, self.index_path, record.file_id)
            position = 0
        chunk_size = self.upload_chunk_size
        while position < size:
            chunk = await asyncio.to_thread(_read_range, compacted_path, position, min(chunk_size, size - position))
            segment.append(chunk)
            await segment.commit()
            position += len(chunk)
        uploaded = replace(
            record,
            status=IndexFileStatus.UPLOAD,
            begin_timestamp=header.begin_timestamp,
            end_timestamp=header.end_timestamp,
            item_count=header.item_count,
            size=size,
        )
        async with self._write_lock:
            await asyncio.to_thread(self._save, uploaded)
            await asyncio.to_thread(self._remove_local, record.file_id)

    @staticmethod
    def _read_compacted_header(path: Path) -> CompactedHeader:
        with CompactedIndexFile(path) as compacted:
            return compacted.header

    def _remove_local(self, file_id: int) -> None:
        reader = self._readers.pop(file_id, None)
        if reader is not None:
            reader.close()
        self._compacted_path(file_id).unlink(missing_ok=True)
        self._sealed_path(file_id).unlink(missing_ok=True)
        fsync_directory(self.directory)

    async def _forget(self, record: IndexFileRecord, *, local: bool = True) -> None:
        """Delete a file from cold storage, the index directory (``local``) and the catalogue; under the write lock."""
        if record.status is IndexFileStatus.UPLOAD:
            await self.provider.segment(FileType.INDEX, self.index_path, record.file_id).destroy()
        if local:
            await asyncio.to_thread(self._remove_local, record.file_id)
        await asyncio.to_thread(self._catalogue.remove, record.file_id)
        self._records.pop(record.file_id, None)

    # ---- retention ----------------------------------------------------------------------------------

    def _expired(self, before_timestamp: int, *, uploaded_only: bool) -> list[IndexFileRecord]:
        """Files whose newest item is older than ``before_timestamp`` (live counts for the current file)."""
        return [
            record
            for record in self.files()
            if record.item_count
            and record.end_timestamp is not None
            and record.end_timestamp < before_timestamp
            and (record.status is IndexFileStatus.UPLOAD or not uploaded_only)
        ]

    async def expired_files(self, before_timestamp: int, *, uploaded_only: bool = False) -> list[int]:
        """The ids ``delete_expired`` would remove now, changing nothing (a dry run)."""
        self._require_started()
        if self.read_only:
            await asyncio.to_thread(self._reload_catalogue)
        return [record.file_id for record in self._expired(before_timestamp, uploaded_only=uploaded_only)]

    async def delete_expired(
        self, before_timestamp: int, *, uploaded_only: bool = False, local_only: bool = False
    ) -> list[int]:
        """Delete every index file whose newest item is older than ``before_timestamp``; returns their ids.

        Cold bytes go first, then local files, then the record, so an interrupted deletion is finished
        by the next call instead of leaving a record that points at nothing. ``uploaded_only`` is
        retention of a namespace whose archiver runs elsewhere, or is gone, and is allowed read-only:
        its uploaded files are immutable, so deleting them cannot race a write, and its local files
        are left to their owner. ``local_only`` is the converse, for an owner whose uploaded files
        another archiver deletes (``KeyIndex.delete_expired``): it stops answering from them, and
        returns only the ids it deleted itself.
        """
        if not uploaded_only:
            self._refuse_if_read_only("delete index files")
        self._require_started()
        if self.read_only:
            await asyncio.to_thread(self._reload_catalogue)
        removed = []
        async with self._maintain_lock, self._write_lock:
            for record in self._expired(before_timestamp, uploaded_only=uploaded_only):
                if local_only and record.status is IndexFileStatus.UPLOAD:
                    self._records.pop(record.file_id, None)
                    continue
                current = self._current
                if current is not None and current.file_id == record.file_id:
                    current.close()
                    self._current = None
                await self._forget(record, local=not uploaded_only)
                removed.append(record.file_id)
        return removed

    # ---- lookups ------------------------------------------------------------------------------------

    async def query(
        self,
        topic: str,
        topic_id: int,
        key: str,
        max_count: int,
        begin_timestamp: int,
        end_timestamp: int,
        confirm: ConfirmKeys,
    ) -> list[IndexHit]:
        """Messages of ``topic`` whose keys include ``key``, stored in [begin, end], newest files first.

        At most ``max_count`` hits; each hash match is confirmed with ``confirm`` before it counts.
        """
        self._require_started()
        if max_count < 1:
            raise ValidationError(f"max_count must be at least 1, got {max_count}")
        if begin_timestamp > end_timestamp:
            raise ValidationError(f"begin timestamp {begin_timestamp} is after end timestamp {end_timestamp}")
        if not key:
            raise ValidationError("the key to look up is empty")
        hash_value = key_hash(topic, key)
        if self.read_only:
            await asyncio.to_thread(self._reload_catalogue)
        candidates = [record for record in self.files() if self._may_hold(record, begin_timestamp, end_timestamp)]
        # A file still being filled has no end timestamp in the catalogue yet: it is the newest.
        candidates.sort(
            key=lambda r: (r.end_timestamp if r.end_timestamp is not None else 2**63, r.file_id), reverse=True
        )
        hits: list[IndexHit] = []
        seen: set[tuple[int, int]] = set()
        for candidate in candidates:
            items = await self._lookup_file(candidate.file_id, hash_value)
            for item in select_items(items, topic_id, begin_timestamp, end_timestamp):
                where = (item.queue_id, item.queue_offset)
                if where in seen:
                    continue
                seen.add(where)
                if key not in await confirm(item.topic_id, item.queue_id, item.queue_offset):
                    continue
                hits.append(IndexHit(item.topic_id, item.queue_id, item.queue_offset, item.size, item.timestamp))
                if len(hits) >= max_count:
                    return hits
        return hits

    def _may_hold(self, record: IndexFileRecord, begin_timestamp: int, end_timestamp: int) -> bool:
        # A reader cannot see the live counts of a file the owner is still filling: its catalogue
        # record's time range is stale, so such a file is always a candidate.
        if self.read_only and record.status is IndexFileStatus.UNSEALED:
            return record.begin_timestamp is None or record.begin_timestamp <= end_timestamp
        return record.overlaps(begin_timestamp, end_timestamp)

    async def _lookup_file(self, file_id: int, hash_value: int) -> list[IndexItem]:
        """Items with ``hash_value`` in one file, read from wherever the file is now."""
        async with self._write_lock:
            current = self._current
            if current is not None and current.file_id == file_id:
                return current.lookup(hash_value)
            record = self._records.get(file_id)
            if record is None:
                return []  # deleted by retention while the query ran
            if record.status is not IndexFileStatus.UPLOAD:
                try:
                    return self._local_reader(record).lookup(hash_value)
                except FileNotFoundError:
                    if not self.read_only:
                        raise
            if self.read_only and record.status is not IndexFileStatus.UPLOAD:
                # The owner uploaded it and removed the local file since the catalogue was read.
                self._reload_catalogue()
                record = self._records.get(file_id)
                if record is None or record.status is not IndexFileStatus.UPLOAD:
                    return []
        segment = self.provider.segment(FileType.INDEX, self.index_path, file_id, commit_position=record.size)
        return await lookup_segment(segment, record.compacted_header(), hash_value)

    def _local_reader(self, record: IndexFileRecord) -> UnsealedIndexFile:
        reader = self._readers.get(record.file_id)
        if reader is None:
            reader = UnsealedIndexFile.open(self._sealed_path(record.file_id), writable=False)
            self._readers[record.file_id] = reader
        return reader

    def _require_started(self) -> None:
        if not self._started:
            raise ValidationError("the index service is not started; call start() first")


def _read_range(path: Path, position: int, length: int) -> bytes:
    with path.open("rb") as handle:
        handle.seek(position)
        data = handle.read(length)
    if len(data) != length:
        raise IntegrityError(f"{path} ended after {position + len(data)} bytes; expected {position + length}")
    return data
