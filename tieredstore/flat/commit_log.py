"""FlatCommitLogFile: a queue's cold commit log, rolled by size and by age (see ``FlatAppendFile.try_rolling``).

Records are packed back to back (no blank filler in the cold tier); a record's PHYSICALOFFSET is its
offset in this file. The first queue offset of each segment is read from its first record once and
cached, for lookups by queue offset that must not touch the consume queue.
"""

from __future__ import annotations

import bisect
import struct

from tieredstore.basics import now_ms
from tieredstore.errors import CorruptRecordError, NotFoundError
from tieredstore.flat.append_file import DEFAULT_ROLLING_INTERVAL_MS, Clock, FlatAppendFile
from tieredstore.formats.message import MIN_RECORD_SIZE, POS_QUEUE_OFFSET, store_timestamp_of
from tieredstore.formats.naming import FileType
from tieredstore.metadata import LeaseHold, MetadataStore
from tieredstore.providers.base import FileSegment, Provider

RECORD_HEAD_SIZE = MIN_RECORD_SIZE + 40  # enough for any header field up to STORETIMESTAMP (IPv6 hosts)


class FlatCommitLogFile(FlatAppendFile):
    """The commit log of one queue in cold storage."""

    def __init__(
        self,
        provider: Provider,
        metadata: MetadataStore,
        path: str,
        *,
        max_segment_size: int | None = None,
        rolling_interval_ms: int | None = DEFAULT_ROLLING_INTERVAL_MS,
        clock: Clock = now_ms,
        lease: LeaseHold | None = None,
    ) -> None:
        super().__init__(
            provider,
            metadata,
            path,
            FileType.COMMIT_LOG,
            max_segment_size=max_segment_size,
            rolling_interval_ms=rolling_interval_ms,
            clock=clock,
            lease=lease,
        )
        self._first_queue_offsets: dict[int, int] = {}

    async def record_head(self, offset: int) -> bytes:
        """The first bytes of the record at ``offset`` (enough for every fixed header field)."""
        head = await self.read(offset, RECORD_HEAD_SIZE)
        if len(head) < MIN_RECORD_SIZE:
            raise CorruptRecordError(
                f"only {len(head)} committed bytes where a record should start",
                location=f"{self.path}/{FileType.COMMIT_LOG.value}",
                offset=offset,
            )
        return head

    async def store_timestamp_at(self, offset: int) -> int:
        return store_timestamp_of(await self.record_head(offset))

    async def queue_offset_at(self, offset: int) -> int:
        (queue_offset,) = struct.unpack_from(">q", await self.record_head(offset), POS_QUEUE_OFFSET)
        return int(queue_offset)

    async def first_queue_offset(self, segment: FileSegment) -> int:
        """Queue offset of the first record in ``segment`` (cached: a segment's head never changes)."""
        cached = self._first_queue_offsets.get(segment.base_offset)
        if cached is None:
            cached = await self.queue_offset_at(segment.base_offset)
            self._first_queue_offsets[segment.base_offset] = cached
        return cached

    async def segment_for_queue_offset(self, queue_offset: int) -> FileSegment:
        """The segment whose records include ``queue_offset``, by binary search on first queue offsets."""
        committed = [s for s in self.segments if s.commit_position > 0]
        if not committed:
            raise NotFoundError(f"{self.path}: the commit log holds no record")
        low, high = 0, len(committed)
        while low < high:
            middle = (low + high) // 2
            if await self.first_queue_offset(committed[middle]) <= queue_offset:
                low = middle + 1
            else:
                high = middle
        if low == 0:
            raise NotFoundError(f"{self.path}: queue offset {queue_offset} is below the commit log's first record")
        return committed[low - 1]

    def segment_for_timestamp(self, timestamp: int) -> FileSegment:
        """The first segment whose newest record is at or after ``timestamp`` (the last one otherwise)."""
        if not self.segments:
            raise NotFoundError(f"{self.path}: the commit log has no segment")
        ends = [s.max_timestamp if s.max_timestamp is not None else -1 for s in self.segments]
        index = bisect.bisect_left(ends, timestamp)
        return self.segments[min(index, len(self.segments) - 1)]

    async def truncate(self, offset: int) -> None:
        await super().truncate(offset)
        self._first_queue_offsets = {
            base: queue_offset for base, queue_offset in self._first_queue_offsets.items() if base < offset
        }

    async def destroy_expired(self, before_timestamp: int, *, limit_offset: int | None = None) -> int:
        removed = await super().destroy_expired(before_timestamp, limit_offset=limit_offset)
        live = {segment.base_offset for segment in self.segments}
        self._first_queue_offsets = {b: q for b, q in self._first_queue_offsets.items() if b in live}
        return removed
