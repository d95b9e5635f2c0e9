"""MetadataStore: topics, queue positions, segments and index files, each change one short transaction.

The store never creates or alters tables: it checks that the database is at the head Alembic revision
and refuses (SchemaVersionError, naming the command to run) otherwise. ``MetadataStore.open`` is the
one convenience: it migrates a brand-new embedded SQLite database (no file yet, or a file without any
table) to head, so the embedded default works with zero setup; an existing database is never
migrated implicitly, and PostgreSQL always needs ``tieredstore db upgrade``.

Rows come back as frozen dataclasses, never as live ORM objects. Queue positions use optimistic
concurrency: every update names the version it read and fails with ConcurrentUpdateError when
another writer got there first.

Several archivers sharing one database split the queues by lease (a queue row's owner, epoch and
expiry; the ``archivers`` table counts who is alive). Lease times are the database's clock, so hosts
with skewed clocks still agree on expiry. Taking a queue over bumps its epoch; an archiver installs
an epoch fence (``set_epoch_fence``) and every position update it makes then also names the epoch it
holds, failing with LeaseLostError once another archiver has taken the queue over.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from functools import cache
from typing import Any, overload

from sqlalchemy import (
    BindParameter,
    Engine,
    Update,
    bindparam,
    delete,
    event,
    func,
    inspect,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.engine import URL, Connection, Row
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.exc import IntegrityError as SqlIntegrityError
from sqlalchemy.orm import Session, aliased, sessionmaker

from tieredstore.directories import ensure_directory
from tieredstore.errors import (
    ConcurrentUpdateError,
    LeaseLostError,
    MetadataError,
    NotFoundError,
    TieredStoreError,
    ValidationError,
)
from tieredstore.metadata import migrate
from tieredstore.metadata.engine import (
    IMMEDIATE_OPTION,
    create_metadata_engine,
    is_sqlite_memory,
    parse_url,
    safe_url,
    sqlite_path,
    translate_errors,
)
from tieredstore.metadata.models import (
    DEFAULT_RESERVE_SECONDS,
    Archiver,
    IndexFile,
    IndexFileStatus,
    Queue,
    Segment,
    SegmentFileType,
    SegmentStatus,
    Topic,
    TopicStatus,
)

LIVE_SEGMENT_STATUSES = (SegmentStatus.NEW, SegmentStatus.SEALED)
SegmentKey = tuple[str, str, int]
QueueKey = tuple[str, int]
# The epoch an archiver holds for a queue; raises LeaseLostError when it holds none.
EpochFence = Callable[[str, int], int]
# The segment columns a SegmentUpdate may set.
SEGMENT_UPDATE_COLUMNS = ("size", "status", "begin_timestamp", "end_timestamp", "sealed_timestamp")
# Where a pooled PostgreSQL connection notes the idle-transaction limit it has been given.
_IDLE_LIMIT_KEY = "tieredstore_idle_transaction_ms"


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class TopicInfo:
    id: int
    name: str
    reserve_seconds: int
    status: TopicStatus
    created: int
    updated: int

    @property
    def reserve_hours(self) -> float:
        """The retention in hours: an int when whole, as it is for retentions given in hours."""
        hours = self.reserve_seconds / 3600
        return int(hours) if hours.is_integer() else hours


@dataclass(frozen=True, slots=True)
class QueuePosition:
    """A queue's cold positions; ``max_offset`` is the archived offset (next offset to archive)."""

    topic: str
    queue_id: int
    min_offset: int
    max_offset: int
    version: int
    updated: int
    owner: str | None = None
    epoch: int = 0
    lease_expiry: int | None = None


@dataclass(frozen=True, slots=True)
class QueueLease:
    """An archiver's lease on one queue: valid until ``expiry`` (epoch ms, database clock)."""

    topic: str
    queue_id: int
    owner: str
    epoch: int
    expiry: int

    @property
    def key(self) -> QueueKey:
        return (self.topic, self.queue_id)


@dataclass(frozen=True, slots=True)
class Membership:
    """The archivers alive now (heartbeat not expired) and how many queues they share."""

    now: int
    live_archivers: int
    queues: int


@dataclass(frozen=True, slots=True)
class SegmentRecord:
    path: str
    file_type: SegmentFileType
    base_offset: int
    size: int
    status: SegmentStatus
    created_timestamp: int
    begin_timestamp: int | None
    end_timestamp: int | None
    sealed_timestamp: int | None

    @property
    def key(self) -> SegmentKey:
        return (self.path, self.file_type.value, self.base_offset)


@dataclass(frozen=True, slots=True)
class SegmentUpdate:
    """New values for one segment row; None leaves a column as it is."""

    path: str
    file_type: str
    base_offset: int
    size: int | None = None
    status: SegmentStatus | None = None
    begin_timestamp: int | None = None
    end_timestamp: int | None = None
    sealed_timestamp: int | None = None


@dataclass(frozen=True, slots=True)
class IndexFileRecord:
    name: str
    status: IndexFileStatus
    begin_timestamp: int | None
    end_timestamp: int | None
    item_count: int
    size: int
    created: int
    updated: int


def _reserve_seconds(reserve_hours: float) -> int:
    """A retention given in hours, in whole seconds; ValidationError below one second."""
    seconds = round(reserve_hours * 3600)
    if seconds < 1:
        raise ValidationError(f"reserve_hours {reserve_hours} must be positive (at least one second)")
    return seconds


def _topic_info(row: Topic) -> TopicInfo:
    return TopicInfo(row.id, row.name, row.reserve_seconds, row.status, row.created, row.updated)


def _queue_position(topic: str, row: Queue | Row[Any]) -> QueuePosition:
    return QueuePosition(
        topic=topic,
        queue_id=row.queue_id,
        min_offset=row.min_offset,
        max_offset=row.max_offset,
        version=row.version,
        updated=row.updated,
        owner=row.owner,
        epoch=row.epoch,
        lease_expiry=row.lease_expiry,
    )


def _segment_record(row: Segment | Row[Any]) -> SegmentRecord:
    return SegmentRecord(
        path=row.path,
        file_type=row.file_type,
        base_offset=row.base_offset,
        size=row.size,
        status=row.status,
        created_timestamp=row.created_timestamp,
        begin_timestamp=row.begin_timestamp,
        end_timestamp=row.end_timestamp,
        sealed_timestamp=row.sealed_timestamp,
    )


def _index_file_record(row: IndexFile) -> IndexFileRecord:
    return IndexFileRecord(
        name=row.name,
        status=row.status,
        begin_timestamp=row.begin_timestamp,
        end_timestamp=row.end_timestamp,
        item_count=row.item_count,
        size=row.size,
        created=row.created,
        updated=row.updated,
    )


def _file_type(value: str) -> SegmentFileType:
    try:
        return SegmentFileType(value)
    except ValueError as exc:
        raise ValidationError(f"{value!r} is not a segment file type ({', '.join(SegmentFileType)})") from exc


# Core statements built once, with bound parameters: building ORM statements and loading ORM objects were most
# of what reading a queue and its segments cost (~1.8 ms for a read view's load on SQLite, 0.79 ms this way),
# which a cold reader pays when it opens a queue and again each time its reads reach the queue's end.
_QUEUE_ROW = (
    select(*Queue.__table__.columns)
    .select_from(Queue)
    .join(Topic, Topic.id == Queue.topic_id)
    .where(Topic.name == bindparam("topic"), Queue.queue_id == bindparam("queue_id"))
)
# The segment rows of the files of one queue ``path`` of the given kinds and states, by base offset.
_SEGMENT_ROWS = (
    select(*Segment.__table__.columns)
    .where(
        Segment.path == bindparam("path"),
        Segment.file_type.in_(bindparam("kinds", expanding=True)),
        Segment.status.in_(bindparam("statuses", expanding=True)),
    )
    .order_by(Segment.base_offset)
)


def _check_offset(name: str, value: int | None) -> None:
    if value is not None and value < 0:
        raise ValidationError(f"{name} {value} must not be negative")


@cache
def _queue_commit_statement(sets_min: bool, sets_max: bool, fenced: bool) -> Update:
    """``record_commit``'s queue update, built once per shape: topic by name, version (and epoch) checked.

    The topic id is a scalar subquery rather than a cached id, so a topic deleted and created again
    under the same name is never confused with the old one.
    """
    topic_id = select(Topic.id).where(Topic.name == bindparam("b_topic")).scalar_subquery()
    conditions = [
        Queue.topic_id == topic_id,
        Queue.queue_id == bindparam("b_queue_id"),
        Queue.version == bindparam("b_expected_version"),
    ]
    if fenced:
        conditions.append(Queue.epoch == bindparam("b_expected_epoch"))
    values: dict[str, BindParameter[object]] = {"version": bindparam("b_version"), "updated": bindparam("b_updated")}
    if sets_min:
        values["min_offset"] = bindparam("b_min_offset")
    if sets_max:
        values["max_offset"] = bindparam("b_max_offset")
    return (
        update(Queue)
        .where(*conditions)
        .values(values)
        .returning(
            Queue.min_offset,
            Queue.max_offset,
            Queue.version,
            Queue.updated,
            Queue.owner,
            Queue.epoch,
            Queue.lease_expiry,
        )
    )


@cache
def _segment_change_statement(columns: tuple[str, ...]) -> Update:
    """An update of one segment row by key, setting ``columns`` (bound as ``b_<column>``); built once per shape."""
    values: dict[str, BindParameter[object]] = {column: bindparam(f"b_{column}") for column in columns}
    return (
        update(Segment)
        .where(
            Segment.path == bindparam("b_path"),
            Segment.file_type == bindparam("b_file_type"),
            Segment.base_offset == bindparam("b_base_offset"),
        )
        .values(values)
    )


class MetadataStore:
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
        # An in-memory database is one shared connection: threads (asyncio.to_thread callers) take turns.
        self._serial: AbstractContextManager[object] = (
            threading.RLock() if is_sqlite_memory(self._engine.url) else nullcontext()
        )
        self._read = sessionmaker(self._engine, expire_on_commit=False)
        self._write_engine = self._engine.execution_options(**{IMMEDIATE_OPTION: True})
        self._write = sessionmaker(self._write_engine, expire_on_commit=False)
        self._epoch_fence: EpochFence | None = None
        self._storage_hold_ms: int | None = None
        # PostgreSQL only: ms a transaction may wait on this process (None: the server's setting).
        self._idle_transaction_ms: int | None = None
        if self.dialect == "postgresql":
            event.listen(self._engine, "checkout", self._apply_idle_transaction_limit)

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
        return safe_url(self._engine.url)

    @property
    def engine(self) -> Engine:
        return self._engine

    @property
    def dialect(self) -> str:
        return self._engine.dialect.name

    def close(self) -> None:
        if event.contains(self._engine, "checkout", self._apply_idle_transaction_limit):
            event.remove(self._engine, "checkout", self._apply_idle_transaction_limit)
        self._engine.dispose()

    def set_epoch_fence(self, fence: EpochFence | None, *, storage_hold_ms: int | None = None) -> None:
        """From now on every queue-position update names the epoch ``fence`` says this process holds.

        An archiver holding leases installs its lease table here, so that writers that know nothing
        of leases (the flat files record their own positions) are fenced all the same. Segment changes
        that name their ``queue`` (add, update, delete) are fenced too, in their own transaction.
        ``storage_hold_ms`` is how long ``check_lease`` keeps the lease from being taken over after it
        passes (see there); the lease duration is the natural value.
        """
        if storage_hold_ms is not None and storage_hold_ms <= 0:
            raise ValidationError(f"storage hold {storage_hold_ms} ms must be positive")
        self._epoch_fence = fence
        self._storage_hold_ms = storage_hold_ms if fence is not None else None

    def _require_lease(self, session: Session, queue: QueueKey | None) -> tuple[str | None, int | None] | None:
        """Raise LeaseLostError unless ``queue`` is still at the lease epoch the installed fence says we hold.

        Returns the queue's owner and lease expiry as read (None without a fence or a queue, when
        nothing is checked). The queue row is locked (PostgreSQL) until the transaction ends, so a
        takeover, which bumps the epoch, waits for the change being fenced or sees it done.
        """
        if queue is None or self._epoch_fence is None:
            return None
        topic, queue_id = queue
        expected = self._epoch_fence(topic, queue_id)
        statement = (
            select(Queue.epoch, Queue.owner, Queue.lease_expiry)
            .join(Topic, Topic.id == Queue.topic_id)
            .where(Topic.name == topic, Queue.queue_id == queue_id)
        )
        if self.dialect == "postgresql":
            statement = statement.with_for_update(of=Queue)
        found = session.execute(statement).one_or_none()
        if found is None:
            raise NotFoundError(f"queue {topic}/{queue_id} is not in the metadata store")
        epoch, owner, lease_expiry = found
        if epoch != expected:
            raise LeaseLostError(
                f"queue {topic}/{queue_id} is at lease epoch {epoch} (owner {owner}), not {expected}: "
                "another archiver took it over; its segments were not changed"
            )
        return owner, lease_expiry

    @property
    def fenced(self) -> bool:
        """Whether an epoch fence is installed: this process writes queues under leases, beside other archivers."""
        return self._epoch_fence is not None

    def check_lease(self, queue: QueueKey) -> None:
        """LeaseLostError unless the installed fence's epoch for ``queue`` is still current (no-op without one).

        For a storage change that must not happen once another archiver owns the queue (deleting or
        cutting objects): checked just before it, since storage cannot join a metadata transaction.

        An epoch that is still current only says nobody has taken the queue over *yet*: the lease may
        have expired already (renewals failing), and a takeover could then come between this check and
        the deletion it guards. So with a ``storage_hold_ms`` the same transaction also pushes the
        lease's expiry to at least the database's now plus the hold: no peer can take the queue over
        until then, and the change that follows has that long to reach storage. A queue this process
        released (no owner; the next owner may take it at once) is refused as lost.
        """
        if self._epoch_fence is None:
            return
        with self._writing("check a lease") as session:
            held = self._require_lease(session, queue)
            if self._storage_hold_ms is None or held is None:
                return
            owner, lease_expiry = held
            topic, queue_id = queue
            if owner is None:
                raise LeaseLostError(
                    f"queue {topic}/{queue_id} was released: its cold segments are no longer this archiver's to change"
                )
            held_until = self._database_now_ms(session) + self._storage_hold_ms
            if lease_expiry is None or lease_expiry < held_until:
                topic_id = select(Topic.id).where(Topic.name == topic).scalar_subquery()
                session.execute(
                    update(Queue)
                    .where(Queue.topic_id == topic_id, Queue.queue_id == queue_id)
                    .values(lease_expiry=held_until)
                )

    def limit_idle_transactions(self, seconds: float | None) -> None:
        """Have PostgreSQL end any transaction of this store that waits on this process for ``seconds``.

        Every method here is one short transaction that waits on nothing but the database between its
        statements, so a transaction idle that long means the process is stalled (SIGSTOP, a long GC, a
        frozen VM) in the middle of it, holding row locks. Peers taking expired leases over skip locked
        rows (``acquire_leases``), so without a limit a stalled archiver would keep the queues its open
        transactions touched until it resumes, however long that is. With it the server ends the
        session (``idle_in_transaction_session_timeout``): the transaction rolls back as if the process
        had crashed there, the locks go, and the process's next use of that connection fails with
        MetadataError (the pool then replaces it). ``None`` restores the server's setting. Applied to
        each pooled connection at its next checkout; nothing to do on SQLite (one process).
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
        except self._engine.dialect.loaded_dbapi.Error as exc:
            # The pool drops this connection and checks out another.
            raise DisconnectionError(f"could not limit idle transactions: {exc}") from exc
        record.info[_IDLE_LIMIT_KEY] = wanted

    def __enter__(self) -> MetadataStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _writing(self, action: str) -> Iterator[Session]:
        with self._serial, translate_errors(action, self._engine.url), self._write.begin() as session:
            yield session

    @contextmanager
    def _reading(self, action: str) -> Iterator[Session]:
        with self._serial, translate_errors(action, self._engine.url), self._read.begin() as session:
            yield session

    # ---- topics ----------------------------------------------------------------------------------

    def get_or_create_topic(self, name: str, *, reserve_hours: float | None = None) -> TopicInfo:
        """The topic named ``name``, created with ``reserve_hours`` (default 72) if it does not exist."""
        reserve_seconds = DEFAULT_RESERVE_SECONDS if reserve_hours is None else _reserve_seconds(reserve_hours)
        existing = self._find_topic(name)
        if existing is not None:
            return existing
        stamp = now_ms()
        try:
            with self._writing("create a topic") as session:
                row = Topic(
                    name=name,
                    reserve_seconds=reserve_seconds,
                    status=TopicStatus.ACTIVE,
                    created=stamp,
                    updated=stamp,
                )
                session.add(row)
                session.flush()
                return _topic_info(row)
        except MetadataError as exc:
            # Another process created it between our read and our insert: theirs is the topic.
            if not isinstance(exc.__cause__, SqlIntegrityError):
                raise
            created = self._find_topic(name)
            if created is None:
                raise
            return created

    def _find_topic(self, name: str) -> TopicInfo | None:
        with self._reading("read a topic") as session:
            row = session.scalar(select(Topic).where(Topic.name == name))
            return None if row is None else _topic_info(row)

    def get_topic(self, name: str) -> TopicInfo:
        topic = self._find_topic(name)
        if topic is None:
            raise NotFoundError(f"topic {name!r} is not in the metadata store")
        return topic

    def list_topics(self) -> list[TopicInfo]:
        with self._reading("list topics") as session:
            return [_topic_info(row) for row in session.scalars(select(Topic).order_by(Topic.name))]

    def set_retention(self, name: str, reserve_hours: float) -> TopicInfo:
        """Keep the topic's cold data for ``reserve_hours`` hours (kept to the second)."""
        return self._update_topic(name, reserve_seconds=_reserve_seconds(reserve_hours))

    def set_topic_status(self, name: str, status: TopicStatus) -> TopicInfo:
        return self._update_topic(name, status=status)

    def _update_topic(self, name: str, **values: object) -> TopicInfo:
        with self._writing("update a topic") as session:
            row = session.scalar(select(Topic).where(Topic.name == name))
            if row is None:
                raise NotFoundError(f"topic {name!r} is not in the metadata store")
            for column, value in values.items():
                setattr(row, column, value)
            row.updated = now_ms()
            session.flush()
            return _topic_info(row)

    def delete_topic(self, name: str) -> None:
        """Remove the topic and its queues (segment rows are removed by whoever removes the objects)."""
        with self._writing("delete a topic") as session:
            result = session.execute(delete(Topic).where(Topic.name == name))
            if result.rowcount == 0:  # type: ignore[attr-defined]
                raise NotFoundError(f"topic {name!r} is not in the metadata store")

    # ---- queues ----------------------------------------------------------------------------------

    def get_or_create_queue(self, topic: str, queue_id: int, *, start_offset: int = 0) -> QueuePosition:
        """The queue's positions, created at ``start_offset`` (with its topic) if it does not exist."""
        if queue_id < 0:
            raise ValidationError(f"queue id {queue_id} must not be negative")
        _check_offset("start offset", start_offset)
        existing = self._find_queue(topic, queue_id)
        if existing is not None:
            return existing
        topic_info = self.get_or_create_topic(topic)
        try:
            with self._writing("create a queue") as session:
                row = Queue(
                    topic_id=topic_info.id,
                    queue_id=queue_id,
                    min_offset=start_offset,
                    max_offset=start_offset,
                    updated=now_ms(),
                    version=0,
                    epoch=0,
                )
                session.add(row)
                session.flush()
                return _queue_position(topic, row)
        except MetadataError as exc:
            if not isinstance(exc.__cause__, SqlIntegrityError):
                raise
            created = self._find_queue(topic, queue_id)
            if created is None:
                raise
            return created

    def _find_queue(self, topic: str, queue_id: int) -> QueuePosition | None:
        with self._reading("read a queue") as session:
            row = session.connection().execute(_QUEUE_ROW, {"topic": topic, "queue_id": queue_id}).first()
            return None if row is None else _queue_position(topic, row)

    def get_queue(self, topic: str, queue_id: int) -> QueuePosition:
        queue = self._find_queue(topic, queue_id)
        if queue is None:
            raise NotFoundError(f"queue {topic}/{queue_id} is not in the metadata store")
        return queue

    @overload
    def get_queue_with_segments(
        self, topic: str, queue_id: int, path: str, file_types: Sequence[str], *, unless: None = None
    ) -> tuple[QueuePosition, dict[str, list[SegmentRecord]]]: ...

    @overload
    def get_queue_with_segments(
        self, topic: str, queue_id: int, path: str, file_types: Sequence[str], *, unless: QueuePosition
    ) -> tuple[QueuePosition, dict[str, list[SegmentRecord]]] | None: ...

    def get_queue_with_segments(
        self, topic: str, queue_id: int, path: str, file_types: Sequence[str], *, unless: QueuePosition | None = None
    ) -> tuple[QueuePosition, dict[str, list[SegmentRecord]]] | None:
        """``get_queue``, then ``list_segments`` of each of ``file_types``, in one session and two statements.

        What a read-only view of a queue loads, in one round trip to the database thread instead of one
        per file. The position is read first, as separate calls would, so a commit in between only makes
        the segment rows longer than the position counts.

        ``unless``: None when the queue's row is still exactly that position, without reading the
        segment rows. Every update of the row bumps its version (a commit, retention moving the minimum,
        a lease), so a view that finds its position unchanged has nothing new to load.
        """
        kinds = {_file_type(name): name for name in file_types}
        segments: dict[str, list[SegmentRecord]] = {name: [] for name in file_types}
        with self._reading("read a queue and its segments") as session:
            connection = session.connection()
            row = connection.execute(_QUEUE_ROW, {"topic": topic, "queue_id": queue_id}).first()
            if row is None:
                raise NotFoundError(f"queue {topic}/{queue_id} is not in the metadata store")
            position = _queue_position(topic, row)
            if position == unless:
                return None
            found = connection.execute(
                _SEGMENT_ROWS, {"path": path, "kinds": list(kinds), "statuses": list(LIVE_SEGMENT_STATUSES)}
            )
            for segment in found:
                segments[kinds[segment.file_type]].append(_segment_record(segment))
        return position, segments

    def list_queues(self, topic: str | None = None) -> list[QueuePosition]:
        """Every queue (of one topic, or of all), in one query: what a restart reads first."""
        statement = select(Topic.name, Queue).join(Topic, Topic.id == Queue.topic_id)
        if topic is not None:
            statement = statement.where(Topic.name == topic)
        statement = statement.order_by(Topic.name, Queue.queue_id)
        with self._reading("list queues") as session:
            return [_queue_position(name, row) for name, row in session.execute(statement)]

    def update_queue(
        self,
        topic: str,
        queue_id: int,
        *,
        expected_version: int,
        min_offset: int | None = None,
        max_offset: int | None = None,
    ) -> QueuePosition:
        """Set the queue's positions if its version is still ``expected_version``; bumps the version."""
        return self.record_commit(
            topic, queue_id, expected_version=expected_version, min_offset=min_offset, max_offset=max_offset
        )

    def record_commit(
        self,
        topic: str,
        queue_id: int,
        *,
        expected_version: int,
        min_offset: int | None = None,
        max_offset: int | None = None,
        segments: Sequence[SegmentUpdate] = (),
        expected_epoch: int | None = None,
    ) -> QueuePosition:
        """Queue positions and the segments they rest on, in one transaction with the optimistic check.

        With ``expected_epoch`` (or an installed epoch fence) the update also requires the queue's lease
        epoch to be that one: LeaseLostError when another archiver has taken the queue over since.
        """
        if expected_epoch is None and self._epoch_fence is not None:
            expected_epoch = self._epoch_fence(topic, queue_id)
        _check_offset("min offset", min_offset)
        _check_offset("max offset", max_offset)
        if min_offset is not None and max_offset is not None and min_offset > max_offset:
            raise ValidationError(f"min offset {min_offset} is above max offset {max_offset}")
        values: dict[str, int] = {"b_version": expected_version + 1, "b_updated": now_ms()}
        if min_offset is not None:
            values["b_min_offset"] = min_offset
        if max_offset is not None:
            values["b_max_offset"] = max_offset
        keys = {"b_topic": topic, "b_queue_id": queue_id, "b_expected_version": expected_version}
        if expected_epoch is not None:
            keys["b_expected_epoch"] = expected_epoch
        segment_changes = [self._segment_change(segment) for segment in segments]
        statement = _queue_commit_statement(min_offset is not None, max_offset is not None, expected_epoch is not None)
        url = self._engine.url
        with self._serial, translate_errors("update a queue", url), self._write_engine.begin() as connection:
            row = connection.execute(statement, {**keys, **values}).one_or_none()
            if row is None:
                raise self._missed_commit_error(connection, topic, queue_id, expected_version, expected_epoch)
            for segment, change in zip(segments, segment_changes, strict=True):
                columns, parameters = change
                result = connection.execute(_segment_change_statement(columns), parameters)
                if result.rowcount != 1:
                    raise NotFoundError(
                        f"segment {segment.path}/{segment.file_type}@{segment.base_offset} is not in the metadata store"
                    )
            return QueuePosition(topic, queue_id, *row)

    @staticmethod
    def _segment_change(segment: SegmentUpdate) -> tuple[tuple[str, ...], dict[str, object]]:
        """The columns one segment update sets and its statement's parameters, checked before any write."""
        _check_offset("segment size", segment.size)
        parameters: dict[str, object] = {
            "b_path": segment.path,
            "b_file_type": _file_type(segment.file_type),
            "b_base_offset": segment.base_offset,
        }
        columns = tuple(column for column in SEGMENT_UPDATE_COLUMNS if getattr(segment, column) is not None)
        for column in columns:
            parameters[f"b_{column}"] = getattr(segment, column)
        return columns, parameters

    @staticmethod
    def _missed_commit_error(
        connection: Connection, topic: str, queue_id: int, expected_version: int, expected_epoch: int | None
    ) -> TieredStoreError:
        """Why a queue update matched no row: no topic or queue, a lost lease, or another writer first."""
        topic_id = connection.scalar(select(Topic.id).where(Topic.name == topic))
        if topic_id is None:
            return NotFoundError(f"topic {topic!r} is not in the metadata store")
        found = connection.execute(
            select(Queue.version, Queue.epoch, Queue.owner).where(
                Queue.topic_id == topic_id, Queue.queue_id == queue_id
            )
        ).one_or_none()
        if found is None:
            return NotFoundError(f"queue {topic}/{queue_id} is not in the metadata store")
        current, epoch, owner = found
        if expected_epoch is not None and epoch != expected_epoch:
            return LeaseLostError(
                f"queue {topic}/{queue_id} is at lease epoch {epoch} (owner {owner}), not {expected_epoch}: "
                "another archiver took it over; nothing was recorded"
            )
        return ConcurrentUpdateError(
            f"queue {topic}/{queue_id} is at version {current}, not {expected_version}: another writer updated it first"
        )

    # ---- archivers and leases ----------------------------------------------------------------------

    def _database_now_ms(self, session: Session) -> int:
        """The database's clock: every archiver judges expiry by the same clock, whatever its host's says."""
        if self.dialect == "postgresql":
            seconds = session.scalar(select(func.extract("epoch", func.clock_timestamp())))
            return int(float(seconds or 0) * 1000)
        return now_ms()

    def heartbeat_archiver(
        self, owner: str, *, hostname: str, pid: int, ttl_ms: int, topics: Callable[[str], bool] | None = None
    ) -> Membership:
        """Keep ``owner`` alive for ``ttl_ms`` more; forget archivers whose heartbeat expired; count the rest.

        ``topics`` says which topics' queues count (those archived); default all.
        """
        if ttl_ms <= 0:
            raise ValidationError(f"heartbeat ttl {ttl_ms} ms must be positive")
        with self._writing("renew an archiver heartbeat") as session:
            now = self._database_now_ms(session)
            # Rows another transaction holds (a paused peer's heartbeat) are left for a later round, never waited on.
            expired = aliased(Archiver)
            session.execute(
                delete(Archiver).where(
                    Archiver.owner.in_(
                        select(expired.owner)
                        .where(expired.heartbeat_expiry < now, expired.owner != owner)
                        .with_for_update(skip_locked=True)
                    )
                )
            )
            row = session.get(Archiver, owner)
            if row is None:
                session.add(
                    Archiver(owner=owner, hostname=hostname, pid=pid, started=now, heartbeat_expiry=now + ttl_ms)
                )
            else:
                row.heartbeat_expiry = now + ttl_ms
            session.flush()
            live = session.scalar(select(func.count()).select_from(Archiver).where(Archiver.heartbeat_expiry >= now))
            if topics is None:
                queues = session.scalar(select(func.count()).select_from(Queue))
            else:
                counts = session.execute(
                    select(Topic.name, func.count()).join(Queue, Queue.topic_id == Topic.id).group_by(Topic.name)
                )
                queues = sum(count for name, count in counts if topics(name))
            return Membership(now=now, live_archivers=int(live or 1), queues=int(queues or 0))

    def live_archivers(self) -> list[str]:
        """``owner (host pid N)`` of each archiver whose heartbeat has not expired (the scale-out mode's
        members; an archiver on SQLite without leases holds a lock file instead)."""
        with self._reading("list the running archivers") as session:
            now = self._database_now_ms(session)
            rows = session.execute(
                select(Archiver.owner, Archiver.hostname, Archiver.pid)
                .where(Archiver.heartbeat_expiry >= now)
                .order_by(Archiver.owner)
            )
            return [f"{owner} ({hostname} pid {pid})" for owner, hostname, pid in rows]

    def remove_archiver(self, owner: str) -> None:
        """Forget ``owner`` (a clean shutdown): the others count one archiver less at once."""
        with self._writing("remove an archiver") as session:
            session.execute(delete(Archiver).where(Archiver.owner == owner))

    def _owned_leases(self, session: Session, owner: str) -> list[QueueLease]:
        statement = (
            select(Topic.name, Queue.queue_id, Queue.epoch, Queue.lease_expiry)
            .join(Topic, Topic.id == Queue.topic_id)
            .where(Queue.owner == owner)
            .order_by(Topic.name, Queue.queue_id)
        )
        return [
            QueueLease(name, queue_id, owner, epoch, expiry or 0)
            for name, queue_id, epoch, expiry in session.execute(statement)
        ]

    def renew_leases(self, owner: str, *, ttl_ms: int) -> list[QueueLease]:
        """Extend every lease ``owner`` still holds by ``ttl_ms``; returns them (a lease taken over is absent).

        A lease that expired but was not taken over is extended too: its epoch is unchanged, so nobody
        else has written the queue meanwhile.
        """
        with self._writing("renew leases") as session:
            now = self._database_now_ms(session)
            session.execute(update(Queue).where(Queue.owner == owner).values(lease_expiry=now + ttl_ms))
            return self._owned_leases(session, owner)

    def acquire_leases(
        self, owner: str, *, ttl_ms: int, limit: int, topics: Callable[[str], bool] | None = None
    ) -> list[QueueLease]:
        """Take up to ``limit`` queues that nobody holds or whose lease expired; each takeover bumps the epoch.

        ``topics`` says which topics' queues may be taken (those archived); default all.

        Candidates are locked with ``FOR UPDATE SKIP LOCKED`` on PostgreSQL (archivers acquiring at the
        same moment take different queues instead of waiting on each other); each update also checks
        the epoch it read, so a queue is never given to two owners.
        """
        if limit <= 0:
            return []
        with self._writing("acquire leases") as session:
            now = self._database_now_ms(session)
            takeable = [
                Queue.owner.is_distinct_from(owner),
                or_(Queue.owner.is_(None), Queue.lease_expiry.is_(None), Queue.lease_expiry < now),
            ]
            if topics is not None:
                names = session.execute(select(Topic.id, Topic.name))
                skipped = [topic_id for topic_id, name in names if not topics(name)]
                if skipped:
                    takeable.append(Queue.topic_id.not_in(skipped))
            candidates = session.execute(
                select(Queue.topic_id, Queue.queue_id, Queue.epoch, Topic.name)
                .join(Topic, Topic.id == Queue.topic_id)
                .where(*takeable)
                .order_by(Queue.topic_id, Queue.queue_id)
                .limit(limit)
                .with_for_update(skip_locked=True, of=Queue)
            ).all()
            acquired = []
            for topic_id, queue_id, epoch, name in candidates:
                result = session.execute(
                    update(Queue)
                    .where(Queue.topic_id == topic_id, Queue.queue_id == queue_id, Queue.epoch == epoch)
                    .values(owner=owner, epoch=epoch + 1, lease_expiry=now + ttl_ms)
                )
                if result.rowcount == 1:  # type: ignore[attr-defined]
                    acquired.append(QueueLease(name, queue_id, owner, epoch + 1, now + ttl_ms))
            return acquired

    def release_leases(self, owner: str, keys: Collection[QueueKey] | None = None) -> int:
        """Give up ``owner``'s leases (those of ``keys``, or all); the next owner's takeover bumps the epoch."""
        with self._writing("release leases") as session:
            statement = update(Queue).where(Queue.owner == owner)
            if keys is not None:
                if not keys:
                    return 0
                topic_ids: dict[str, int] = {
                    name: topic_id
                    for name, topic_id in session.execute(
                        select(Topic.name, Topic.id).where(Topic.name.in_({t for t, _ in keys}))
                    )
                }
                released = 0
                for topic, queue_id in keys:
                    if topic not in topic_ids:
                        continue
                    result = session.execute(
                        statement.where(Queue.topic_id == topic_ids[topic], Queue.queue_id == queue_id).values(
                            owner=None, lease_expiry=None
                        )
                    )
                    released += int(result.rowcount)  # type: ignore[attr-defined]
                return released
            return int(session.execute(statement.values(owner=None, lease_expiry=None)).rowcount)  # type: ignore[attr-defined]

    # ---- segments --------------------------------------------------------------------------------

    def add_segment(
        self,
        path: str,
        file_type: str,
        base_offset: int,
        *,
        begin_timestamp: int | None = None,
        created_timestamp: int | None = None,
        queue: QueueKey | None = None,
    ) -> SegmentRecord:
        """Record a NEW, empty segment (before any byte is written to it).

        A DELETED row with the same key is reused: after orphan removal a segment can be created
        again at the offset of one that was removed. With ``queue``, fenced by the installed epoch fence.
        """
        kind = _file_type(file_type)
        _check_offset("base offset", base_offset)
        stamp = created_timestamp if created_timestamp is not None else now_ms()
        with self._writing("add a segment") as session:
            self._require_lease(session, queue)
            row = session.scalar(self._segment_query(path, kind, base_offset))
            if row is not None and row.status != SegmentStatus.DELETED:
                raise ValidationError(
                    f"segment {path}/{kind.value}@{base_offset} already exists with status {row.status.value}"
                )
            if row is None:
                row = Segment(path=path, file_type=kind, base_offset=base_offset)
                session.add(row)
            row.size = 0
            row.status = SegmentStatus.NEW
            row.created_timestamp = stamp
            row.begin_timestamp = begin_timestamp
            row.end_timestamp = begin_timestamp
            row.sealed_timestamp = None
            session.flush()
            return _segment_record(row)

    @staticmethod
    def _segment_query(path: str, kind: SegmentFileType, base_offset: int):  # type: ignore[no-untyped-def]
        return select(Segment).where(
            Segment.path == path, Segment.file_type == kind, Segment.base_offset == base_offset
        )

    def get_segment(self, path: str, file_type: str, base_offset: int) -> SegmentRecord:
        with self._reading("read a segment") as session:
            row = session.scalar(self._segment_query(path, _file_type(file_type), base_offset))
            if row is None:
                raise NotFoundError(f"segment {path}/{file_type}@{base_offset} is not in the metadata store")
            return _segment_record(row)

    def update_segment(self, change: SegmentUpdate, *, queue: QueueKey | None = None) -> SegmentRecord:
        """Apply ``change`` to its segment row; with ``queue``, fenced by the installed epoch fence."""
        with self._writing("update a segment") as session:
            self._require_lease(session, queue)
            return self._apply_segment_update(session, change)

    def _apply_segment_update(self, session: Session, change: SegmentUpdate) -> SegmentRecord:
        kind = _file_type(change.file_type)
        _check_offset("segment size", change.size)
        row = session.scalar(self._segment_query(change.path, kind, change.base_offset))
        if row is None:
            raise NotFoundError(f"segment {change.path}/{kind.value}@{change.base_offset} is not in the metadata store")
        for column in SEGMENT_UPDATE_COLUMNS:
            value = getattr(change, column)
            if value is not None:
                setattr(row, column, value)
        session.flush()
        return _segment_record(row)

    def list_segments(
        self, path: str, file_type: str, *, statuses: Iterable[SegmentStatus] = LIVE_SEGMENT_STATUSES
    ) -> list[SegmentRecord]:
        """One file's segments in the given states, by ascending base offset."""
        arguments = {"path": path, "kinds": [_file_type(file_type)], "statuses": list(statuses)}
        with self._reading("list segments") as session:
            return [_segment_record(row) for row in session.connection().execute(_SEGMENT_ROWS, arguments)]

    def list_all_segments(
        self,
        *,
        file_types: Iterable[str] | None = None,
        statuses: Iterable[SegmentStatus] = LIVE_SEGMENT_STATUSES,
    ) -> dict[tuple[str, SegmentFileType], list[SegmentRecord]]:
        """Every segment grouped by (path, file type), ascending base offset: one query for a restart."""
        statement = select(Segment).where(Segment.status.in_(list(statuses)))
        if file_types is not None:
            statement = statement.where(Segment.file_type.in_([_file_type(t) for t in file_types]))
        statement = statement.order_by(Segment.path, Segment.file_type, Segment.base_offset)
        grouped: dict[tuple[str, SegmentFileType], list[SegmentRecord]] = {}
        with self._reading("list all segments") as session:
            for row in session.scalars(statement):
                grouped.setdefault((row.path, row.file_type), []).append(_segment_record(row))
        return grouped

    def delete_segment(self, path: str, file_type: str, base_offset: int, *, queue: QueueKey | None = None) -> None:
        """Forget a segment row entirely (used for orphans that never held archived data); ``queue`` fences it."""
        with self._writing("delete a segment") as session:
            self._require_lease(session, queue)
            session.execute(
                delete(Segment).where(
                    Segment.path == path,
                    Segment.file_type == _file_type(file_type),
                    Segment.base_offset == base_offset,
                )
            )

    def delete_segments_under(self, path: str) -> int:
        """Forget every segment row at ``path`` or below it (a whole queue or topic); returns the count."""
        with self._writing("delete segments") as session:
            result = session.execute(
                delete(Segment).where(or_(Segment.path == path, Segment.path.startswith(f"{path}/", autoescape=True)))
            )
            return int(result.rowcount)  # type: ignore[attr-defined]

    # ---- index files -----------------------------------------------------------------------------

    def add_index_file(self, name: str, *, begin_timestamp: int | None = None) -> IndexFileRecord:
        stamp = now_ms()
        try:
            with self._writing("add an index file") as session:
                row = IndexFile(
                    name=name,
                    status=IndexFileStatus.UNSEALED,
                    begin_timestamp=begin_timestamp,
                    end_timestamp=begin_timestamp,
                    item_count=0,
                    size=0,
                    created=stamp,
                    updated=stamp,
                )
                session.add(row)
                session.flush()
                return _index_file_record(row)
        except MetadataError as exc:
            if isinstance(exc.__cause__, SqlIntegrityError):
                raise ValidationError(f"index file {name!r} already exists") from exc
            raise

    def get_index_file(self, name: str) -> IndexFileRecord:
        with self._reading("read an index file") as session:
            row = session.scalar(select(IndexFile).where(IndexFile.name == name))
            if row is None:
                raise NotFoundError(f"index file {name!r} is not in the metadata store")
            return _index_file_record(row)

    def update_index_file(
        self,
        name: str,
        *,
        status: IndexFileStatus | None = None,
        begin_timestamp: int | None = None,
        end_timestamp: int | None = None,
        item_count: int | None = None,
        size: int | None = None,
    ) -> IndexFileRecord:
        with self._writing("update an index file") as session:
            row = session.scalar(select(IndexFile).where(IndexFile.name == name))
            if row is None:
                raise NotFoundError(f"index file {name!r} is not in the metadata store")
            changes = {
                "status": status,
                "begin_timestamp": begin_timestamp,
                "end_timestamp": end_timestamp,
                "item_count": item_count,
                "size": size,
            }
            for column, value in changes.items():
                if value is not None:
                    setattr(row, column, value)
            row.updated = now_ms()
            session.flush()
            return _index_file_record(row)

    def list_index_files(
        self,
        *,
        statuses: Iterable[IndexFileStatus] | None = None,
        begin_timestamp: int | None = None,
        end_timestamp: int | None = None,
        prefix: str | None = None,
    ) -> list[IndexFileRecord]:
        """Index files, optionally only those whose time interval overlaps [begin, end]; oldest first.

        A file with no timestamps yet (no items) overlaps nothing. ``prefix`` keeps the names that start
        with it (taken literally: ``_`` and ``%`` are not wildcards).
        """
        statement = select(IndexFile)
        if prefix is not None:
            statement = statement.where(IndexFile.name.startswith(prefix, autoescape=True))
        if statuses is not None:
            statement = statement.where(IndexFile.status.in_(list(statuses)))
        if end_timestamp is not None:
            statement = statement.where(IndexFile.begin_timestamp <= end_timestamp)
        if begin_timestamp is not None:
            statement = statement.where(IndexFile.end_timestamp >= begin_timestamp)
        statement = statement.order_by(IndexFile.begin_timestamp.asc().nulls_last(), IndexFile.id)
        with self._reading("list index files") as session:
            return [_index_file_record(row) for row in session.scalars(statement)]

    def delete_index_file(self, name: str) -> None:
        with self._writing("delete an index file") as session:
            session.execute(delete(IndexFile).where(IndexFile.name == name))

    # ---- whole-database copies (rebuilding lost metadata) -------------------------------------------

    def require_empty(self) -> None:
        """ValidationError naming what the database holds unless it holds no row at all."""
        with self._reading("count rows") as session:
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
        with source._reading("read the rows to copy") as session:
            topics = list(session.scalars(select(Topic).order_by(Topic.id)))
            queues = list(session.execute(select(Topic.name, Queue).join(Topic, Topic.id == Queue.topic_id)))
            segments = list(session.scalars(select(Segment).order_by(Segment.id)))
            index_files = list(session.scalars(select(IndexFile).order_by(IndexFile.id)))
        with self._writing("write the rebuilt rows") as session:
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
