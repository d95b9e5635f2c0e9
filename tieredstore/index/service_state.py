"""What every part of IndexService shares: its catalogue, files and locks, and the steps all parts take.

``IndexService`` is put together from mixins, one concern each (lookups, retention); this base declares
the state they share, so each is checked against it on its own.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

from tieredstore.config import IndexSettings
from tieredstore.errors import IntegrityError, ReadOnlyError, ValidationError
from tieredstore.formats.naming import FileType
from tieredstore.index.file import UnsealedIndexFile, fsync_directory
from tieredstore.index.records import IndexCatalogue, IndexFileRecord, IndexFileStatus
from tieredstore.providers.base import Provider


class IndexServiceState:
    """The state of an IndexService (set by its ``__init__``) and the steps its parts share."""

    directory: Path
    provider: Provider
    namespace: str
    index_path: str
    settings: IndexSettings
    upload_chunk_size: int
    read_only: bool
    _catalogue: IndexCatalogue
    _records: dict[int, IndexFileRecord]
    _current: UnsealedIndexFile | None
    _readers: dict[int, UnsealedIndexFile]
    _write_lock: asyncio.Lock
    _maintain_lock: asyncio.Lock
    _started: bool

    # ---- paths and modes ----------------------------------------------------------------------------

    def _sealed_path(self, file_id: int) -> Path:
        return self.directory / f"{file_id:020d}.index"

    def _compacted_path(self, file_id: int) -> Path:
        return self.directory / f"{file_id:020d}.compacted"

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

    def _local_reader(self, record: IndexFileRecord) -> UnsealedIndexFile:
        reader = self._readers.get(record.file_id)
        if reader is None:
            reader = UnsealedIndexFile.open(self._sealed_path(record.file_id), writable=False)
            self._readers[record.file_id] = reader
        return reader

    def _require_started(self) -> None:
        if not self._started:
            raise ValidationError("the index service is not started; call start() first")
