"""Database: one metadata engine and its short transactions, shared by every store over it.

``MetadataStore`` (topics, queues, segments, index files) and ``LeaseStore`` (archivers and queue
leases) each hold the same ``Database``, so an in-memory SQLite database, which is one shared
connection, is taken in turns by both, and PostgreSQL's idle-transaction limit covers both.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from sqlalchemy import Connection, Engine, event
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.orm import Session, sessionmaker

from tieredstore.errors import ValidationError
from tieredstore.metadata.engine import IMMEDIATE_OPTION, is_sqlite_memory, safe_url, translate_errors

# Where a pooled PostgreSQL connection notes the idle-transaction limit it has been given.
_IDLE_LIMIT_KEY = "tieredstore_idle_transaction_ms"


class Database:
    """Sessions on one engine: every use one transaction, its errors translated; thread-safe."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        # An in-memory database is one shared connection: threads (asyncio.to_thread callers) take turns.
        self._serial: AbstractContextManager[object] = (
            threading.RLock() if is_sqlite_memory(engine.url) else nullcontext()
        )
        self._read = sessionmaker(engine, expire_on_commit=False)
        self._write_engine = engine.execution_options(**{IMMEDIATE_OPTION: True})
        self._write = sessionmaker(self._write_engine, expire_on_commit=False)
        # PostgreSQL only: ms a transaction may wait on this process (None: the server's setting).
        self._idle_transaction_ms: int | None = None
        if self.dialect == "postgresql":
            event.listen(engine, "checkout", self._apply_idle_transaction_limit)

    @property
    def url(self) -> str:
        """The database URL with any password hidden."""
        return safe_url(self.engine.url)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def close(self) -> None:
        if event.contains(self.engine, "checkout", self._apply_idle_transaction_limit):
            event.remove(self.engine, "checkout", self._apply_idle_transaction_limit)
        self.engine.dispose()

    @contextmanager
    def writing(self, action: str) -> Iterator[Session]:
        """A write transaction (SQLite: the write lock taken up front) as an ORM session."""
        with self._serial, translate_errors(action, self.engine.url), self._write.begin() as session:
            yield session

    @contextmanager
    def reading(self, action: str) -> Iterator[Session]:
        with self._serial, translate_errors(action, self.engine.url), self._read.begin() as session:
            yield session

    @contextmanager
    def write_connection(self, action: str) -> Iterator[Connection]:
        """A write transaction as a bare connection, for Core statements built once (no ORM load)."""
        with self._serial, translate_errors(action, self.engine.url), self._write_engine.begin() as connection:
            yield connection

    def limit_idle_transactions(self, seconds: float | None) -> None:
        """Have PostgreSQL end any transaction of this database that waits on this process for ``seconds``.

        Every use here is one short transaction that waits on nothing but the database between its
        statements, so a transaction idle that long means the process is stalled (SIGSTOP, a long GC, a
        frozen VM) in the middle of it, holding row locks. Peers taking expired leases over skip locked
        rows (``LeaseStore.acquire_leases``), so without a limit a stalled archiver would keep the queues
        its open transactions touched until it resumes, however long that is. With it the server ends
        the session (``idle_in_transaction_session_timeout``): the transaction rolls back as if the
        process had crashed there, the locks go, and the process's next use of that connection fails
        with MetadataError (the pool then replaces it). ``None`` restores the server's setting. Applied
        to each pooled connection at its next checkout; nothing to do on SQLite (one process).
        """
        if seconds is not None and seconds <= 0:
            raise ValidationError(f"idle transaction limit {seconds:g}s must be positive")
        self._idle_transaction_ms = None if seconds is None else max(1, round(seconds * 1000))

    def _apply_idle_transaction_limit(self, dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        wanted = self._idle_transaction_ms
        if record.info.get(_IDLE_LIMIT_KEY) == wanted:
            return
        statement = (
            "RESET idle_in_transaction_session_timeout"
            if wanted is None
            else f"SET idle_in_transaction_session_timeout = {int(wanted)}"
        )
        try:
            cursor = dbapi_connection.cursor()
            try:
                cursor.execute(statement)
            finally:
                cursor.close()
            # Checked-out connections are outside any transaction: commit so that a later rollback keeps it.
            dbapi_connection.commit()
        except self.engine.dialect.loaded_dbapi.Error as exc:
            # The pool drops this connection and checks out another.
            raise DisconnectionError(f"could not limit idle transactions: {exc}") from exc
        record.info[_IDLE_LIMIT_KEY] = wanted
