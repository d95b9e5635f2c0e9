"""The Alembic environment and revisions that own the metadata schema (see tieredstore.metadata.migrate)."""
