"""MetadataStore: topics, queue positions, segments and index files, each change one short transaction.

The store never creates or alters tables: it checks that the database is at the head Alembic revision
and refuses (SchemaVersionError, naming the command to run) otherwise. ``MetadataStore.open`` is the
one convenience: it migrates a brand-new embedded SQLite database (no file yet, or a file without any
table) to head, so the embedded default works with zero setup; an existing database is never
migrated implicitly, and PostgreSQL always needs ``tieredstore db upgrade``.

Rows come back as frozen dataclasses, never as live ORM objects (``metadata.records``). The store is a
facade over one part per kind of row: topics and queues (``metadata.queues``), segments and index files
(``metadata.segments``). Queue positions use optimistic concurrency: every update names the version it
read and fails with ConcurrentUpdateError when another writer got there first.

Several archivers sharing one database split the queues by lease: ``LeaseStore`` (``metadata.leases``,
also ``MetadataStore.leases``) keeps them over the same database. A writer under a lease names the
epoch it holds in each change (``expected_epoch``): nothing is installed into this store.

The row types are also importable from here, where they were defined before the store was split.
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy import Engine, func, inspect, select, text
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from tieredstore.directories import ensure_directory
from tieredstore.errors import ValidationError
from tieredstore.metadata import migrate
from tieredstore.metadata.database import Database
from tieredstore.metadata.engine import (
    create_metadata_engine,
    is_sqlite_memory,
    parse_url,
    sqlite_path,
    translate_errors,
)
from tieredstore.metadata.leases import LeaseHold as LeaseHold
from tieredstore.metadata.leases import LeaseStore
from tieredstore.metadata.leases import Membership as Membership
from tieredstore.metadata.leases import QueueLease as QueueLease
from tieredstore.metadata.models import Archiver, IndexFile, Queue, Segment, Topic
from tieredstore.metadata.queues import QueueRows
from tieredstore.metadata.records import LIVE_SEGMENT_STATUSES as LIVE_SEGMENT_STATUSES
from tieredstore.metadata.records import SEGMENT_UPDATE_COLUMNS as SEGMENT_UPDATE_COLUMNS
from tieredstore.metadata.records import IndexFileRecord as IndexFileRecord
from tieredstore.metadata.records import QueueKey as QueueKey
from tieredstore.metadata.records import QueuePosition as QueuePosition
from tieredstore.metadata.records import SegmentKey as SegmentKey
from tieredstore.metadata.records import SegmentRecord as SegmentRecord
from tieredstore.metadata.records import SegmentUpdate as SegmentUpdate
from tieredstore.metadata.records import TopicInfo as TopicInfo
from tieredstore.metadata.records import now_ms as now_ms
from tieredstore.metadata.segments import IndexFileRows, SegmentRows


class MetadataStore(QueueRows, SegmentRows, IndexFileRows):
    """The metadata database behind one tieredstore; thread-safe, every method one transaction."""

    def __init__(self, url: str | URL, *, engine: Engine | None = None) -> None:
        """Open ``url`` (or the given engine) and refuse unless the schema is at head."""
        self._engine = engine if engine is not None else create_metadata_engine(url)
        try:
            with translate_errors("check the schema", self._engine.url):
                migrate.check_schema(self._engine)
        except BaseException:
            if engine is None:
                self._engine.dispose()
            raise
        self._db = Database(self._engine)
        self._leases = LeaseStore(self._db)

    @classmethod
    def open(cls, url: str | URL, *, create: bool = True) -> MetadataStore:
        """Open ``url``; with ``create``, a brand-new embedded SQLite database is migrated to head first.

        Brand-new means the file does not exist or holds no table at all (or it is in-memory). Any
        other database, and every PostgreSQL database, must already be at head.
        """
        parsed = parse_url(url)
        engine = create_metadata_engine(parsed)
        try:
            with translate_errors("open it", parsed):
                brand_new = (
                    create and parsed.get_backend_name() == "sqlite" and cls._is_brand_new_sqlite(parsed, engine)
                )
            if brand_new:
                with translate_errors("create the embedded schema", parsed):
                    migrate.upgrade(engine)
            return cls(parsed, engine=engine)
        except BaseException:
            engine.dispose()
            raise

    @staticmethod
    def _is_brand_new_sqlite(url: URL, engine: Engine) -> bool:
        path = sqlite_path(url)
        if path is not None:
            if not path.exists() or path.stat().st_size == 0:
                ensure_directory(path.parent, "the SQLite metadata database's directory")
                return True
        elif not is_sqlite_memory(url):
            return False
        with engine.connect() as connection:
            return not inspect(connection).get_table_names()

    @property
    def url(self) -> str:
        """The database URL with any password hidden."""
        return self._db.url

    @property
    def engine(self) -> Engine:
        return self._engine

    @property
    def dialect(self) -> str:
        return self._db.dialect

    @property
    def leases(self) -> LeaseStore:
        """Archiver membership and queue leases, over this store's database (see ``metadata.leases``)."""
        return self._leases

    def limit_idle_transactions(self, seconds: float | None) -> None:
        """Have PostgreSQL end any transaction of this database that waits on this process for ``seconds``
        (see ``Database.limit_idle_transactions``)."""
        self._db.limit_idle_transactions(seconds)

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> MetadataStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def require_empty(self) -> None:
        """ValidationError naming what the database holds unless it holds no row at all."""
        with self._db.reading("count rows") as session:
            self._refuse_rows(session)

    def _refuse_rows(self, session: Session) -> None:
        held = {
            model.__tablename__: count
            for model in _COPIED_MODELS
            if (count := int(session.scalar(select(func.count()).select_from(model)) or 0))
        }
        if held:
            rows = ", ".join(f"{count} {table}" for table, count in held.items())
            raise ValidationError(
                f"the metadata database {self.url} is not empty ({rows}); rebuild only into an empty database"
            )

    def adopt_rows(self, source: MetadataStore, topic_ids: Mapping[str, int]) -> dict[str, int]:
        """Write every topic, queue, segment and index-file row of ``source`` into this empty database.

        One transaction, which first checks that this database holds no row at all (``require_empty``;
        nothing is written otherwise): a rebuild either lands whole or not at all. Each topic gets its
        id from ``topic_ids`` (the key index names topics by id); other row ids are this database's own.
        A queue's version, lease and epoch start afresh (they describe this database's history, not the
        data). Returns the rows written per table.
        """
        with source._db.reading("read the rows to copy") as session:
            topics = list(session.scalars(select(Topic).order_by(Topic.id)))
            queues = list(session.execute(select(Topic.name, Queue).join(Topic, Topic.id == Queue.topic_id)))
            segments = list(session.scalars(select(Segment).order_by(Segment.id)))
            index_files = list(session.scalars(select(IndexFile).order_by(IndexFile.id)))
        with self._db.writing("write the rebuilt rows") as session:
            self._refuse_rows(session)
            for topic in topics:
                row = Topic(
                    id=topic_ids[topic.name],
                    name=topic.name,
                    reserve_seconds=topic.reserve_seconds,
                    status=topic.status,
                    created=topic.created,
                    updated=topic.updated,
                )
                session.add(row)
            session.flush()
            if topics and self.dialect == "postgresql":
                # Ids given explicitly do not move the sequence: the next topic created must not reuse one.
                session.execute(
                    text("SELECT setval(pg_get_serial_sequence('topics', 'id'), (SELECT max(id) FROM topics))")
                )
            session.add_all(
                Queue(
                    topic_id=topic_ids[name],
                    queue_id=queue.queue_id,
                    min_offset=queue.min_offset,
                    max_offset=queue.max_offset,
                    updated=queue.updated,
                    version=0,
                    epoch=0,
                )
                for name, queue in queues
            )
            session.add_all(
                Segment(**{column: getattr(row, column) for column in _SEGMENT_COLUMNS}) for row in segments
            )
            session.add_all(
                IndexFile(**{column: getattr(row, column) for column in _INDEX_FILE_COLUMNS}) for row in index_files
            )
        return {
            "topics": len(topics),
            "queues": len(queues),
            "segments": len(segments),
            "index_files": len(index_files),
        }


_COPIED_MODELS = (Topic, Queue, Segment, IndexFile, Archiver)
_SEGMENT_COLUMNS = tuple(c.key for c in Segment.__table__.columns if c.key != "id")
_INDEX_FILE_COLUMNS = tuple(c.key for c in IndexFile.__table__.columns if c.key != "id")
