"""Queue leases: how several archiver processes sharing one PostgreSQL split the queues, and fence each other.

Each archiver has an owner id and, every ``renew_interval`` seconds, runs one lease round (each step
one short transaction in the metadata database, see ``metadata.leases.LeaseStore``):

1. heartbeat its membership row, which says how many archivers are alive;
2. renew every lease it holds; a lease missing from the answer was taken over (its epoch bumped):
   the queue is *lost* and must be dropped at once;
3. its fair share is ``ceil(queues / live archivers)``; leases above it are *surplus*: the caller
   stops dispatching them, lets in-flight batches finish and ``release``\\ s them, so a joining
   archiver finds queues to take;
4. below its share it acquires queues nobody holds or whose lease expired (a departed archiver's),
   bumping each one's epoch.

Fencing. A lease is only used while ``now < start of the last successful renewal + lease_duration -
margin`` (local monotonic clock, margin a third of the duration): an archiver that cannot renew stops
starting batches on its queues before any other archiver can take them over. A process paused past
that (SIGSTOP, a long GC, a frozen VM) cannot know it was paused; the epoch fences it instead: each
queue is opened with its ``LeaseHold`` (``hold``), so every position and segment change names the
epoch held (``expected_epoch``) and fails with LeaseLostError after a takeover, and cold storage
refuses to overwrite committed bytes (CommitConflictError). Both mean "this queue is lost", never
"retry". Deleting or cutting cold objects cannot be refused by storage, so ``LeaseStore.check_lease``
comes first, and also holds the lease a full duration (the hold's ``hold_ms``) from the database's
clock: a process paused for less than that between the check and the deletion cannot delete what a
successor wrote.

A process paused in the middle of a metadata transaction holds row locks, and takeovers skip locked
rows (they never wait on a peer). So the manager has PostgreSQL end any transaction of its store that
waits on the process longer than ``lease_duration - margin`` (``MetadataStore.limit_idle_transactions``):
the paused transaction rolls back like a crash, before the lease it relied on has expired, and its
queues are taken over on time.

SQLite is single-process: ``SingleArchiverLock`` holds an exclusive lock on a file next to the
database, and a second archiver refuses to start with a one-line ConfigError.
"""

from __future__ import annotations

import fcntl
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from tieredstore.basics import QueueKey
from tieredstore.directories import ensure_directory
from tieredstore.errors import ArchiverRunningError, ConfigError, LeaseLostError
from tieredstore.metadata import LeaseHold, MetadataStore, QueueLease
from tieredstore.metadata.engine import parse_url, sqlite_path

log = structlog.get_logger(__name__)

# How much of the lease an archiver gives up at its end: it stops writing this long before anyone may take over.
SAFETY_MARGIN_FRACTION = 1 / 3


def default_owner_id() -> str:
    """``<hostname>-<pid>-<random>``: unique per process start, readable in the queues table."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True, slots=True)
class LeaseChanges:
    """What one lease round changed."""

    acquired: list[QueueKey] = field(default_factory=list)
    lost: list[QueueKey] = field(default_factory=list)
    surplus: list[QueueKey] = field(default_factory=list)
    live_archivers: int = 1
    queues: int = 0
    fair_share: int = 0


class LeaseManager:
    """One archiver's queue leases; thread-safe (rounds run in a worker thread, checks on the event loop)."""

    def __init__(
        self,
        metadata: MetadataStore,
        *,
        owner: str | None = None,
        lease_duration: float = 30.0,
        renew_interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        topics: Callable[[str], bool] | None = None,
    ) -> None:
        """``topics`` says which topics are archived: queues of the others are neither leased nor counted."""
        if lease_duration <= 0 or renew_interval <= 0 or renew_interval * 3 > lease_duration * (1 + 1e-9):
            raise ConfigError(
                f"lease renew interval {renew_interval:g}s must be positive and at most a third of the "
                f"lease duration {lease_duration:g}s"
            )
        self.metadata = metadata
        self.owner = owner or default_owner_id()
        self.lease_duration = lease_duration
        self.renew_interval = renew_interval
        self.clock = clock
        self.topics = topics
        self._held: dict[QueueKey, QueueLease] = {}
        self._releasing: set[QueueKey] = set()
        # Local monotonic time until which held leases may be used (see the module docstring).
        self._valid_until = 0.0
        self._lock = threading.Lock()
        # Held for a whole round and by ``close``: a round still running in its worker thread when the
        # archiver shuts down (cancelling the await does not stop the thread) finishes before the leases
        # are handed back, and a round after ``close`` does nothing, so none is taken again behind it.
        self._rounds = threading.Lock()
        self._closed = False
        self._started = False
        # A transaction of this process stalled longer than it may use a lease after renewing it is
        # ended by the server, so its row locks cannot keep the queues from peers once the lease is over.
        metadata.limit_idle_transactions(lease_duration - self.margin)

    @property
    def ttl_ms(self) -> int:
        return int(self.lease_duration * 1000)

    @property
    def margin(self) -> float:
        return self.lease_duration * SAFETY_MARGIN_FRACTION

    # ---- checks (event loop) -------------------------------------------------------------------------

    def holds(self, key: QueueKey) -> bool:
        """May this process start writing ``key`` now: leased, renewed recently enough, not being released."""
        with self._lock:
            return key in self._held and key not in self._releasing and self.clock() < self._valid_until

    def held(self) -> dict[QueueKey, QueueLease]:
        with self._lock:
            return dict(self._held)

    def epoch_of(self, topic: str, queue_id: int) -> int:
        """The epoch held for the queue (what its changes name); LeaseLostError when none is held."""
        with self._lock:
            lease = self._held.get((topic, queue_id))
        if lease is None:
            raise LeaseLostError(f"archiver {self.owner} holds no lease on queue {topic}/{queue_id}; nothing recorded")
        return lease.epoch

    def hold(self, key: QueueKey) -> LeaseHold:
        """What a queue opened under this archiver's lease writes under: the epoch held at each change,
        and a storage deletion holding the lease a full duration (see the module docstring)."""
        return LeaseHold(key, self.epoch_of, hold_ms=self.ttl_ms)

    def forget(self, key: QueueKey) -> None:
        """Drop a lease locally (it was found lost); the database row already belongs to someone else."""
        with self._lock:
            self._held.pop(key, None)
            self._releasing.discard(key)

    # ---- rounds (worker thread) ----------------------------------------------------------------------

    def start(self) -> None:
        """Clear leases a previous process with this owner id left: whoever takes them next bumps the epoch."""
        if self._started:
            return
        stale = self.metadata.leases.release_leases(self.owner)
        if stale:
            log.info("released leases left by a previous run of this owner", owner=self.owner, leases=stale)
        self._started = True

    def round(self) -> LeaseChanges:
        """Heartbeat, renew, compute the fair share, acquire; see the module docstring. Nothing once closed."""
        with self._rounds:
            if self._closed:
                return LeaseChanges()
            return self._round()

    def _round(self) -> LeaseChanges:
        if not self._started:
            self.start()
        started = self.clock()
        membership = self.metadata.leases.heartbeat_archiver(
            self.owner, hostname=socket.gethostname(), pid=os.getpid(), ttl_ms=self.ttl_ms, topics=self.topics
        )
        renewed = {lease.key: lease for lease in self.metadata.leases.renew_leases(self.owner, ttl_ms=self.ttl_ms)}
        with self._lock:
            lost = [key for key, lease in self._held.items() if key not in renewed or renewed[key].epoch != lease.epoch]
            for key in lost:
                self._held.pop(key, None)
                self._releasing.discard(key)
            # Rows of ours this process did not know of cannot exist after ``start``; they would be
            # unfenced (epoch not bumped for us), so they are never adopted.
            for key in renewed.keys() & self._held.keys():
                self._held[key] = renewed[key]
            self._valid_until = started + self.lease_duration - self.margin
        stray = [key for key in renewed if key not in self._held]
        if stray:
            self.metadata.leases.release_leases(self.owner, stray)
        share = math.ceil(membership.queues / max(1, membership.live_archivers))
        acquired: list[QueueKey] = []
        surplus: list[QueueKey] = []
        with self._lock:
            active = [key for key in sorted(self._held) if key not in self._releasing]
        if len(active) > share:
            # Give up the most recently sorted ones; the choice only needs to be stable between rounds.
            surplus = active[share:]
            with self._lock:
                self._releasing.update(surplus)
        elif len(active) < share:
            wanted = share - len(active)
            taken = self.metadata.leases.acquire_leases(
                self.owner, ttl_ms=self.ttl_ms, limit=wanted, topics=self.topics
            )
            for lease in taken:
                with self._lock:
                    self._held[lease.key] = lease
                acquired.append(lease.key)
        return LeaseChanges(
            acquired=acquired,
            lost=lost,
            surplus=surplus,
            live_archivers=membership.live_archivers,
            queues=membership.queues,
            fair_share=share,
        )

    def release(self, keys: list[QueueKey]) -> None:
        """Give up leases whose queues this process no longer writes (surplus, or everything at shutdown)."""
        with self._lock:
            for key in keys:
                self._held.pop(key, None)
                self._releasing.discard(key)
        if keys:
            self.metadata.leases.release_leases(self.owner, keys)

    def close(self) -> None:
        """Release every lease and leave the membership, so the others take the queues over at once.

        Waits for a round in progress; later rounds do nothing.
        """
        with self._rounds:
            self._closed = True
            with self._lock:
                self._held.clear()
                self._releasing.clear()
                self._valid_until = 0.0
            self.metadata.leases.release_leases(self.owner)
            self.metadata.leases.remove_archiver(self.owner)


class SingleArchiverLock:
    """An exclusive lock on ``<database>.archiver.lock``: one archiver per SQLite metadata database.

    The operating system drops the lock when the process dies, however it dies, so a restart after a
    crash is never refused.
    """

    def __init__(self, database: Path, *, action: str | None = None) -> None:
        """``action``: what a command other than an archiver takes the lock for ("deleting a topic"), so
        that a running archiver makes it refuse with a message about stopping it."""
        self.database = database
        self.path = database.with_name(database.name + ".archiver.lock")
        self.action = action
        self._fd: int | None = None

    @classmethod
    def for_url(cls, url: str, *, action: str | None = None) -> SingleArchiverLock | None:
        """The lock for a SQLite file URL; None for PostgreSQL or an in-memory database (one process anyway)."""
        path = sqlite_path(parse_url(url))
        return None if path is None else cls(path.resolve(), action=action)

    def acquire(self) -> None:
        ensure_directory(self.path.parent, "the SQLite metadata database's directory")
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            if self.action is not None:
                raise ArchiverRunningError(
                    f"an archiver (pid {holder}) is running on the SQLite metadata database {self.database}; "
                    f"stop it (tieredstore run) before {self.action}"
                ) from None
            raise ConfigError(
                f"another archiver (pid {holder}) is already running on the SQLite metadata database "
                f"{self.database}; SQLite mode is single-process: stop it, or use "
                "PostgreSQL to run several archivers"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> SingleArchiverLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
