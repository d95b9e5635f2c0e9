"""Alembic revisions of the metadata schema, oldest first by their down_revision chain."""
