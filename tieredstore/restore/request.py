"""What a restore is asked for and what it did: the request, each queue's outcome, the summary."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from tieredstore.basics import MIB
from tieredstore.errors import ValidationError
from tieredstore.read.records import iso

# A batch also ends where the cold storage object holding it does (an S3 chunk, one GET whole), so this
# cap and ``batch_bytes`` bound batches read from a file system.
DEFAULT_BATCH_MESSAGES = 16384


@dataclass(frozen=True, slots=True)
class RestoreRequest:
    """What to restore: a topic (or one queue) and an offset range or a store-time range."""

    topic: str
    queue_id: int | None = None
    from_offset: int | None = None
    to_offset: int | None = None  # exclusive
    since: int | None = None  # epoch ms, inclusive
    until: int | None = None  # epoch ms, inclusive
    batch_messages: int = DEFAULT_BATCH_MESSAGES
    batch_bytes: int = 16 * MIB
    parallel: int = 4  # queues restored at once
    read_ahead: int = 4  # batches read per queue ahead of the one being written
    max_bytes_in_flight: int = 32 * MIB  # record bytes read from cold storage and not yet written

    def __post_init__(self) -> None:
        if (self.from_offset is not None or self.to_offset is not None) and (
            self.since is not None or self.until is not None
        ):
            raise ValidationError("give an offset range (--from-offset/--to-offset) or a time range, not both")
        if self.from_offset is not None and self.to_offset is not None and self.from_offset > self.to_offset:
            raise ValidationError(f"--from-offset {self.from_offset} is after --to-offset {self.to_offset}")
        if self.since is not None and self.until is not None and self.since > self.until:
            raise ValidationError(f"--since ({iso(self.since)}) is after --until ({iso(self.until)})")
        if self.batch_messages < 1 or self.batch_bytes < 1:
            raise ValidationError("batch sizes must be positive")
        if self.parallel < 1 or self.read_ahead < 1 or self.max_bytes_in_flight < 1:
            raise ValidationError("parallel queues, read-ahead and bytes in flight must be positive")


@dataclass(slots=True)
class QueueOutcome:
    """One queue: the requested range [first, end), where the run began and what it wrote.

    ``lost`` lists the [start, end) offsets in [resumed_at, end) that were never archived;
    ``stopped_at`` is set when the target cannot hold such a gap and the run stops at the first one.
    """

    topic: str
    queue_id: int
    first: int
    end: int
    resumed_at: int
    restored: int = 0
    bytes: int = 0
    lost: list[tuple[int, int]] = field(default_factory=list)
    stopped_at: int | None = None

    @property
    def already_done(self) -> int:
        return self.resumed_at - self.first

    @property
    def lost_count(self) -> int:
        return sum(end - start for start, end in self.lost)

    @property
    def remaining(self) -> int:
        """Archived messages in [resumed_at, end) that this run has not restored (or will not)."""
        return self.end - self.resumed_at - self.lost_count - self.restored

    @property
    def planned(self) -> int:
        """Archived messages this run restores: up to the end, or to where it stops."""
        stop = self.end if self.stopped_at is None else self.stopped_at
        lost_before_stop = sum(min(end, stop) - start for start, end in self.lost if start < stop)
        return stop - self.resumed_at - lost_before_stop


@dataclass(slots=True)
class RestoreSummary:
    """The outcome of a restore (or, with ``dry_run``, what it would do)."""

    dry_run: bool
    target: str
    queues: list[QueueOutcome] = field(default_factory=list)
    seconds: float = 0.0
    peak_bytes_in_flight: int = 0

    @property
    def messages(self) -> int:
        return sum(q.restored for q in self.queues)

    @property
    def bytes(self) -> int:
        return sum(q.bytes for q in self.queues)

    def as_json(self) -> dict[str, Any]:
        rate = self.messages / self.seconds if self.seconds > 0 else 0.0
        return {
            "dry_run": self.dry_run,
            "target": self.target,
            "messages": self.messages,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 3),
            "messages_per_second": round(rate, 1),
            "peak_bytes_in_flight": self.peak_bytes_in_flight,
            "queues": [
                {
                    **{k: v for k, v in asdict(q).items() if k != "lost"},
                    "already_done": q.already_done,
                    "remaining": q.remaining,
                    "lost_ranges": [[start, end] for start, end in q.lost],
                }
                for q in self.queues
            ],
        }
