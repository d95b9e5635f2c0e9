"""The metadata store: topics, queue positions, segments, index files and queue leases in SQLite or PostgreSQL."""

from tieredstore.metadata.leases import LeaseHold, LeaseStore, Membership, QueueLease
from tieredstore.metadata.migrate import check_schema, current, downgrade, head, upgrade
from tieredstore.metadata.models import IndexFileStatus, SegmentFileType, SegmentStatus, TopicStatus
from tieredstore.metadata.records import (
    LIVE_SEGMENT_STATUSES,
    CommitRecord,
    IndexFileRecord,
    QueueKey,
    QueuePosition,
    SegmentRecord,
    SegmentUpdate,
    TopicInfo,
)
from tieredstore.metadata.store import MetadataStore

__all__ = [
    "LIVE_SEGMENT_STATUSES",
    "CommitRecord",
    "IndexFileRecord",
    "IndexFileStatus",
    "LeaseHold",
    "LeaseStore",
    "Membership",
    "MetadataStore",
    "QueueKey",
    "QueueLease",
    "QueuePosition",
    "SegmentFileType",
    "SegmentRecord",
    "SegmentStatus",
    "SegmentUpdate",
    "TopicInfo",
    "TopicStatus",
    "check_schema",
    "current",
    "downgrade",
    "head",
    "upgrade",
]
