"""Topic retention in seconds: a topic may keep its cold data 30 s or 15 min, not only whole hours.

``topics.reserve_hours`` (whole hours) becomes ``topics.reserve_seconds``; every topic keeps its
retention. A downgrade rounds a retention that is not whole hours up to the next hour.

Revision ID: 0003_retention_seconds
Revises: 0002_archivers
Create Date: 2026-11-27 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003_retention_seconds"
down_revision: str | None = "0002_archivers"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The default retention at this revision, 72 h.
DEFAULT_SECONDS = 72 * 3600


def upgrade() -> None:
    with op.batch_alter_table("topics") as batch:
        batch.add_column(
            sa.Column("reserve_seconds", sa.BigInteger(), server_default=sa.text(str(DEFAULT_SECONDS)), nullable=False)
        )
    op.execute("UPDATE topics SET reserve_seconds = CAST(reserve_hours AS BIGINT) * 3600")
    with op.batch_alter_table("topics") as batch:
        batch.drop_column("reserve_hours")


def downgrade() -> None:
    with op.batch_alter_table("topics") as batch:
        batch.add_column(sa.Column("reserve_hours", sa.Integer(), server_default=sa.text("72"), nullable=False))
    op.execute("UPDATE topics SET reserve_hours = (reserve_seconds + 3599) / 3600")
    with op.batch_alter_table("topics") as batch:
        batch.drop_column("reserve_seconds")
