"""Initial schema: topics, queues (with optimistic version and archiver lease), segments, index files.

Revision ID: 0001_initial
Revises:
Create Date: 2025-01-01 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001_initial"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _status(name: str, *values: str) -> sa.Enum:
    # Frozen copy of the values at this revision: a revision never imports the live models.
    return sa.Enum(*values, name=name, native_enum=False, create_constraint=True, length=16)


def upgrade() -> None:
    op.create_table(
        "topics",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("reserve_hours", sa.Integer(), server_default=sa.text("72"), nullable=False),
        sa.Column(
            "status", _status("topic_status", "ACTIVE", "DELETING"), server_default="ACTIVE", nullable=False
        ),
        sa.Column("created", sa.BigInteger(), nullable=False),
        sa.Column("updated", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_topics")),
        sa.UniqueConstraint("name", name=op.f("uq_topics_name")),
    )
    op.create_table(
        "queues",
        sa.Column("topic_id", sa.Integer(), nullable=False),
        sa.Column("queue_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("min_offset", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("max_offset", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("updated", sa.BigInteger(), nullable=False),
        sa.Column("version", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("owner", sa.String(length=255), nullable=True),
        sa.Column("epoch", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("lease_expiry", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(
            ["topic_id"], ["topics.id"], name=op.f("fk_queues_topic_id_topics"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("topic_id", "queue_id", name=op.f("pk_queues")),
    )
    op.create_table(
        "segments",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("path", sa.String(length=1024), nullable=False),
        sa.Column(
            "file_type", _status("segment_file_type", "COMMIT_LOG", "CONSUME_QUEUE", "INDEX"), nullable=False
        ),
        sa.Column("base_offset", sa.BigInteger(), nullable=False),
        sa.Column("size", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column(
            "status",
            _status("segment_status", "NEW", "SEALED", "DELETING", "DELETED"),
            server_default="NEW",
            nullable=False,
        ),
        sa.Column("created_timestamp", sa.BigInteger(), nullable=False),
        sa.Column("begin_timestamp", sa.BigInteger(), nullable=True),
        sa.Column("end_timestamp", sa.BigInteger(), nullable=True),
        sa.Column("sealed_timestamp", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_segments")),
        sa.UniqueConstraint(
            "path", "file_type", "base_offset", name=op.f("uq_segments_path_file_type_base_offset")
        ),
    )
    op.create_table(
        "index_files",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=1024), nullable=False),
        sa.Column(
            "status",
            _status("index_file_status", "UNSEALED", "SEALED", "UPLOAD", "DELETED"),
            server_default="UNSEALED",
            nullable=False,
        ),
        sa.Column("begin_timestamp", sa.BigInteger(), nullable=True),
        sa.Column("end_timestamp", sa.BigInteger(), nullable=True),
        sa.Column("item_count", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("size", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("created", sa.BigInteger(), nullable=False),
        sa.Column("updated", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_index_files")),
        sa.UniqueConstraint("name", name=op.f("uq_index_files_name")),
    )


def downgrade() -> None:
    op.drop_table("index_files")
    op.drop_table("segments")
    op.drop_table("queues")
    op.drop_table("topics")
