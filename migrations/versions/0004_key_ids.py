"""Which key-encryption key wraps each segment's and index file's data key: ``key_id`` on both tables.

Null for data written unencrypted (and for every row written before this revision); ``tieredstore db
rebuild --from-cold`` reads it back from each framed segment's ``.codec`` object.

Revision ID: 0004_key_ids
Revises: 0003_retention_seconds
Create Date: 2026-11-28 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004_key_ids"
down_revision: str | None = "0003_retention_seconds"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The key id length at this revision (models.NAME_LENGTH).
KEY_ID_LENGTH = 255


def upgrade() -> None:
    for table in ("segments", "index_files"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("key_id", sa.String(KEY_ID_LENGTH), nullable=True))


def downgrade() -> None:
    for table in ("segments", "index_files"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("key_id")
