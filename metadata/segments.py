"""Segments and index files: the rows that say which cold objects hold a queue's bytes and keys.

Segment changes of a writer under a lease name the epoch it holds (``expected_epoch``) and are refused
with LeaseLostError in their own transaction once another archiver has taken the queue over.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache

from sqlalchemy import BindParameter, Select, Update, bindparam, delete, func, or_, select, update
from sqlalchemy.exc import IntegrityError as SqlIntegrityError
from sqlalchemy.orm import Session

from tieredstore.errors import MetadataError, NotFoundError, ValidationError
from tieredstore.metadata.database import Database
from tieredstore.metadata.leases import require_epoch
from tieredstore.metadata.models import IndexFile, IndexFileStatus, Segment, SegmentFileType, SegmentStatus
from tieredstore.metadata.records import (
    LIVE_SEGMENT_STATUSES,
    SEGMENT_UPDATE_COLUMNS,
    IndexFileRecord,
    QueueKey,
    SegmentRecord,
    SegmentUpdate,
    check_offset,
    file_type_of,
    index_file_record,
    now_ms,
    segment_record,
)

# The segment rows of the files of one queue ``path`` of the given kinds and states, by base offset.
SEGMENT_ROWS = (
    select(*Segment.__table__.columns)
    .where(
        Segment.path == bindparam("path"),
        Segment.file_type.in_(bindparam("kinds", expanding=True)),
        Segment.status.in_(bindparam("statuses", expanding=True)),
    )
    .order_by(Segment.base_offset)
)


@cache
def segment_change_statement(columns: tuple[str, ...]) -> Update:
    """An update of one segment row by key, setting ``columns`` (bound as ``b_<column>``); built once per shape."""
    values: dict[str, BindParameter[object]] = {column: bindparam(f"b_{column}") for column in columns}
    return (
        update(Segment)
        .where(
            Segment.path == bindparam("b_path"),
            Segment.file_type == bindparam("b_file_type"),
            Segment.base_offset == bindparam("b_base_offset"),
        )
        .values(values)
    )


def segment_change(segment: SegmentUpdate) -> tuple[tuple[str, ...], dict[str, object]]:
    """The columns one segment update sets and its statement's parameters, checked before any write."""
    check_offset("segment size", segment.size)
    parameters: dict[str, object] = {
        "b_path": segment.path,
        "b_file_type": file_type_of(segment.file_type),
        "b_base_offset": segment.base_offset,
    }
    columns = tuple(column for column in SEGMENT_UPDATE_COLUMNS if getattr(segment, column) is not None)
    for column in columns:
        parameters[f"b_{column}"] = getattr(segment, column)
    return columns, parameters


class SegmentRows:
    """The segment rows of every queue's cold files."""

    _db: Database

    def add_segment(
        self,
        path: str,
        file_type: str,
        base_offset: int,
        *,
        begin_timestamp: int | None = None,
        created_timestamp: int | None = None,
        queue: QueueKey | None = None,
        expected_epoch: int | None = None,
        key_id: str | None = None,
    ) -> SegmentRecord:
        """Record a NEW, empty segment (before any byte is written to it).

        A DELETED row with the same key is reused: after orphan removal a segment can be created
        again at the offset of one that was removed. With ``expected_epoch``, refused unless ``queue`` is at it.
        ``key_id`` names the key-encryption key that will wrap its data key (None: not encrypted).
        """
        kind = file_type_of(file_type)
        check_offset("base offset", base_offset)
        stamp = created_timestamp if created_timestamp is not None else now_ms()
        with self._db.writing("add a segment") as session:
            self._require_epoch(session, queue, expected_epoch)
            row = session.scalar(self._segment_query(path, kind, base_offset))
            if row is not None and row.status != SegmentStatus.DELETED:
                raise ValidationError(
                    f"segment {path}/{kind.value}@{base_offset} already exists with status {row.status.value}"
                )
            if row is None:
                row = Segment(path=path, file_type=kind, base_offset=base_offset)
                session.add(row)
            row.size = 0
            row.status = SegmentStatus.NEW
            row.created_timestamp = stamp
            row.begin_timestamp = begin_timestamp
            row.end_timestamp = begin_timestamp
            row.sealed_timestamp = None
            row.key_id = key_id
            session.flush()
            return segment_record(row)

    def _require_epoch(self, session: Session, queue: QueueKey | None, expected_epoch: int | None) -> None:
        """LeaseLostError unless ``queue`` is at ``expected_epoch`` (nothing to check without one), in ``session``."""
        if expected_epoch is None:
            return
        if queue is None:
            raise ValidationError("an expected lease epoch needs the queue it is the epoch of")
        require_epoch(session, self._db.dialect, queue, expected_epoch)

    @staticmethod
    def _segment_query(path: str, kind: SegmentFileType, base_offset: int) -> Select[Segment]:
        return select(Segment).where(
            Segment.path == path, Segment.file_type == kind, Segment.base_offset == base_offset
        )

    def get_segment(self, path: str, file_type: str, base_offset: int) -> SegmentRecord:
        with self._db.reading("read a segment") as session:
            row = session.scalar(self._segment_query(path, file_type_of(file_type), base_offset))
            if row is None:
                raise NotFoundError(f"segment {path}/{file_type}@{base_offset} is not in the metadata store")
            return segment_record(row)

    def update_segment(
        self, change: SegmentUpdate, *, queue: QueueKey | None = None, expected_epoch: int | None = None
    ) -> SegmentRecord:
        """Apply ``change`` to its segment row; with ``expected_epoch``, refused unless ``queue`` is at it."""
        with self._db.writing("update a segment") as session:
            self._require_epoch(session, queue, expected_epoch)
            return self._apply_segment_update(session, change)

    def _apply_segment_update(self, session: Session, change: SegmentUpdate) -> SegmentRecord:
        kind = file_type_of(change.file_type)
        check_offset("segment size", change.size)
        row = session.scalar(self._segment_query(change.path, kind, change.base_offset))
        if row is None:
            raise NotFoundError(f"segment {change.path}/{kind.value}@{change.base_offset} is not in the metadata store")
        for column in SEGMENT_UPDATE_COLUMNS:
            value = getattr(change, column)
            if value is not None:
                setattr(row, column, value)
        session.flush()
        return segment_record(row)

    def list_segments(
        self, path: str, file_type: str, *, statuses: Iterable[SegmentStatus] = LIVE_SEGMENT_STATUSES
    ) -> list[SegmentRecord]:
        """One file's segments in the given states, by ascending base offset."""
        arguments = {"path": path, "kinds": [file_type_of(file_type)], "statuses": list(statuses)}
        with self._db.reading("list segments") as session:
            return [segment_record(row) for row in session.connection().execute(SEGMENT_ROWS, arguments)]

    def list_all_segments(
        self,
        *,
        file_types: Iterable[str] | None = None,
        statuses: Iterable[SegmentStatus] = LIVE_SEGMENT_STATUSES,
    ) -> dict[tuple[str, SegmentFileType], list[SegmentRecord]]:
        """Every segment grouped by (path, file type), ascending base offset: one query for a restart."""
        statement = select(Segment).where(Segment.status.in_(list(statuses)))
        if file_types is not None:
            statement = statement.where(Segment.file_type.in_([file_type_of(t) for t in file_types]))
        statement = statement.order_by(Segment.path, Segment.file_type, Segment.base_offset)
        grouped: dict[tuple[str, SegmentFileType], list[SegmentRecord]] = {}
        with self._db.reading("list all segments") as session:
            for row in session.scalars(statement):
                grouped.setdefault((row.path, row.file_type), []).append(segment_record(row))
        return grouped

    def list_segments_wrapped_outside(self, key_ids: Iterable[str]) -> list[SegmentRecord]:
        """Live encrypted segments whose data key a key other than ``key_ids`` wraps, by path and offset."""
        statement = (
            select(Segment)
            .where(
                Segment.status.in_(list(LIVE_SEGMENT_STATUSES)),
                Segment.key_id.is_not(None),
                Segment.key_id.not_in(list(key_ids)),
            )
            .order_by(Segment.path, Segment.file_type, Segment.base_offset)
        )
        with self._db.reading("list segments by key") as session:
            return [segment_record(row) for row in session.scalars(statement)]

    def count_segments_by_key(self) -> dict[str, int]:
        """How many live encrypted segments each key-encryption key wraps."""
        statement = (
            select(Segment.key_id, func.count())
            .where(Segment.status.in_(list(LIVE_SEGMENT_STATUSES)), Segment.key_id.is_not(None))
            .group_by(Segment.key_id)
        )
        with self._db.reading("count segments by key") as session:
            return {str(key_id): int(count) for key_id, count in session.execute(statement)}

    def delete_segment(
        self,
        path: str,
        file_type: str,
        base_offset: int,
        *,
        queue: QueueKey | None = None,
        expected_epoch: int | None = None,
    ) -> None:
        """Forget a segment row entirely (used for orphans that never held archived data).

        With ``expected_epoch``, refused unless ``queue`` is at it.
        """
        with self._db.writing("delete a segment") as session:
            self._require_epoch(session, queue, expected_epoch)
            session.execute(
                delete(Segment).where(
                    Segment.path == path,
                    Segment.file_type == file_type_of(file_type),
                    Segment.base_offset == base_offset,
                )
            )

    def delete_segments_under(self, path: str) -> int:
        """Forget every segment row at ``path`` or below it (a whole queue or topic); returns the count."""
        with self._db.writing("delete segments") as session:
            result = session.execute(
                delete(Segment).where(or_(Segment.path == path, Segment.path.startswith(f"{path}/", autoescape=True)))
            )
            return int(result.rowcount)  # type: ignore[attr-defined]


class IndexFileRows:
    """The key index's files."""

    _db: Database

    def add_index_file(self, name: str, *, begin_timestamp: int | None = None) -> IndexFileRecord:
        stamp = now_ms()
        try:
            with self._db.writing("add an index file") as session:
                row = IndexFile(
                    name=name,
                    status=IndexFileStatus.UNSEALED,
                    begin_timestamp=begin_timestamp,
                    end_timestamp=begin_timestamp,
                    item_count=0,
                    size=0,
                    created=stamp,
                    updated=stamp,
                )
                session.add(row)
                session.flush()
                return index_file_record(row)
        except MetadataError as exc:
            if isinstance(exc.__cause__, SqlIntegrityError):
                raise ValidationError(f"index file {name!r} already exists") from exc
            raise

    def get_index_file(self, name: str) -> IndexFileRecord:
        with self._db.reading("read an index file") as session:
            row = session.scalar(select(IndexFile).where(IndexFile.name == name))
            if row is None:
                raise NotFoundError(f"index file {name!r} is not in the metadata store")
            return index_file_record(row)

    def update_index_file(
        self,
        name: str,
        *,
        status: IndexFileStatus | None = None,
        begin_timestamp: int | None = None,
        end_timestamp: int | None = None,
        item_count: int | None = None,
        size: int | None = None,
        key_id: str | None = None,
    ) -> IndexFileRecord:
        """Set the given columns of one index file's row (None leaves a column as it is)."""
        with self._db.writing("update an index file") as session:
            row = session.scalar(select(IndexFile).where(IndexFile.name == name))
            if row is None:
                raise NotFoundError(f"index file {name!r} is not in the metadata store")
            changes = {
                "status": status,
                "begin_timestamp": begin_timestamp,
                "end_timestamp": end_timestamp,
                "item_count": item_count,
                "size": size,
                "key_id": key_id,
            }
            for column, value in changes.items():
                if value is not None:
                    setattr(row, column, value)
            row.updated = now_ms()
            session.flush()
            return index_file_record(row)

    def list_index_files(
        self,
        *,
        statuses: Iterable[IndexFileStatus] | None = None,
        begin_timestamp: int | None = None,
        end_timestamp: int | None = None,
        prefix: str | None = None,
    ) -> list[IndexFileRecord]:
        """Index files, optionally only those whose time interval overlaps [begin, end]; oldest first.

        A file with no timestamps yet (no items) overlaps nothing. ``prefix`` keeps the names that start
        with it (taken literally: ``_`` and ``%`` are not wildcards).
        """
        statement = select(IndexFile)
        if prefix is not None:
            statement = statement.where(IndexFile.name.startswith(prefix, autoescape=True))
        if statuses is not None:
            statement = statement.where(IndexFile.status.in_(list(statuses)))
        if end_timestamp is not None:
            statement = statement.where(IndexFile.begin_timestamp <= end_timestamp)
        if begin_timestamp is not None:
            statement = statement.where(IndexFile.end_timestamp >= begin_timestamp)
        statement = statement.order_by(IndexFile.begin_timestamp.asc().nulls_last(), IndexFile.id)
        with self._db.reading("list index files") as session:
            return [index_file_record(row) for row in session.scalars(statement)]

    def delete_index_file(self, name: str) -> None:
        with self._db.writing("delete an index file") as session:
            session.execute(delete(IndexFile).where(IndexFile.name == name))
