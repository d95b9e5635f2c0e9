"""Engines for the metadata database: SQLite tuned for an embedded store, PostgreSQL by URL.

SQLite gets WAL (readers never block the writer), a busy timeout (a second process waits instead of
failing), foreign keys (off by default in SQLite) and ``BEGIN IMMEDIATE`` for write transactions, so
a read-then-write transaction takes the write lock up front instead of failing with SQLITE_BUSY
half-way. An in-memory SQLite URL shares one connection so every session sees the same database.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.exc import (
    ArgumentError,
    DBAPIError,
    DisconnectionError,
    InterfaceError,
    OperationalError,
    SQLAlchemyError,
)
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.pool import StaticPool

from tieredstore.errors import ConfigError, MetadataCorruptError, MetadataError, MetadataUnavailableError

SQLITE_BUSY_TIMEOUT_MS = 10_000
IMMEDIATE_OPTION = "tieredstore_immediate"


def parse_url(url: str | URL) -> URL:
    """The URL as SQLAlchemy sees it; a ConfigError naming the problem when it is not one."""
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as exc:
        raise ConfigError(f"metadata URL {url!r} is not a database URL: {exc}") from exc
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        raise ConfigError(
            f"metadata URL scheme {parsed.drivername!r} is not supported; use sqlite:///PATH or "
            "postgresql+psycopg://USER@HOST/DB"
        )
    return parsed


def safe_url(url: str | URL) -> str:
    """The URL with any password hidden, for messages and logs."""
    return parse_url(url).render_as_string(hide_password=True)


# Connection refused or lost, the pool timed out, the server went away: the database, not the request.
_UNREACHABLE = (OperationalError, InterfaceError, DisconnectionError, PoolTimeoutError)


def _is_corrupt_sqlite(exc: SQLAlchemyError) -> bool:
    """Whether SQLite said the file is not a database or its pages are damaged."""
    original = exc.orig if isinstance(exc, DBAPIError) else None
    return isinstance(original, sqlite3.Error) and original.sqlite_errorcode in (
        sqlite3.SQLITE_NOTADB,
        sqlite3.SQLITE_CORRUPT,
    )


def _one_line(exc: SQLAlchemyError) -> str:
    """The driver's own message, first line only: no SQL, parameters or "Background on this error" link."""
    text = str(exc.orig) if isinstance(exc, DBAPIError) and exc.orig is not None else str(exc)
    return next((line.strip() for line in text.splitlines() if line.strip()), exc.__class__.__name__)


@contextmanager
def translate_errors(action: str, url: str | URL | None = None) -> Iterator[None]:
    """SQLAlchemy's errors as ours, in one line that names the database without its password.

    MetadataUnavailableError when the database could not be reached or stopped answering (a retry may
    succeed), MetadataCorruptError when a SQLite file is not a database or is damaged (no retry will
    help: point the URL at the right file or restore it), MetadataError for anything else it refused.
    """
    try:
        yield
    except SQLAlchemyError as exc:
        where = f"metadata database {safe_url(url)}" if url is not None else "metadata database"
        if _is_corrupt_sqlite(exc):
            raise MetadataCorruptError(
                f"{where} is not a usable SQLite database ({_one_line(exc)}): point the metadata URL at the "
                "right file, or restore it from a backup"
            ) from exc
        if isinstance(exc, _UNREACHABLE):
            raise MetadataUnavailableError(f"{where} cannot be reached ({action}): {_one_line(exc)}") from exc
        raise MetadataError(f"{where} failed to {action}: {exc.__class__.__name__}: {_one_line(exc)}") from exc


def is_sqlite_memory(url: URL) -> bool:
    return url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:")


def sqlite_path(url: URL) -> Path | None:
    """The database file of a SQLite URL; None for an in-memory database or another engine."""
    if url.get_backend_name() != "sqlite" or is_sqlite_memory(url):
        return None
    return Path(url.database or "")


def create_metadata_engine(url: str | URL, **kwargs: Any) -> Engine:
    """An engine for ``url`` with the settings this project relies on."""
    parsed = parse_url(url)
    if parsed.get_backend_name() == "postgresql":
        kwargs.setdefault("pool_pre_ping", True)
        return create_engine(parsed, **kwargs)
    if is_sqlite_memory(parsed):
        kwargs.setdefault("poolclass", StaticPool)
        kwargs.setdefault("connect_args", {"check_same_thread": False})
    engine = create_engine(parsed, **kwargs)
    _configure_sqlite(engine)
    return engine


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Python's sqlite3 would open transactions on its own; SQLAlchemy's BEGIN below decides instead.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        immediate = connection.get_execution_options().get(IMMEDIATE_OPTION, False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")
