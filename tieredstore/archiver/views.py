"""What the archiver reports and sees: a queue's hot view, its status, running totals, a ``run_once`` result."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from tieredstore.basics import QueueKey as QueueKey  # the archiver's queues are named as everywhere else


@dataclass(frozen=True, slots=True)
class HotView:
    """What the hot store says about one queue at one moment."""

    min_offset: int
    max_offset: int
    # STORETIMESTAMP of the first message not archived yet; None when nothing is pending.
    oldest_pending_ms: int | None
    # One past the last message a batch may take: a followed store's flushed end; the write position of a
    # store this process writes, which the batch read flushes first. Lag counts to max_offset.
    archivable_offset: int


# A queue's view before the first scan looked at it.
UNSEEN = HotView(0, 0, None, 0)


@dataclass(frozen=True, slots=True)
class QueueStatus:
    """One queue as the archiver sees it: for progress displays and ``--once`` summaries."""

    topic: str
    queue_id: int
    archived_offset: int
    hot_min_offset: int
    hot_max_offset: int
    failures: int
    last_error: str | None

    @property
    def lag(self) -> int:
        return max(0, self.hot_max_offset - self.archived_offset)


@dataclass(slots=True)
class DispatchStats:
    """Running totals since the dispatcher started."""

    messages: int = 0
    bytes: int = 0
    commits: int = 0
    commit_failures: int = 0
    lost_messages: int = 0
    # Queues dropped because another archiver took them over (or wrote where this one meant to).
    queues_lost: int = 0
    started: float = field(default_factory=time.monotonic)

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started


@dataclass(frozen=True, slots=True)
class OnceResult:
    """What ``run_once`` archived, and the queues it could not finish (with their last error)."""

    stats: DispatchStats
    failed: dict[QueueKey, str]
