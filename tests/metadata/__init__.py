"""Tests of the metadata store and its Alembic migrations, on SQLite and on the real PostgreSQL."""
