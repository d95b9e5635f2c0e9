"""FlatConsumeQueueFile: a queue's cold consume queue of 20-byte units, addressed by queue offset.

Byte offset = queue offset * 20, so segment base offsets are queue offsets * 20 too. The store
timestamp of a unit lives in the commit-log record it points at; the time search takes a function
that fetches it, and assumes store timestamps do not decrease along the queue.

Queue offsets lost before they were archived are a hole between two segments (see
``FlatAppendFile.start_segment_at``): ``held_runs`` lists the archived runs, reads inside a hole are
NotFoundError, and searches skip holes.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Awaitable, Callable, Sequence
from typing import NamedTuple

from tieredstore.basics import BoundaryType as BoundaryType  # still importable from here
from tieredstore.basics import now_ms
from tieredstore.errors import CorruptRecordError, ValidationError
from tieredstore.flat.append_file import Clock, FlatAppendFile, HeldRuns
from tieredstore.formats.consume_queue import UNIT_SIZE, ConsumeQueueUnit, iter_units
from tieredstore.formats.naming import FileType
from tieredstore.metadata import LeaseHold, MetadataStore
from tieredstore.providers.base import Provider

TimestampOf = Callable[[ConsumeQueueUnit], Awaitable[int]]


class QueueRuns(NamedTuple):
    """A consume queue's archived queue offsets as [start, end) runs, and the runs lost between them."""

    held: tuple[tuple[int, int], ...]
    lost: tuple[tuple[int, int], ...]


class HeldOffsets:
    """The archived queue offsets of some runs as one dense sequence: index ``k`` to queue offset."""

    def __init__(self, runs: Sequence[tuple[int, int]]) -> None:
        self.runs = [run for run in runs if run[1] > run[0]]
        self._starts = list(itertools.accumulate((end - start for start, end in self.runs), initial=0))

    def __len__(self) -> int:
        return self._starts[-1]

    def offset(self, index: int) -> int:
        run = bisect.bisect_right(self._starts, index) - 1
        return self.runs[run][0] + index - self._starts[run]


class FlatConsumeQueueFile(FlatAppendFile):
    """The consume queue of one queue in cold storage; commits only after its commit log's."""

    def __init__(
        self,
        provider: Provider,
        metadata: MetadataStore,
        path: str,
        *,
        commit_log: FlatAppendFile | None = None,
        max_segment_size: int | None = None,
        initial_queue_offset: int = 0,
        rolling_interval_ms: int | None = None,
        clock: Clock = now_ms,
        lease: LeaseHold | None = None,
    ) -> None:
        if max_segment_size is not None:
            max_segment_size -= max_segment_size % UNIT_SIZE
            if max_segment_size < UNIT_SIZE:
                raise ValidationError(f"a consume-queue segment must hold at least one {UNIT_SIZE}-byte unit")
        super().__init__(
            provider,
            metadata,
            path,
            FileType.CONSUME_QUEUE,
            max_segment_size=max_segment_size,
            initial_offset=initial_queue_offset * UNIT_SIZE,
            commit_before=commit_log,
            rolling_interval_ms=rolling_interval_ms,
            clock=clock,
            lease=lease,
        )
        self._queue_runs: tuple[HeldRuns, QueueRuns] | None = None

    @property
    def min_queue_offset(self) -> int:
        return self.min_offset // UNIT_SIZE

    @property
    def commit_queue_offset(self) -> int:
        return self.commit_offset // UNIT_SIZE

    @property
    def append_queue_offset(self) -> int:
        return self.append_offset // UNIT_SIZE

    @staticmethod
    def position_of(queue_offset: int) -> int:
        return queue_offset * UNIT_SIZE

    @staticmethod
    def queue_offset_of(position: int) -> int:
        return position // UNIT_SIZE

    def queue_runs(self) -> QueueRuns:
        """``held_runs`` and ``lost_runs`` as tuples, remembered until the segments change (readers ask each call)."""
        held = self.held()
        memo = self._queue_runs
        if memo is None or memo[0] is not held:
            runs = QueueRuns(
                tuple((start // UNIT_SIZE, end // UNIT_SIZE) for start, end in held.runs if end > start),
                tuple((start // UNIT_SIZE, end // UNIT_SIZE) for start, end in held.holes),
            )
            memo = self._queue_runs = (held, runs)
        return memo[1]

    def held_runs(self) -> list[tuple[int, int]]:
        """Archived queue offsets as [start, end) runs; more than one only when offsets were lost."""
        return list(self.queue_runs().held)

    def lost_runs(self) -> list[tuple[int, int]]:
        """The [start, end) queue offsets between the min and the commit offset that were never archived."""
        return list(self.queue_runs().lost)

    def reset_initial_queue_offset(self, queue_offset: int) -> None:
        self.reset_initial_offset(queue_offset * UNIT_SIZE)

    async def append_unit(self, unit: ConsumeQueueUnit, timestamp: int) -> int:
        """Buffer one unit; returns its queue offset."""
        return await self.append(unit.encode(), timestamp) // UNIT_SIZE

    async def read_units(self, queue_offset: int, count: int) -> list[ConsumeQueueUnit]:
        """Up to ``count`` committed units from ``queue_offset``; NotFoundError below the min offset."""
        if count <= 0:
            return []
        raw = await self.read(queue_offset * UNIT_SIZE, count * UNIT_SIZE)
        if len(raw) % UNIT_SIZE:
            raise CorruptRecordError(
                f"consume queue returned {len(raw)} bytes, not whole units",
                location=f"{self.path}/{FileType.CONSUME_QUEUE.value}",
                offset=queue_offset * UNIT_SIZE,
            )
        return list(iter_units(raw))

    async def read_unit(self, queue_offset: int) -> ConsumeQueueUnit:
        units = await self.read_units(queue_offset, 1)
        if not units:
            raise CorruptRecordError(
                f"no committed unit at queue offset {queue_offset}",
                location=f"{self.path}/{FileType.CONSUME_QUEUE.value}",
                offset=queue_offset * UNIT_SIZE,
            )
        return units[0]

    async def find_queue_offset(self, timestamp: int, boundary: BoundaryType, timestamp_of: TimestampOf) -> int:
        """Queue offset for a store time, by binary search over committed units (skipping lost offsets).

        LOWER: the smallest offset stored at or after ``timestamp`` (the commit offset if none is).
        UPPER: the largest offset stored at or before ``timestamp`` (the min offset if none is).
        """
        held = HeldOffsets(self.held_runs())
        if not held:
            return self.min_queue_offset if boundary is BoundaryType.UPPER else self.commit_queue_offset
        low, high = 0, len(held)
        if boundary is BoundaryType.LOWER:
            # First offset whose time is >= timestamp.
            while low < high:
                middle = (low + high) // 2
                if await timestamp_of(await self.read_unit(held.offset(middle))) < timestamp:
                    low = middle + 1
                else:
                    high = middle
            return held.offset(low) if low < len(held) else self.commit_queue_offset
        # First offset whose time is > timestamp, then step back one.
        while low < high:
            middle = (low + high) // 2
            if await timestamp_of(await self.read_unit(held.offset(middle))) <= timestamp:
                low = middle + 1
            else:
                high = middle
        return held.offset(max(0, low - 1))
