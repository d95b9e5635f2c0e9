"""LeaseStore: the archivers alive and the queue leases they hold, over the metadata store's database.

Several archivers sharing one database split the queues by lease (a queue row's owner, epoch and
expiry; the ``archivers`` table counts who is alive). Lease times are the database's clock, so hosts
with skewed clocks still agree on expiry. Taking a queue over bumps its epoch.

A writer under a lease names the epoch it holds in every change it makes (an argument: nothing is
installed into the metadata store): ``record_commit(expected_epoch=...)`` refuses a stale epoch by the
row count of its ``UPDATE ... WHERE epoch = :expected``, and segment changes given ``expected_epoch``
check it in their own transaction (``require_epoch``). Both fail with LeaseLostError once another
archiver has taken the queue over. A writer holds its queue's epoch as a ``LeaseHold``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from sqlalchemy import delete, func, or_, select, update
from sqlalchemy.orm import Session, aliased

from tieredstore.errors import LeaseLostError, NotFoundError, ValidationError
from tieredstore.metadata.database import Database
from tieredstore.metadata.models import Archiver, Queue, Topic
from tieredstore.metadata.records import QueueKey, now_ms


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
class LeaseHold:
    """A writer's lease on one queue, as its changes name it: the queue, the epoch it holds, and how long
    a storage change holds the lease once checked (``LeaseStore.check_lease``; the lease duration is the
    natural value, None holds nothing).

    ``epoch_of`` answers the epoch held now and raises LeaseLostError once none is (lost or released):
    the archiver's ``LeaseManager.epoch_of``.
    """

    queue: QueueKey
    epoch_of: Callable[[str, int], int]
    hold_ms: int | None = None

    def __post_init__(self) -> None:
        if self.hold_ms is not None and self.hold_ms <= 0:
            raise ValidationError(f"storage hold {self.hold_ms} ms must be positive")

    def epoch(self) -> int:
        """The epoch held for the queue now; LeaseLostError when none is."""
        return self.epoch_of(*self.queue)


def database_now_ms(session: Session, dialect: str) -> int:
    """The database's clock: every archiver judges expiry by the same clock, whatever its host's says."""
    if dialect == "postgresql":
        seconds = session.scalar(select(func.extract("epoch", func.clock_timestamp())))
        return int(float(seconds or 0) * 1000)
    return now_ms()


def require_epoch(
    session: Session, dialect: str, queue: QueueKey, expected_epoch: int
) -> tuple[str | None, int | None]:
    """Raise LeaseLostError unless ``queue`` is still at ``expected_epoch``; its owner and lease expiry as read.

    The queue row is locked (PostgreSQL) until the transaction ends, so a takeover, which bumps the
    epoch, waits for the change being checked or sees it done.
    """
    topic, queue_id = queue
    statement = (
        select(Queue.epoch, Queue.owner, Queue.lease_expiry)
        .join(Topic, Topic.id == Queue.topic_id)
        .where(Topic.name == topic, Queue.queue_id == queue_id)
    )
    if dialect == "postgresql":
        statement = statement.with_for_update(of=Queue)
    found = session.execute(statement).one_or_none()
    if found is None:
        raise NotFoundError(f"queue {topic}/{queue_id} is not in the metadata store")
    epoch, owner, lease_expiry = found
    if epoch != expected_epoch:
        raise LeaseLostError(
            f"queue {topic}/{queue_id} is at lease epoch {epoch} (owner {owner}), not {expected_epoch}: "
            "another archiver took it over; its segments were not changed"
        )
    return owner, lease_expiry


class LeaseStore:
    """Archiver membership and queue leases; thread-safe, every method one transaction."""

    def __init__(self, database: Database) -> None:
        self._db = database

    def check_lease(self, queue: QueueKey, epoch: int, *, hold_ms: int | None = None) -> None:
        """LeaseLostError unless ``queue`` is still at lease ``epoch``, the one its caller holds.

        For a storage change that must not happen once another archiver owns the queue (deleting or
        cutting objects): checked just before it, since storage cannot join a metadata transaction.

        An epoch that is still current only says nobody has taken the queue over *yet*: the lease may
        have expired already (renewals failing), and a takeover could then come between this check and
        the deletion it guards. So with ``hold_ms`` the same transaction also pushes the lease's expiry
        to at least the database's now plus the hold: no peer can take the queue over until then, and
        the change that follows has that long to reach storage. A queue its owner released (no owner;
        the next owner may take it at once) is refused as lost.
        """
        if hold_ms is not None and hold_ms <= 0:
            raise ValidationError(f"storage hold {hold_ms} ms must be positive")
        with self._db.writing("check a lease") as session:
            owner, lease_expiry = require_epoch(session, self._db.dialect, queue, epoch)
            if hold_ms is None:
                return
            topic, queue_id = queue
            if owner is None:
                raise LeaseLostError(
                    f"queue {topic}/{queue_id} was released: its cold segments are no longer this archiver's to change"
                )
            held_until = database_now_ms(session, self._db.dialect) + hold_ms
            if lease_expiry is None or lease_expiry < held_until:
                topic_id = select(Topic.id).where(Topic.name == topic).scalar_subquery()
                session.execute(
                    update(Queue)
                    .where(Queue.topic_id == topic_id, Queue.queue_id == queue_id)
                    .values(lease_expiry=held_until)
                )

    def heartbeat_archiver(
        self, owner: str, *, hostname: str, pid: int, ttl_ms: int, topics: Callable[[str], bool] | None = None
    ) -> Membership:
        """Keep ``owner`` alive for ``ttl_ms`` more; forget archivers whose heartbeat expired; count the rest.

        ``topics`` says which topics' queues count (those archived); default all.
        """
        if ttl_ms <= 0:
            raise ValidationError(f"heartbeat ttl {ttl_ms} ms must be positive")
        with self._db.writing("renew an archiver heartbeat") as session:
            now = database_now_ms(session, self._db.dialect)
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
        with self._db.reading("list the running archivers") as session:
            now = database_now_ms(session, self._db.dialect)
            rows = session.execute(
                select(Archiver.owner, Archiver.hostname, Archiver.pid)
                .where(Archiver.heartbeat_expiry >= now)
                .order_by(Archiver.owner)
            )
            return [f"{owner} ({hostname} pid {pid})" for owner, hostname, pid in rows]

    def remove_archiver(self, owner: str) -> None:
        """Forget ``owner`` (a clean shutdown): the others count one archiver less at once."""
        with self._db.writing("remove an archiver") as session:
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

    @staticmethod
    def _lock_owned(session: Session, owner: str) -> None:
        """Lock ``owner``'s queue rows in (topic name, queue id) order, the order ``record_commits`` writes them
        in: an UPDATE of them all would lock them in the table's order, and could deadlock with a batch."""
        session.execute(
            select(Queue.topic_id, Queue.queue_id)
            .join(Topic, Topic.id == Queue.topic_id)
            .where(Queue.owner == owner)
            .order_by(Topic.name, Queue.queue_id)
            .with_for_update(of=Queue)
        )

    def renew_leases(self, owner: str, *, ttl_ms: int) -> list[QueueLease]:
        """Extend every lease ``owner`` still holds by ``ttl_ms``; returns them (a lease taken over is absent).

        A lease that expired but was not taken over is extended too: its epoch is unchanged, so nobody
        else has written the queue meanwhile.
        """
        with self._db.writing("renew leases") as session:
            now = database_now_ms(session, self._db.dialect)
            self._lock_owned(session, owner)
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
        with self._db.writing("acquire leases") as session:
            now = database_now_ms(session, self._db.dialect)
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
        with self._db.writing("release leases") as session:
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
                for topic, queue_id in sorted(keys):  # the order record_commits locks queue rows in
                    if topic not in topic_ids:
                        continue
                    result = session.execute(
                        statement.where(Queue.topic_id == topic_ids[topic], Queue.queue_id == queue_id).values(
                            owner=None, lease_expiry=None
                        )
                    )
                    released += int(result.rowcount)  # type: ignore[attr-defined]
                return released
            self._lock_owned(session, owner)
            return int(session.execute(statement.values(owner=None, lease_expiry=None)).rowcount)  # type: ignore[attr-defined]
