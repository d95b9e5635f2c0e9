"""The small shared vocabulary of every layer: byte units, the wall clock, a queue's key, a time boundary.

A leaf module: it imports nothing from the project but ``tieredstore.errors``, so providers, metadata,
formats and the access layer can all take their one definition from here without an import cycle.
"""

from __future__ import annotations

import enum
import time
from typing import Literal

from tieredstore.errors import InvalidQueueError

__all__ = [
    "GIB",
    "MIB",
    "Boundary",
    "BoundaryType",
    "QueueKey",
    "check_queue_id",
    "now_ms",
]

MIB = 1 << 20
GIB = 1 << 30

# A queue as (topic, queue id): the key of every per-queue map, lock and lease.
QueueKey = tuple[str, int]

# Which offset a time lookup answers: "lower" the first stored at or after the time, "upper" the last
# stored at or before it. The facade and the hot store take it as this literal.
Boundary = Literal["lower", "upper"]


class BoundaryType(enum.StrEnum):
    """``Boundary`` as an enum, for the CLI's case-insensitive option and the cold tier's lookups.

    LOWER: the first offset stored at or after a time. UPPER: the last offset stored at or before it.
    """

    LOWER = "LOWER"
    UPPER = "UPPER"

    @classmethod
    def of(cls, boundary: Boundary) -> BoundaryType:
        return cls.LOWER if boundary == "lower" else cls.UPPER

    @property
    def boundary(self) -> Boundary:
        return "lower" if self is BoundaryType.LOWER else "upper"


def now_ms() -> int:
    """Wall-clock time in milliseconds since the epoch, as store timestamps and segment times are kept."""
    return time.time_ns() // 1_000_000


def check_queue_id(queue_id: object, limit: int | None = None) -> int:
    """``queue_id`` if it is an integer in 0..limit-1 (any non-negative one when ``limit`` is None).

    Raises InvalidQueueError with the one message every layer gives for a bad queue id.
    """
    if isinstance(queue_id, bool) or not isinstance(queue_id, int):
        raise InvalidQueueError(_outside(queue_id, limit))
    if queue_id < 0 or (limit is not None and queue_id >= limit):
        raise InvalidQueueError(_outside(queue_id, limit))
    return queue_id


def _outside(queue_id: object, limit: int | None) -> str:
    bound = "max_queues_per_topic-1" if limit is None else f"{limit - 1} (max_queues_per_topic={limit})"
    return f"queue id {queue_id!r} is outside 0..{bound}"
