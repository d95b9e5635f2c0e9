"""The metadata tables as SQLAlchemy 2.0 typed models; Alembic revisions in migrations/ create them.

Timestamps are epoch milliseconds in BIGINT columns (the unit RocketMQ stores), which keeps SQLite
and PostgreSQL identical and free of time-zone conversions. Constraint names follow one naming
convention so that Alembic revisions can refer to them on both engines.
"""

from __future__ import annotations

import enum

from sqlalchemy import (
    BigInteger,
    Enum,
    ForeignKey,
    Integer,
    MetaData,
    String,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

DEFAULT_RESERVE_HOURS = 72
DEFAULT_RESERVE_SECONDS = DEFAULT_RESERVE_HOURS * 3600
PATH_LENGTH = 1024
NAME_LENGTH = 255


class TopicStatus(enum.StrEnum):
    """ACTIVE topics are archived and served; DELETING ones are being removed from cold storage."""

    ACTIVE = "ACTIVE"
    DELETING = "DELETING"


class SegmentFileType(enum.StrEnum):
    """The kind of cold segment; the same values as ``tieredstore.formats.naming.FileType``."""

    COMMIT_LOG = "COMMIT_LOG"
    CONSUME_QUEUE = "CONSUME_QUEUE"
    INDEX = "INDEX"


class SegmentStatus(enum.StrEnum):
    """NEW (writable) → SEALED (size final) → DELETING (object removal under way) → DELETED."""

    NEW = "NEW"
    SEALED = "SEALED"
    DELETING = "DELETING"
    DELETED = "DELETED"


class IndexFileStatus(enum.StrEnum):
    """UNSEALED (local, taking items) → SEALED (local, full or old) → UPLOAD (in cold storage) → DELETED."""

    UNSEALED = "UNSEALED"
    SEALED = "SEALED"
    UPLOAD = "UPLOAD"
    DELETED = "DELETED"


def _status_enum(enum_class: type[enum.StrEnum], name: str) -> Enum:
    # A VARCHAR with a CHECK constraint, not a native PostgreSQL enum: adding a state later is then a
    # plain constraint change on both engines.
    return Enum(
        enum_class,
        name=name,
        native_enum=False,
        create_constraint=True,
        length=16,
        values_callable=lambda members: [m.value for m in members],
        validate_strings=True,
    )


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Topic(Base):
    """A topic with its own retention."""

    __tablename__ = "topics"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(NAME_LENGTH), unique=True)
    reserve_seconds: Mapped[int] = mapped_column(BigInteger, server_default=text(str(DEFAULT_RESERVE_SECONDS)))
    status: Mapped[TopicStatus] = mapped_column(
        _status_enum(TopicStatus, "topic_status"), server_default=TopicStatus.ACTIVE.value
    )
    created: Mapped[int] = mapped_column(BigInteger)
    updated: Mapped[int] = mapped_column(BigInteger)


class Queue(Base):
    """One queue's positions in cold storage: ``max_offset`` is its archived offset.

    ``version`` is bumped by every update (optimistic concurrency); ``owner``/``epoch``/
    ``lease_expiry`` hold the archiver lease when several archivers share one database.
    """

    __tablename__ = "queues"

    topic_id: Mapped[int] = mapped_column(ForeignKey("topics.id", ondelete="CASCADE"), primary_key=True)
    queue_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    min_offset: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    max_offset: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    updated: Mapped[int] = mapped_column(BigInteger)
    version: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    owner: Mapped[str | None] = mapped_column(String(NAME_LENGTH), index=True)
    epoch: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    lease_expiry: Mapped[int | None] = mapped_column(BigInteger)


class Archiver(Base):
    """One running archiver process: its membership lasts until ``heartbeat_expiry`` unless renewed.

    The live rows give the number of archivers sharing the queues, hence each one's fair share of leases.
    """

    __tablename__ = "archivers"

    owner: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    hostname: Mapped[str] = mapped_column(String(NAME_LENGTH))
    pid: Mapped[int] = mapped_column(Integer)
    started: Mapped[int] = mapped_column(BigInteger)
    heartbeat_expiry: Mapped[int] = mapped_column(BigInteger)


class Segment(Base):
    """One cold segment: where it is, how many bytes are committed, and its life-cycle state."""

    __tablename__ = "segments"
    __table_args__ = (UniqueConstraint("path", "file_type", "base_offset"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    path: Mapped[str] = mapped_column(String(PATH_LENGTH))
    file_type: Mapped[SegmentFileType] = mapped_column(_status_enum(SegmentFileType, "segment_file_type"))
    base_offset: Mapped[int] = mapped_column(BigInteger)
    size: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    status: Mapped[SegmentStatus] = mapped_column(
        _status_enum(SegmentStatus, "segment_status"), server_default=SegmentStatus.NEW.value
    )
    created_timestamp: Mapped[int] = mapped_column(BigInteger)
    begin_timestamp: Mapped[int | None] = mapped_column(BigInteger)
    end_timestamp: Mapped[int | None] = mapped_column(BigInteger)
    sealed_timestamp: Mapped[int | None] = mapped_column(BigInteger)
    # The key-encryption key wrapping the segment's data key; None when it is not encrypted.
    key_id: Mapped[str | None] = mapped_column(String(NAME_LENGTH))


class IndexFile(Base):
    """One key-index file, local or uploaded, and the store-time interval its items cover."""

    __tablename__ = "index_files"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(PATH_LENGTH), unique=True)
    status: Mapped[IndexFileStatus] = mapped_column(
        _status_enum(IndexFileStatus, "index_file_status"), server_default=IndexFileStatus.UNSEALED.value
    )
    begin_timestamp: Mapped[int | None] = mapped_column(BigInteger)
    end_timestamp: Mapped[int | None] = mapped_column(BigInteger)
    item_count: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    size: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    created: Mapped[int] = mapped_column(BigInteger)
    updated: Mapped[int] = mapped_column(BigInteger)
    # The key-encryption key wrapping the uploaded file's data key; None when it is not encrypted.
    key_id: Mapped[str | None] = mapped_column(String(NAME_LENGTH))
