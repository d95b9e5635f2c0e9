"""Topics and queue positions: what the archiver records per commit, each change one short transaction
(``record_commits``: the commits of several queues in one).

Queue positions use optimistic concurrency: every update names the version it read and fails with
ConcurrentUpdateError when another writer got there first; a writer under a lease also names the
epoch it holds (see ``metadata.leases``).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import NamedTuple, overload

from sqlalchemy import BindParameter, Update, bindparam, delete, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError as SqlIntegrityError

from tieredstore.basics import check_queue_id
from tieredstore.errors import (
    ConcurrentUpdateError,
    LeaseLostError,
    MetadataError,
    NotFoundError,
    TieredStoreError,
    ValidationError,
)
from tieredstore.metadata.database import Database
from tieredstore.metadata.models import DEFAULT_RESERVE_SECONDS, Queue, Topic, TopicStatus
from tieredstore.metadata.records import (
    LIVE_SEGMENT_STATUSES,
    CommitRecord,
    QueuePosition,
    SegmentRecord,
    SegmentUpdate,
    TopicInfo,
    check_offset,
    file_type_of,
    now_ms,
    queue_position,
    reserve_seconds_of,
    segment_record,
    topic_info,
)
from tieredstore.metadata.segments import SEGMENT_ROWS, segment_change, segment_change_statement

# Core statements built once, with bound parameters: building ORM statements and loading ORM objects were most
# of what reading a queue and its segments cost (~1.8 ms for a read view's load on SQLite, 0.79 ms this way),
# which a cold reader pays when it opens a queue and again each time its reads reach the queue's end.
_QUEUE_ROW = (
    select(*Queue.__table__.columns)
    .select_from(Queue)
    .join(Topic, Topic.id == Queue.topic_id)
    .where(Topic.name == bindparam("topic"), Queue.queue_id == bindparam("queue_id"))
)


@cache
def _queue_commit_statement(sets_min: bool, sets_max: bool, checks_epoch: bool) -> Update:
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
    if checks_epoch:
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


# What ``_apply_commit`` raises for one commit that is refused; anything else fails the whole transaction.
_REFUSALS = (NotFoundError, ConcurrentUpdateError, LeaseLostError)


class _PreparedCommit(NamedTuple):
    """A commit's queue statement and parameters and its segments' changes, all checked before any write."""

    statement: Update
    parameters: dict[str, object]
    segment_changes: list[tuple[tuple[str, ...], dict[str, object]]]


def _prepare(commit: CommitRecord) -> _PreparedCommit:
    """What ``record_commits`` executes for ``commit``; ValidationError for a value no row may take."""
    min_offset, max_offset = commit.min_offset, commit.max_offset
    check_offset("min offset", min_offset)
    check_offset("max offset", max_offset)
    if min_offset is not None and max_offset is not None and min_offset > max_offset:
        raise ValidationError(f"min offset {min_offset} is above max offset {max_offset}")
    parameters: dict[str, object] = {
        "b_topic": commit.topic,
        "b_queue_id": commit.queue_id,
        "b_expected_version": commit.expected_version,
        "b_version": commit.expected_version + 1,
        "b_updated": now_ms(),
    }
    if min_offset is not None:
        parameters["b_min_offset"] = min_offset
    if max_offset is not None:
        parameters["b_max_offset"] = max_offset
    if commit.expected_epoch is not None:
        parameters["b_expected_epoch"] = commit.expected_epoch
    segment_changes = [segment_change(segment) for segment in commit.segments]
    statement = _queue_commit_statement(
        min_offset is not None, max_offset is not None, commit.expected_epoch is not None
    )
    return _PreparedCommit(statement, parameters, segment_changes)


class TopicRows:
    """The topics: created on first use, with their retention and status."""

    _db: Database

    # ---- topics ----------------------------------------------------------------------------------

    def get_or_create_topic(self, name: str, *, reserve_hours: float | None = None) -> TopicInfo:
        """The topic named ``name``, created with ``reserve_hours`` (default 72) if it does not exist."""
        reserve_seconds = DEFAULT_RESERVE_SECONDS if reserve_hours is None else reserve_seconds_of(reserve_hours)
        existing = self._find_topic(name)
        if existing is not None:
            return existing
        stamp = now_ms()
        try:
            with self._db.writing("create a topic") as session:
                row = Topic(
                    name=name,
                    reserve_seconds=reserve_seconds,
                    status=TopicStatus.ACTIVE,
                    created=stamp,
                    updated=stamp,
                )
                session.add(row)
                session.flush()
                return topic_info(row)
        except MetadataError as exc:
            # Another process created it between our read and our insert: theirs is the topic.
            if not isinstance(exc.__cause__, SqlIntegrityError):
                raise
            created = self._find_topic(name)
            if created is None:
                raise
            return created

    def _find_topic(self, name: str) -> TopicInfo | None:
        with self._db.reading("read a topic") as session:
            row = session.scalar(select(Topic).where(Topic.name == name))
            return None if row is None else topic_info(row)

    def get_topic(self, name: str) -> TopicInfo:
        topic = self._find_topic(name)
        if topic is None:
            raise NotFoundError(f"topic {name!r} is not in the metadata store")
        return topic

    def list_topics(self) -> list[TopicInfo]:
        with self._db.reading("list topics") as session:
            return [topic_info(row) for row in session.scalars(select(Topic).order_by(Topic.name))]

    def set_retention(self, name: str, reserve_hours: float) -> TopicInfo:
        """Keep the topic's cold data for ``reserve_hours`` hours (kept to the second)."""
        return self._update_topic(name, reserve_seconds=reserve_seconds_of(reserve_hours))

    def set_topic_status(self, name: str, status: TopicStatus) -> TopicInfo:
        return self._update_topic(name, status=status)

    def _update_topic(self, name: str, **values: object) -> TopicInfo:
        with self._db.writing("update a topic") as session:
            row = session.scalar(select(Topic).where(Topic.name == name))
            if row is None:
                raise NotFoundError(f"topic {name!r} is not in the metadata store")
            for column, value in values.items():
                setattr(row, column, value)
            row.updated = now_ms()
            session.flush()
            return topic_info(row)

    def delete_topic(self, name: str) -> None:
        """Remove the topic and its queues (segment rows are removed by whoever removes the objects)."""
        with self._db.writing("delete a topic") as session:
            result = session.execute(delete(Topic).where(Topic.name == name))
            if result.rowcount == 0:  # type: ignore[attr-defined]
                raise NotFoundError(f"topic {name!r} is not in the metadata store")


class QueueRows(TopicRows):
    """Queue positions, read whole or with their segments, and moved by ``record_commit``."""

    # ---- queues ----------------------------------------------------------------------------------

    def get_or_create_queue(self, topic: str, queue_id: int, *, start_offset: int = 0) -> QueuePosition:
        """The queue's positions, created at ``start_offset`` (with its topic) if it does not exist."""
        check_queue_id(queue_id)
        check_offset("start offset", start_offset)
        existing = self._find_queue(topic, queue_id)
        if existing is not None:
            return existing
        topic_info = self.get_or_create_topic(topic)
        try:
            with self._db.writing("create a queue") as session:
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
                return queue_position(topic, row)
        except MetadataError as exc:
            if not isinstance(exc.__cause__, SqlIntegrityError):
                raise
            created = self._find_queue(topic, queue_id)
            if created is None:
                raise
            return created

    def _find_queue(self, topic: str, queue_id: int) -> QueuePosition | None:
        with self._db.reading("read a queue") as session:
            row = session.connection().execute(_QUEUE_ROW, {"topic": topic, "queue_id": queue_id}).first()
            return None if row is None else queue_position(topic, row)

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
        kinds = {file_type_of(name): name for name in file_types}
        segments: dict[str, list[SegmentRecord]] = {name: [] for name in file_types}
        with self._db.reading("read a queue and its segments") as session:
            connection = session.connection()
            row = connection.execute(_QUEUE_ROW, {"topic": topic, "queue_id": queue_id}).first()
            if row is None:
                raise NotFoundError(f"queue {topic}/{queue_id} is not in the metadata store")
            position = queue_position(topic, row)
            if position == unless:
                return None
            found = connection.execute(
                SEGMENT_ROWS, {"path": path, "kinds": list(kinds), "statuses": list(LIVE_SEGMENT_STATUSES)}
            )
            for segment in found:
                segments[kinds[segment.file_type]].append(segment_record(segment))
        return position, segments

    def list_queues(self, topic: str | None = None) -> list[QueuePosition]:
        """Every queue (of one topic, or of all), in one query: what a restart reads first."""
        statement = select(Topic.name, Queue).join(Topic, Topic.id == Queue.topic_id)
        if topic is not None:
            statement = statement.where(Topic.name == topic)
        statement = statement.order_by(Topic.name, Queue.queue_id)
        with self._db.reading("list queues") as session:
            return [queue_position(name, row) for name, row in session.execute(statement)]

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

        With ``expected_epoch`` (the lease epoch its writer holds) the update also requires the queue to be
        at that epoch, by the row count of its ``UPDATE ... WHERE epoch = :expected``: LeaseLostError when
        another archiver has taken the queue over since, and nothing is recorded.
        """
        commit = CommitRecord(
            topic, queue_id, expected_version, min_offset, max_offset, tuple(segments), expected_epoch
        )
        [result] = self.record_commits([commit])
        if isinstance(result, TieredStoreError):
            raise result
        return result

    def record_commits(self, commits: Sequence[CommitRecord]) -> list[QueuePosition | TieredStoreError]:
        """Several queues' ``record_commit`` in one transaction: one write lock and one durable commit for all.

        Each commit is checked as ``record_commit`` checks it and gets its own result, in order: the
        queue's new position, or the error ``record_commit`` would raise for it alone (ValidationError,
        NotFoundError, ConcurrentUpdateError, LeaseLostError), that commit then recorded not at all and
        the others regardless. Each commit of a batch is a savepoint, so a segment missing after its queue
        row was updated undoes that commit only. A failure of the database itself raises (MetadataError
        and its kinds, as ``record_commit``) and records none of them.
        """
        results: list[QueuePosition | TieredStoreError | None] = [None] * len(commits)
        writes: list[tuple[int, _PreparedCommit]] = []
        for index, commit in enumerate(commits):
            try:
                writes.append((index, _prepare(commit)))
            except TieredStoreError as exc:
                results[index] = exc
        # Queue rows locked in one order by every batch, so two batches (two archivers) cannot deadlock.
        writes.sort(key=lambda write: (commits[write[0]].topic, commits[write[0]].queue_id))
        if len(writes) == 1:
            # Alone, the transaction is the commit's savepoint: a refusal rolls it back.
            index, prepared = writes[0]
            try:
                with self._db.write_connection("update a queue") as connection:
                    results[index] = self._apply_commit(connection, commits[index], prepared)
            except _REFUSALS as exc:
                results[index] = exc
        elif writes:
            with self._db.write_connection("update queues") as connection:
                for index, prepared in writes:
                    savepoint = connection.begin_nested()
                    try:
                        results[index] = self._apply_commit(connection, commits[index], prepared)
                    except _REFUSALS as exc:
                        savepoint.rollback()
                        results[index] = exc
                    else:
                        savepoint.commit()
        return [result for result in results if result is not None]  # every commit has its result by now

    def _apply_commit(self, connection: Connection, commit: CommitRecord, prepared: _PreparedCommit) -> QueuePosition:
        """One commit's statements; one of ``_REFUSALS`` when it is refused, the caller then rolling back
        what it wrote."""
        statement, parameters, segment_changes = prepared
        row = connection.execute(statement, parameters).one_or_none()
        if row is None:
            raise self._missed_commit_error(
                connection, commit.topic, commit.queue_id, commit.expected_version, commit.expected_epoch
            )
        for segment, (columns, segment_parameters) in zip(commit.segments, segment_changes, strict=True):
            result = connection.execute(segment_change_statement(columns), segment_parameters)
            if result.rowcount != 1:
                raise NotFoundError(
                    f"segment {segment.path}/{segment.file_type}@{segment.base_offset} is not in the metadata store"
                )
        return QueuePosition(commit.topic, commit.queue_id, *row)

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
