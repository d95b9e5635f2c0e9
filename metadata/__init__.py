"""The metadata store: topics, queue positions, segments and index files in SQLite or PostgreSQL."""

from tieredstore.metadata.migrate import check_schema, current, downgrade, head, upgrade
from tieredstore.metadata.models import IndexFileStatus, SegmentFileType, SegmentStatus, TopicStatus
from tieredstore.metadata.store import (
    LIVE_SEGMENT_STATUSES,
    EpochFence,
    IndexFileRecord,
    Membership,
    MetadataStore,
    QueueKey,
    QueueLease,
    QueuePosition,
    SegmentRecord,
    SegmentUpdate,
    TopicInfo,
)

__all__ = [
    "LIVE_SEGMENT_STATUSES",
    "EpochFence",
    "IndexFileRecord",
    "IndexFileStatus",
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
