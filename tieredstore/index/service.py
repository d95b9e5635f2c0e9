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
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from tieredstore.basics import MIB, now_ms
from tieredstore.config import IndexSettings
from tieredstore.errors import IntegrityError, ValidationError
from tieredstore.formats.index_file import key_hash
from tieredstore.formats.naming import FileType, index_path
from tieredstore.index.file import CompactedIndexFile, UnsealedIndexFile, compact_file
from tieredstore.index.format import CompactedHeader, IndexItem

# Callers and tests import the catalogue types and lookup results from here: re-exported by alias.
from tieredstore.index.lookups import ConfirmKeys as ConfirmKeys
from tieredstore.index.lookups import IndexHit as IndexHit
from tieredstore.index.lookups import IndexLookups
from tieredstore.index.lookups import newest_first as newest_first
from tieredstore.index.records import IndexCatalogue as IndexCatalogue
from tieredstore.index.records import IndexFileRecord as IndexFileRecord
from tieredstore.index.records import IndexFileStatus as IndexFileStatus
from tieredstore.index.records import JsonIndexCatalogue as JsonIndexCatalogue
from tieredstore.index.records import MemoryIndexCatalogue as MemoryIndexCatalogue
from tieredstore.index.retention import IndexRetention
from tieredstore.providers.base import FileSegment, Provider

logger = logging.getLogger(__name__)


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


def namespace_path(broker_index_path: str, namespace: str) -> str:
    """Where a namespace's index files live in cold storage (and its catalogue rows): ``<index path>[/<ns>]``."""
    return f"{broker_index_path}/{namespace}" if namespace else broker_index_path


async def stored_namespaces(provider: Provider, broker_index_path: str) -> set[str]:
    """The namespaces whose folders cold storage holds beside the root's own INDEX folder."""
    return {child for child in await provider.list_children(broker_index_path) if child != FileType.INDEX.value}


class IndexService(IndexLookups, IndexRetention):
    """Holds the current unsealed file, moves sealed files to cold storage and answers key lookups.

    Put together from mixins over the state they share (``service_state``): lookups (``lookups``) and
    retention (``retention``); this module keeps starting, writing, sealing and uploading.
    """

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

    # ---- start and stop -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Recover from the catalogue and the index directory; resumes any interrupted seal/compact/upload.

        A read-only service only loads the catalogue: the archiver that owns the directory does the rest.
        """
        await asyncio.to_thread(self._reload_catalogue if self.read_only else self._recover)
        self._started = True

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
            key_id=_wrapping_key_id(self.provider, segment),
        )
        async with self._write_lock:
            await asyncio.to_thread(self._save, uploaded)
            await asyncio.to_thread(self._remove_local, record.file_id)

    @staticmethod
    def _read_compacted_header(path: Path) -> CompactedHeader:
        with CompactedIndexFile(path) as compacted:
            return compacted.header


def _wrapping_key_id(provider: Provider, segment: FileSegment) -> str | None:
    """The key id the provider's codecs wrap a new segment's data key under; None when they do not encrypt."""
    codec = provider.codecs.for_segment(segment.segment_id)
    return provider.codecs.keyring.active if codec is not None and codec.encrypt else None


def _read_range(path: Path, position: int, length: int) -> bytes:
    with path.open("rb") as handle:
        handle.seek(position)
        data = handle.read(length)
    if len(data) != length:
        raise IntegrityError(f"{path} ended after {position + len(data)} bytes; expected {position + length}")
    return data
