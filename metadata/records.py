"""The metadata store's rows as frozen dataclasses, and the checks every store applies to what it is given."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Row

from tieredstore.basics import QueueKey as QueueKey  # importable from the metadata package as before
from tieredstore.basics import now_ms as now_ms
from tieredstore.errors import ValidationError
from tieredstore.metadata.models import (
    IndexFile,
    IndexFileStatus,
    Queue,
    Segment,
    SegmentFileType,
    SegmentStatus,
    Topic,
    TopicStatus,
)

LIVE_SEGMENT_STATUSES = (SegmentStatus.NEW, SegmentStatus.SEALED)
SegmentKey = tuple[str, str, int]
# The segment columns a SegmentUpdate may set.
SEGMENT_UPDATE_COLUMNS = ("size", "status", "begin_timestamp", "end_timestamp", "sealed_timestamp", "key_id")


@dataclass(frozen=True, slots=True)
class TopicInfo:
    id: int
    name: str
    reserve_seconds: int
    status: TopicStatus
    created: int
    updated: int

    @property
    def reserve_hours(self) -> float:
        """The retention in hours: an int when whole, as it is for retentions given in hours."""
        hours = self.reserve_seconds / 3600
        return int(hours) if hours.is_integer() else hours


@dataclass(frozen=True, slots=True)
class QueuePosition:
    """A queue's cold positions; ``max_offset`` is the archived offset (next offset to archive)."""

    topic: str
    queue_id: int
    min_offset: int
    max_offset: int
    version: int
    updated: int
    owner: str | None = None
    epoch: int = 0
    lease_expiry: int | None = None


@dataclass(frozen=True, slots=True)
class SegmentRecord:
    path: str
    file_type: SegmentFileType
    base_offset: int
    size: int
    status: SegmentStatus
    created_timestamp: int
    begin_timestamp: int | None
    end_timestamp: int | None
    sealed_timestamp: int | None
    key_id: str | None = None  # the key-encryption key wrapping its data key; None: not encrypted

    @property
    def key(self) -> SegmentKey:
        return (self.path, self.file_type.value, self.base_offset)


@dataclass(frozen=True, slots=True)
class SegmentUpdate:
    """New values for one segment row; None leaves a column as it is."""

    path: str
    file_type: str
    base_offset: int
    size: int | None = None
    status: SegmentStatus | None = None
    begin_timestamp: int | None = None
    end_timestamp: int | None = None
    sealed_timestamp: int | None = None
    key_id: str | None = None


@dataclass(frozen=True, slots=True)
class CommitRecord:
    """One queue's ``record_commit``, as an item of ``record_commits``: the same arguments, the same checks."""

    topic: str
    queue_id: int
    expected_version: int
    min_offset: int | None = None
    max_offset: int | None = None
    segments: tuple[SegmentUpdate, ...] = ()
    expected_epoch: int | None = None


@dataclass(frozen=True, slots=True)
class IndexFileRecord:
    name: str
    status: IndexFileStatus
    begin_timestamp: int | None
    end_timestamp: int | None
    item_count: int
    size: int
    created: int
    updated: int
    key_id: str | None = None  # the key-encryption key wrapping the uploaded file's data key


def reserve_seconds_of(reserve_hours: float) -> int:
    """A retention given in hours, in whole seconds; ValidationError below one second."""
    seconds = round(reserve_hours * 3600)
    if seconds < 1:
        raise ValidationError(f"reserve_hours {reserve_hours} must be positive (at least one second)")
    return seconds


def topic_info(row: Topic) -> TopicInfo:
    return TopicInfo(row.id, row.name, row.reserve_seconds, row.status, row.created, row.updated)


def queue_position(topic: str, row: Queue | Row[Any]) -> QueuePosition:
    return QueuePosition(
        topic=topic,
        queue_id=row.queue_id,
        min_offset=row.min_offset,
        max_offset=row.max_offset,
        version=row.version,
        updated=row.updated,
        owner=row.owner,
        epoch=row.epoch,
        lease_expiry=row.lease_expiry,
    )


def segment_record(row: Segment | Row[Any]) -> SegmentRecord:
    return SegmentRecord(
        path=row.path,
        file_type=row.file_type,
        base_offset=row.base_offset,
        size=row.size,
        status=row.status,
        created_timestamp=row.created_timestamp,
        begin_timestamp=row.begin_timestamp,
        end_timestamp=row.end_timestamp,
        sealed_timestamp=row.sealed_timestamp,
        key_id=row.key_id,
    )


def index_file_record(row: IndexFile) -> IndexFileRecord:
    return IndexFileRecord(
        name=row.name,
        status=row.status,
        begin_timestamp=row.begin_timestamp,
        end_timestamp=row.end_timestamp,
        item_count=row.item_count,
        size=row.size,
        created=row.created,
        updated=row.updated,
        key_id=row.key_id,
    )


def file_type_of(value: str) -> SegmentFileType:
    try:
        return SegmentFileType(value)
    except ValueError as exc:
        raise ValidationError(f"{value!r} is not a segment file type ({', '.join(SegmentFileType)})") from exc


def check_offset(name: str, value: int | None) -> None:
    if value is not None and value < 0:
        raise ValidationError(f"{name} {value} must not be negative")
