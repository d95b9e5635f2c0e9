"""The catalogue of index files: each file's state and counts, and where those records are kept durably.

``IndexService`` writes every state change of an index file here before acting on it, so that a restart
resumes from the catalogue; ``MetadataIndexCatalogue`` (``index.catalogue``) keeps the same records in
the metadata database.
"""

from __future__ import annotations

import enum
import json
import os
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from tieredstore.errors import IntegrityError
from tieredstore.index.file import fsync_directory
from tieredstore.index.format import CompactedHeader


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
    key_id: str | None = None  # the key-encryption key wrapping the uploaded file's data key

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
            self._changed()

    def remove(self, file_id: int) -> None:
        with self._lock:
            if self._records.pop(file_id, None) is not None:
                self._changed()

    def _changed(self) -> None:
        """Called under the lock after every change; a durable catalogue writes itself out here."""


class JsonIndexCatalogue(MemoryIndexCatalogue):
    """A catalogue in one JSON file, rewritten atomically (temp file, fsync, rename) on every change."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
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

    def _changed(self) -> None:
        document = {"version": 1, "files": [asdict(self._records[file_id]) for file_id in sorted(self._records)]}
        temp_path = self.path.with_name(self.path.name + ".tmp")
        with temp_path.open("w", encoding="utf-8") as handle:
            json.dump(document, handle, indent=1)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp_path, self.path)
        fsync_directory(self.path.parent)
