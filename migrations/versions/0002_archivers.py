"""Archiver membership: one row per running archiver, its heartbeat expiry, for fair lease shares.

Revision ID: 0002_archivers
Revises: 0001_initial
Create Date: 2025-02-01 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002_archivers"
down_revision: str | None = "0001_initial"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "archivers",
        sa.Column("owner", sa.String(length=255), nullable=False),
        sa.Column("hostname", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started", sa.BigInteger(), nullable=False),
        sa.Column("heartbeat_expiry", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("owner", name=op.f("pk_archivers")),
    )
    op.create_index(op.f("ix_queues_owner"), "queues", ["owner"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_queues_owner"), table_name="queues")
    op.drop_table("archivers")
