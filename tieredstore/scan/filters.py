"""ScanFilter: the ranges a scan is limited to (topics, queues, queue offsets, store times).

Spark's pushed filters become one (``tieredstore.spark.filters.push_filters``); the table sync builds
one directly. Topic and queue ranges prune whole queues at planning; the offset and store-time ranges
are re-checked on every row, so a filter's rows are exact whichever partition reads them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

BoolArray = npt.NDArray[np.bool_]


def _ceil_div(value: int, divisor: int) -> int:
    return -(-value // divisor)


@dataclass(frozen=True, slots=True)
class ScanFilter:
    """The conjunction of every pushed filter. Ranges are half-open; None means unbounded."""

    topics: frozenset[str] | None = None
    queue_ids: frozenset[int] | None = None
    queue_id_start: int | None = None
    queue_id_end: int | None = None
    queue_offset_start: int = 0
    queue_offset_end: int | None = None
    timestamp_start_us: int | None = None
    timestamp_end_us: int | None = None

    def allows_topic(self, topic: str) -> bool:
        return self.topics is None or topic in self.topics

    def allows_queue(self, queue_id: int) -> bool:
        if self.queue_ids is not None and queue_id not in self.queue_ids:
            return False
        if self.queue_id_start is not None and queue_id < self.queue_id_start:
            return False
        return self.queue_id_end is None or queue_id < self.queue_id_end

    @property
    def has_time_range(self) -> bool:
        return self.timestamp_start_us is not None or self.timestamp_end_us is not None

    @property
    def time_start_ms(self) -> int | None:
        """The first store time (ms) that can match: store times are whole milliseconds."""
        return None if self.timestamp_start_us is None else _ceil_div(self.timestamp_start_us, 1000)

    @property
    def time_end_ms(self) -> int | None:
        """The first store time (ms) past the range."""
        return None if self.timestamp_end_us is None else _ceil_div(self.timestamp_end_us, 1000)

    def matches_rows(
        self, queue_offsets: npt.NDArray[np.int64], store_timestamps_ms: npt.NDArray[np.int64]
    ) -> BoolArray:
        """``matches_row`` of many rows at once."""
        matches: BoolArray = queue_offsets >= self.queue_offset_start
        if self.queue_offset_end is not None:
            matches &= queue_offsets < self.queue_offset_end
        start_ms, end_ms = self.time_start_ms, self.time_end_ms
        if start_ms is not None:
            matches &= store_timestamps_ms >= start_ms
        if end_ms is not None:
            matches &= store_timestamps_ms < end_ms
        return matches

    def matches_row(self, queue_offset: int, store_timestamp_ms: int) -> bool:
        """The row-level re-check of the offset and time ranges."""
        if queue_offset < self.queue_offset_start:
            return False
        if self.queue_offset_end is not None and queue_offset >= self.queue_offset_end:
            return False
        micros = store_timestamp_ms * 1000
        if self.timestamp_start_us is not None and micros < self.timestamp_start_us:
            return False
        return self.timestamp_end_us is None or micros < self.timestamp_end_us
