"""Alembic environment: migrates the engine handed over by tieredstore.metadata.migrate.

Online mode uses ``config.attributes["engine"]`` (so an in-memory SQLite database is the same one the
caller holds); offline mode (``--sql``) renders SQL for ``config.attributes["url"]``.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, Engine

from tieredstore.metadata.engine import create_metadata_engine
from tieredstore.metadata.models import Base

config = context.config
target_metadata = Base.metadata


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things; batch mode copies the table, so later revisions work on both.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
        compare_server_default=True,
        # Our SQLite connections BEGIN explicitly (tieredstore.metadata.engine), so their DDL is transactional
        # too: every pending revision runs in one transaction, and a process killed part way through a first
        # migration leaves an empty database that the next start creates again, not one stuck between revisions.
        transactional_ddl=True,
    )


def run_migrations_offline() -> None:
    context.configure(
        url=config.attributes["url"],
        target_metadata=target_metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine: Engine | None = config.attributes.get("engine")
    owned = engine is None
    if engine is None:
        engine = create_metadata_engine(config.attributes["url"])
    try:
        with engine.connect() as connection:
            _configure(connection)
            with context.begin_transaction():
                context.run_migrations()
            connection.commit()
    finally:
        if owned:
            engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
