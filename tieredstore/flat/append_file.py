"""FlatAppendFile: one logical append-only file made of an ordered list of cold segments.

Only the last segment is writable. Offsets are byte positions in the logical file: a segment's base
offset is where it starts, so the file's min offset is the first segment's base and its commit
offset is the last segment's base plus its commit position. A segment is recorded in metadata before
any byte is written to it, so recovery from metadata sees every segment that can hold bytes; a
full segment is committed and recorded SEALED (with its final size) before the next one starts.

``commit_before`` orders commits across files: a consume queue names its commit log there, so no
consume-queue byte becomes durable before the commit-log bytes it points at.

A file may have holes: ``start_segment_at`` seals the last segment and starts the next one further
on (a consume queue skipping queue offsets the hot store lost before they were archived). A hole is
recorded by the segment rows alone — a sealed segment ending before the next one's base offset — so
it survives a restart; reading inside a hole is NotFoundError, and a read stops where a hole begins.

A file loaded with ``load`` is read-only: its segments are built from metadata rows as recorded,
without any provider call and without repairs, for readers beside a running archiver.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from tieredstore.errors import NotFoundError, StorageError, ValidationError
from tieredstore.flat.append_base import (
    DEFAULT_ROLLING_INTERVAL_MS,
    RECOVERABLE_STATUSES,
    Clock,
    HeldRuns,
)
from tieredstore.flat.append_upkeep import AppendUpkeep
from tieredstore.metadata import SegmentUpdate
from tieredstore.providers.base import DEFAULT_MAX_SIZE, AppendResult

__all__ = [
    "DEFAULT_ROLLING_INTERVAL_MS",
    "RECOVERABLE_STATUSES",
    "Clock",
    "FlatAppendFile",
    "HeldRuns",
]


class FlatAppendFile(AppendUpkeep):
    """An ordered list of FileSegments of one type under one logical path: appended, rolled, committed and
    read here; expired, cut and recovered in ``AppendUpkeep``; positions and segment rows in ``AppendFileBase``."""

    # ---- appends, rolling and commits --------------------------------------------------------------

    def would_roll(self, size: int) -> bool:
        """Whether appending ``size`` bytes now starts a new segment."""
        if not self.segments:
            return True
        last = self.segments[-1]
        if last.is_closed:
            return True
        limit = last.max_size
        return limit is not None and last.append_position > 0 and last.append_position + size > limit

    def fitting(self, sizes: Sequence[int] | npt.NDArray[np.int64]) -> int:
        """How many of ``sizes``, appended in order as one run, go to the segment the first would go to.

        That is the last segment, or a new one when the first append would roll: at least one item
        (an empty segment takes one of any size), then as many as fit its max size.
        """
        if len(sizes) == 0:
            return 0
        room = self._room(int(sizes[0]))
        if room is None:
            return len(sizes)
        ends = np.cumsum(np.asarray(sizes, dtype=np.int64))
        return max(1, int(np.searchsorted(ends, room, side="right")))

    def _room(self, first_size: int) -> int | None:
        """Bytes the segment that an append of ``first_size`` goes to has left (None: unlimited)."""
        if self.would_roll(first_size):
            return self.max_segment_size if self.max_segment_size is not None else DEFAULT_MAX_SIZE[self.file_type]
        last = self.segments[-1]
        return None if last.max_size is None else last.max_size - last.append_position

    def fitting_items(self, item_size: int, count: int) -> int:
        """``fitting`` for ``count`` items of ``item_size`` bytes each (consume-queue units), by arithmetic."""
        if count <= 0:
            return 0
        room = self._room(item_size)
        if room is None:
            return count
        return max(1, min(count, room // item_size))

    async def append(self, data: bytes | bytearray, timestamp: int, max_timestamp: int | None = None) -> int:
        """Buffer ``data``, rolling to a new segment when the last one is full; returns its offset.

        ``max_timestamp`` is the newest time in ``data`` when it holds a run of items (``timestamp`` the
        oldest); a ``bytearray`` is taken over by the segment (see ``FileSegment.append``).
        """
        self._require_writable("append")
        if not self.segments:
            await self._start_segment(self._initial_offset, timestamp)
        for _ in range(3):
            offset = self.append_offset
            result = self.segments[-1].append(data, timestamp, max_timestamp)
            if result is AppendResult.SUCCESS:
                return offset
            if result is AppendResult.BUFFER_FULL:
                await self.commit()
            else:  # FILE_FULL, or FILE_CLOSED for a sealed last segment found at recovery
                await self.roll(timestamp)
        raise StorageError(f"{self.path}/{self.file_type.value}: could not append {len(data)} bytes")

    async def prepare_append(self, size: int, timestamp: int) -> None:
        """Start, roll or commit now whatever the next ``append`` of ``size`` bytes would need, so it only buffers.

        A caller appending to two files in step prepares the second before appending to the first, so a
        failure (storage or metadata) strikes before either file holds the new bytes.
        """
        self._require_writable("append")
        if not self.segments:
            await self._start_segment(self._initial_offset, timestamp)
        if self.would_roll(size):
            await self.roll(timestamp)
        if self.segments[-1].buffers_full:
            await self.commit()

    def should_roll_by_time(self, now_ms: int) -> bool:
        """The open segment holds data and began at least the rolling interval before ``now_ms``, whatever its size.

        An empty open segment never rolls: a roll seals a segment, and a sealed empty one could not be
        written again nor rolled (see ``roll``). A read-only view, whose segments are all closed, answers
        for the writer's copy of it (what a retention pass there would roll).
        """
        if not self.segments or self.rolling_interval_ms is None:
            return False
        last = self.segments[-1]
        return (
            (self.read_only or not last.is_closed)
            and last.append_position > 0
            and last.min_timestamp is not None
            and now_ms - last.min_timestamp >= self.rolling_interval_ms
        )

    async def try_rolling(self, now_ms: int | None = None) -> bool:
        """Roll to a new segment if ``should_roll_by_time``; returns whether it did."""
        if not self.should_roll_by_time(self.clock() if now_ms is None else now_ms):
            return False
        await self.roll()
        return True

    async def roll(self, timestamp: int | None = None) -> None:
        """Commit and seal the last segment, then start a new one at the commit offset."""
        if not self.segments:
            return
        await self.commit()
        last = self.segments[-1]
        if last.commit_position > 0:
            await self._seal(last)
            await self._start_segment(self.commit_offset, timestamp)
        elif last.is_closed:
            raise StorageError(f"{last.key} is sealed but empty; it cannot be rolled")

    async def start_segment_at(self, offset: int, timestamp: int | None = None) -> None:
        """Leave a hole: seal the last segment and start an empty one at ``offset`` (past the append offset).

        Nothing may be buffered. An empty last segment is removed rather than sealed (an empty segment
        holds nothing a hole could follow); if it was the only one the file simply starts at ``offset``.
        Metadata is written in the order seal, then add, so a crash in between leaves no hole at all.
        """
        self._require_writable("start a segment")
        if self.pending_bytes:
            raise ValidationError(f"{self.path}/{self.file_type.value}: commit buffered bytes before leaving a hole")
        if offset < self.append_offset:
            raise ValidationError(
                f"{self.path}/{self.file_type.value}: a new segment at {offset} would overlap data up to "
                f"{self.append_offset}"
            )
        if self.segments and self.segments[-1].commit_position == 0:
            await self._destroy_segment(self.segments.pop(), forget=True)
        if not self.segments:
            self._initial_offset = offset
            return
        last = self.segments[-1]
        if not last.is_closed:
            await self._seal(last)
        await self._start_segment(offset, timestamp)

    async def commit(self) -> None:
        """Make every buffered byte durable (after ``commit_before``'s); StorageError keeps the buffers."""
        self._require_writable("commit")
        if self.commit_before is not None:
            await self.commit_before.commit()
        for segment in self.segments:
            if segment.pending_bytes:
                await segment.commit()

    def segment_update(self) -> SegmentUpdate | None:
        """The last segment's committed size and time range for metadata, if it changed since recorded."""
        if not self.segments:
            return None
        last = self.segments[-1]
        if self._recorded_sizes.get(last.base_offset) == last.commit_position:
            return None
        return self._size_update(last)

    def mark_recorded(self, update: SegmentUpdate) -> None:
        if update.size is not None:
            self._recorded_sizes[update.base_offset] = update.size

    # ---- reads -----------------------------------------------------------------------------------

    def segment_index(self, offset: int) -> int:
        """Index of the segment holding ``offset``; NotFoundError below the min offset or inside a hole."""
        if offset < self.min_offset or not self.segments:
            raise NotFoundError(
                f"{self.path}/{self.file_type.value}: offset {offset} is below the min offset {self.min_offset}"
            )
        bases = [segment.base_offset for segment in self.segments]
        index = bisect.bisect_right(bases, offset) - 1
        segment = self.segments[index]
        if index < len(self.segments) - 1 and offset >= segment.base_offset + segment.commit_position:
            following = self.segments[index + 1].base_offset
            if following > segment.base_offset + segment.commit_position:
                raise NotFoundError(
                    f"{self.path}/{self.file_type.value}: offset {offset} lies in a hole "
                    f"[{segment.base_offset + segment.commit_position}, {following}) that holds no data"
                )
        return index

    async def read(self, offset: int, length: int) -> bytes:
        """Committed bytes in [offset, offset + length), across segments, trimmed at the commit offset.

        A read stops where a hole begins; a read starting inside a hole is NotFoundError.
        """
        if length < 0:
            raise ValidationError(f"read length {length} must not be negative")
        end = min(offset + length, self.commit_offset)
        if end <= offset:
            if offset < self.min_offset:
                self.segment_index(offset)  # raises NotFoundError
            return b""
        parts: list[bytes] = []
        index = self.segment_index(offset)
        position = offset
        while position < end and index < len(self.segments):
            segment = self.segments[index]
            if segment.base_offset > position:
                break  # a hole: the bytes so far are all that is contiguous
            segment_end = min(end, segment.base_offset + segment.commit_position)
            if segment_end > position:
                parts.append(await segment.read(position - segment.base_offset, segment_end - position))
            position = max(position, segment_end)
            index += 1
        return b"".join(parts)

    async def read_from(self, offset: int, max_length: int) -> bytes:
        """Committed bytes from ``offset`` for a reader going through the file in order (see
        ``FileSegment.read_from``): at least one byte when any is there, at most ``max_length``, and
        never past the end of the segment holding ``offset``, or of the storage object holding it.
        """
        if max_length < 0:
            raise ValidationError(f"read length {max_length} must not be negative")
        if offset >= self.commit_offset or max_length == 0:
            if offset < self.min_offset:
                self.segment_index(offset)  # raises NotFoundError
            return b""
        segment = self.segments[self.segment_index(offset)]
        position = offset - segment.base_offset
        return await segment.read_from(position, min(max_length, self.commit_offset - offset))
