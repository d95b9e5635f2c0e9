"""MetadataIndexCatalogue: the key index's catalogue kept in the metadata database's ``index_files`` table.

With it, index-file state (UNSEALED → SEALED → UPLOAD, time interval, item count, uploaded size)
survives a restart in SQLite or PostgreSQL next to the segments it describes, instead of in a JSON
file in the index directory. Rows are named ``<index path>/<20-digit file id>``, so brokers sharing
one database keep their index files apart; a namespace's rows (archivers sharing queues by lease,
see ``tieredstore.index.namespaces``) are ``<index path>/<namespace>/<20-digit file id>``.
"""

from __future__ import annotations

from dataclasses import replace

from tieredstore.errors import IntegrityError, NotFoundError
from tieredstore.index.service import IndexFileRecord, IndexFileStatus
from tieredstore.metadata import IndexFileRecord as MetadataIndexFileRecord
from tieredstore.metadata import IndexFileStatus as MetadataIndexFileStatus
from tieredstore.metadata import MetadataStore

_LIVE_STATUSES = (MetadataIndexFileStatus.UNSEALED, MetadataIndexFileStatus.SEALED, MetadataIndexFileStatus.UPLOAD)


class MetadataIndexCatalogue:
    """An ``IndexCatalogue`` over ``MetadataStore``'s index-file records; every call is one short transaction.

    ``created`` of a listed record is the time the row was inserted (the database keeps no other);
    the index service reads a file's age from the file itself, so nothing depends on it.
    """

    def __init__(self, metadata: MetadataStore, index_path: str) -> None:
        self.metadata = metadata
        self.prefix = index_path.rstrip("/") + "/"

    def _name(self, file_id: int) -> str:
        return f"{self.prefix}{file_id:020d}"

    def _record(self, row: MetadataIndexFileRecord) -> IndexFileRecord:
        suffix = row.name[len(self.prefix) :]
        if not suffix.isdigit():
            raise IntegrityError(f"index file row {row.name!r} does not end in a file id")
        return IndexFileRecord(
            file_id=int(suffix),
            status=IndexFileStatus(row.status.value),
            created=row.created,
            begin_timestamp=row.begin_timestamp,
            end_timestamp=row.end_timestamp,
            item_count=row.item_count,
            size=row.size,
            key_id=row.key_id,
        )

    def list_files(self) -> list[IndexFileRecord]:
        rows = self.metadata.list_index_files(statuses=_LIVE_STATUSES, prefix=self.prefix)
        # A nested name belongs to a namespace under this prefix, which has a catalogue of its own.
        records = [self._record(row) for row in rows if _is_own(row, self.prefix)]
        return sorted(records, key=lambda record: record.file_id)

    def save(self, record: IndexFileRecord) -> None:
        name = self._name(record.file_id)
        try:
            self._update(name, record)
        except NotFoundError:
            created = self.metadata.add_index_file(name, begin_timestamp=record.begin_timestamp)
            if self._record(created) != replace(record, created=created.created):
                self._update(name, record)

    def _update(self, name: str, record: IndexFileRecord) -> None:
        # None leaves a column as it is: the service never moves a timestamp back to unknown.
        self.metadata.update_index_file(
            name,
            status=MetadataIndexFileStatus(record.status.value),
            begin_timestamp=record.begin_timestamp,
            end_timestamp=record.end_timestamp,
            item_count=record.item_count,
            size=record.size,
            key_id=record.key_id,
        )

    def remove(self, file_id: int) -> None:
        self.metadata.delete_index_file(self._name(file_id))

    def namespaces(self) -> set[str]:
        """The namespaces under this prefix that have live index files (not this catalogue's own)."""
        rows = self.metadata.list_index_files(statuses=_LIVE_STATUSES, prefix=self.prefix)
        found = set()
        for row in rows:
            if not _is_own(row, self.prefix):
                found.add(row.name[len(self.prefix) :].split("/", 1)[0])
        return found


def _is_own(row: MetadataIndexFileRecord, prefix: str) -> bool:
    return "/" not in row.name[len(prefix) :]
