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

import asyncio
import bisect
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from tieredstore.errors import NotFoundError, ReadOnlyError, StorageError, ValidationError
from tieredstore.formats.naming import FileType
from tieredstore.metadata import LeaseHold, MetadataStore, QueueKey, SegmentRecord, SegmentStatus, SegmentUpdate
from tieredstore.providers.base import DEFAULT_MAX_SIZE, AppendResult, FileSegment, Provider

Clock = Callable[[], int]
RECOVERABLE_STATUSES = (SegmentStatus.NEW, SegmentStatus.SEALED, SegmentStatus.DELETING)
DEFAULT_ROLLING_INTERVAL_MS = 24 * 3600 * 1000


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class HeldRuns:
    """``FlatAppendFile.held``'s answer: committed byte runs and the holes between them, with what they came from."""

    key: tuple[object, ...] = field(repr=False)
    runs: tuple[tuple[int, int], ...]
    holes: tuple[tuple[int, int], ...]


class FlatAppendFile:
    """An ordered list of FileSegments of one type under one logical path."""

    def __init__(
        self,
        provider: Provider,
        metadata: MetadataStore,
        path: str,
        file_type: FileType,
        *,
        max_segment_size: int | None = None,
        initial_offset: int = 0,
        commit_before: FlatAppendFile | None = None,
        rolling_interval_ms: int | None = None,
        clock: Clock = wall_clock_ms,
        lease: LeaseHold | None = None,
    ) -> None:
        """``lease``: the queue's lease when this file is written under one (None: nothing is checked)."""
        self.provider = provider
        self.metadata = metadata
        self.path = path
        self.file_type = file_type
        # Every segment change names its epoch, and a storage deletion checks it first.
        self.lease = lease
        self.max_segment_size = max_segment_size
        self.commit_before = commit_before
        # The open segment is sealed once its oldest data is this old (None: by size only), so that
        # retention, which never removes a file's last segment, can remove what it holds.
        self.rolling_interval_ms = rolling_interval_ms
        self.clock = clock
        self.segments: list[FileSegment] = []
        self._initial_offset = initial_offset
        self._recorded_sizes: dict[int, int] = {}
        self.read_only = False
        # held_ranges' and holes' answers and what they were computed from (see _held_key): readers ask on
        # every call.
        self._held_memo: HeldRuns | None = None

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.path!r}, {self.file_type.value}, min={self.min_offset}, "
            f"commit={self.commit_offset}, append={self.append_offset}, segments={len(self.segments)})"
        )

    @property
    def queue(self) -> QueueKey | None:
        """The queue whose lease this file is written under (None without one)."""
        return None if self.lease is None else self.lease.queue

    def _held_epoch(self) -> int | None:
        """The lease epoch a segment change names (None without a lease); LeaseLostError once none is held."""
        return None if self.lease is None else self.lease.epoch()

    async def _check_lease(self) -> None:
        """Before committed bytes leave storage: the lease still ours, and held for the change (no-op without)."""
        lease = self.lease
        if lease is not None:
            epoch = lease.epoch()
            await asyncio.to_thread(self.metadata.leases.check_lease, lease.queue, epoch, hold_ms=lease.hold_ms)

    # ---- positions -------------------------------------------------------------------------------

    @property
    def min_offset(self) -> int:
        return self.segments[0].base_offset if self.segments else self._initial_offset

    @property
    def commit_offset(self) -> int:
        if not self.segments:
            return self._initial_offset
        last = self.segments[-1]
        return last.base_offset + last.commit_position

    @property
    def append_offset(self) -> int:
        if not self.segments:
            return self._initial_offset
        last = self.segments[-1]
        return last.base_offset + last.append_position

    @property
    def pending_bytes(self) -> int:
        return sum(segment.pending_bytes for segment in self.segments)

    @property
    def is_empty(self) -> bool:
        """No segment at all: the next append starts the file at its initial offset."""
        return not self.segments

    def _held_key(self) -> tuple[object, ...]:
        """What ``held_ranges`` depends on that can change: the segment list object, its length, its first
        and last segments and the last one's commit position.

        Only the last segment grows; the others are sealed before another one starts, and every other
        change (a roll, a hole, retention, a truncation, a reload) replaces the list, changes its length
        or replaces its first or last segment. ``recover`` forgets the answer when it is done, since it
        corrects sizes of segments already listed.
        """
        segments = self.segments
        if not segments:
            return (segments, 0)
        last = segments[-1]
        return (segments, len(segments), segments[0], last, last.commit_position)

    def held(self) -> HeldRuns:
        """The committed bytes as [start, end) runs and the holes between them, as last computed.

        Remembered until the segments change, so a reader asking on every call does not walk a long
        queue's hundreds of segments each time. The same object comes back while nothing changed, so a
        caller may remember what it derives from it by its identity.
        """
        key = self._held_key()
        memo = self._held_memo
        # The list by identity (a list compares by contents); segments have no __eq__, so compare as themselves.
        if memo is not None and memo.key[0] is key[0] and memo.key[1:] == key[1:]:
            return memo
        runs = tuple(self._walk_held_ranges())
        memo = self._held_memo = HeldRuns(
            key, runs, tuple((previous[1], current[0]) for previous, current in itertools.pairwise(runs))
        )
        return memo

    def held_ranges(self) -> list[tuple[int, int]]:
        """The committed bytes as [start, end) runs: one run unless the file has holes."""
        return list(self.held().runs)

    def _walk_held_ranges(self) -> list[tuple[int, int]]:
        runs: list[tuple[int, int]] = []
        for segment in self.segments:
            start, end = segment.base_offset, segment.base_offset + segment.commit_position
            if runs and runs[-1][1] == start:
                runs[-1] = (runs[-1][0], end)
            elif end > start or segment is self.segments[-1]:
                runs.append((start, end))
        return runs

    def holes(self) -> list[tuple[int, int]]:
        """The [start, end) byte ranges between segments that no segment holds."""
        return list(self.held().holes)

    def _follows_hole(self, index: int) -> bool:
        if index <= 0:
            return False
        previous, current = self.segments[index - 1], self.segments[index]
        return previous.base_offset + previous.commit_position < current.base_offset

    def _require_writable(self, action: str) -> None:
        if self.read_only:
            raise ReadOnlyError(f"{self.path}/{self.file_type.value} is open read-only: cannot {action}")

    def reset_initial_offset(self, offset: int) -> None:
        """Where the first segment will start; only while the file has no segment."""
        self._require_writable("move its start")
        if self.segments:
            raise ValidationError(f"{self.path}/{self.file_type.value} already starts at {self.min_offset}")
        if offset < 0:
            raise ValidationError(f"initial offset {offset} must not be negative")
        self._initial_offset = offset

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

    async def _seal(self, segment: FileSegment) -> None:
        segment.close()
        await asyncio.to_thread(
            self.metadata.update_segment,
            SegmentUpdate(
                self.path,
                self.file_type,
                segment.base_offset,
                size=segment.commit_position,
                status=SegmentStatus.SEALED,
                begin_timestamp=segment.min_timestamp,
                end_timestamp=segment.max_timestamp,
                sealed_timestamp=self.clock(),
            ),
            queue=self.queue,
            expected_epoch=self._held_epoch(),
        )
        self._recorded_sizes[segment.base_offset] = segment.commit_position

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

    async def _start_segment(self, base_offset: int, timestamp: int | None) -> None:
        await asyncio.to_thread(
            self.metadata.add_segment,
            self.path,
            self.file_type,
            base_offset,
            begin_timestamp=timestamp,
            queue=self.queue,
            expected_epoch=self._held_epoch(),
        )
        segment = self.provider.segment(self.file_type, self.path, base_offset, max_size=self.max_segment_size)
        self.segments.append(segment)
        self._recorded_sizes[base_offset] = 0

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
        return SegmentUpdate(
            self.path,
            self.file_type,
            last.base_offset,
            size=last.commit_position,
            begin_timestamp=last.min_timestamp,
            end_timestamp=last.max_timestamp,
        )

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

    # ---- expiry, truncation and recovery -------------------------------------------------------------

    async def destroy_expired(self, before_timestamp: int, *, limit_offset: int | None = None) -> int:
        """Remove head segments whose newest data is older than ``before_timestamp``; never the last.

        ``limit_offset`` protects bytes still referenced: a segment ending after it stays. Each
        removal marks the row DELETING, deletes the object, then marks the row DELETED, so a crash in
        between is finished by ``recover``. Returns how many segments were removed.
        """
        self._require_writable("remove segments")
        removed = 0
        while len(self.segments) > 1:
            head = self.segments[0]
            newest = head.max_timestamp
            if newest is None or newest >= before_timestamp:
                break
            if limit_offset is not None and head.base_offset + head.commit_position > limit_offset:
                break
            await self._destroy_segment(head, forget=False)
            self.segments.pop(0)
            removed += 1
        return removed

    async def _destroy_segment(self, segment: FileSegment, *, forget: bool) -> None:
        """Delete the object, then the metadata; ``forget`` drops the row instead of keeping it DELETED."""
        if not forget:
            await asyncio.to_thread(
                self.metadata.update_segment,
                SegmentUpdate(self.path, self.file_type, segment.base_offset, status=SegmentStatus.DELETING),
                queue=self.queue,
                expected_epoch=self._held_epoch(),
            )
        else:
            await self._check_lease()  # before the object goes
        await segment.destroy()
        if forget:
            await asyncio.to_thread(
                self.metadata.delete_segment,
                self.path,
                self.file_type,
                segment.base_offset,
                queue=self.queue,
                expected_epoch=self._held_epoch(),
            )
        else:
            await asyncio.to_thread(
                self.metadata.update_segment,
                SegmentUpdate(self.path, self.file_type, segment.base_offset, status=SegmentStatus.DELETED),
                queue=self.queue,
                expected_epoch=self._held_epoch(),
            )
        self._recorded_sizes.pop(segment.base_offset, None)

    async def destroy(self) -> None:
        """Delete every segment (objects first, then their rows)."""
        self._require_writable("delete segments")
        while self.segments:
            await self._destroy_segment(self.segments.pop(), forget=True)

    async def abandon_tail(self, offset: int) -> bool:
        """Stop counting the committed bytes at and after ``offset`` without deleting them; False if it cannot.

        The last segment is sealed at ``offset`` (metadata records that size) and the next one starts
        there, under its own name: the abandoned bytes stay in the sealed segment's storage, past its
        recorded size, where no read goes. Nothing in storage is deleted or rewritten, so a stalled
        archiver that still runs this after a successor took the queue over removes nothing the
        successor wrote (its seal is refused by the lease epoch). Buffered bytes are dropped.

        Only the last segment can be cut so, and only past its start (a segment starting at ``offset``
        would need a second segment of the same name): otherwise nothing changes and the caller truncates.
        """
        self._require_writable("abandon bytes")
        if not self.segments:
            return False
        last = self.segments[-1]
        keep = offset - last.base_offset
        if last.is_closed or not 0 < keep < last.commit_position:
            return False
        last.forget_after(keep)
        # Seal, then add (as ``roll`` does, without its commit: nothing may be written now). A crash in
        # between leaves the sealed segment last, and the next append starts the new one.
        await self._seal(last)
        await self._start_segment(offset, None)
        return True

    async def truncate(self, offset: int) -> None:
        """Remove every committed byte at or after ``offset`` (orphans after a crash).

        Segments that start at or after ``offset`` are deleted entirely (never the first one, which
        is emptied instead); the segment holding ``offset`` is cut there. A segment starting exactly at
        ``offset`` after a hole is emptied rather than deleted, so the hole stays recorded.
        """
        self._require_writable("truncate")
        if offset < self.min_offset:
            raise ValidationError(f"cannot truncate {self.path}/{self.file_type.value} below {self.min_offset}")
        while len(self.segments) > 1 and (
            self.segments[-1].base_offset > offset
            or (self.segments[-1].base_offset == offset and not self._follows_hole(len(self.segments) - 1))
        ):
            await self._destroy_segment(self.segments.pop(), forget=True)
        if not self.segments:
            return
        last = self.segments[-1]
        keep = offset - last.base_offset
        if last.commit_position > keep or last.pending_bytes:
            if last.commit_position > keep:
                await self._check_lease()  # before committed bytes go
            await last.truncate(keep)
            if last.is_closed:
                # A sealed segment that lost its tail is writable again: new handle, row back to NEW.
                reopened = self.provider.segment(
                    self.file_type, self.path, last.base_offset, commit_position=keep, max_size=self.max_segment_size
                )
                reopened.min_timestamp = last.min_timestamp
                reopened.max_timestamp = last.max_timestamp
                self.segments[-1] = reopened
                await asyncio.to_thread(
                    self.metadata.update_segment,
                    SegmentUpdate(self.path, self.file_type, last.base_offset, size=keep, status=SegmentStatus.NEW),
                    queue=self.queue,
                    expected_epoch=self._held_epoch(),
                )
                self._recorded_sizes[last.base_offset] = keep

    async def recover(self, records: Sequence[SegmentRecord] | None = None) -> bool:
        """Rebuild the segment list from metadata and correct unsealed sizes from the provider.

        ``records`` are this file's rows (NEW, SEALED or DELETING) when the caller loaded them in
        bulk. Removals interrupted by a crash are finished. Only NEW segments are sized from the
        provider: a SEALED size was recorded after its last commit and never grows. Returns whether
        any size was corrected.
        """
        self._require_writable("recover")
        if records is None:
            records = await asyncio.to_thread(
                self.metadata.list_segments, self.path, self.file_type, statuses=RECOVERABLE_STATUSES
            )
        self.segments = []
        self._recorded_sizes = {}
        corrected = False
        for record in sorted(records, key=lambda r: r.base_offset):
            segment = self.provider.segment(
                self.file_type,
                self.path,
                record.base_offset,
                commit_position=record.size,
                max_size=self.max_segment_size,
            )
            if record.status is SegmentStatus.DELETING:
                await self._destroy_segment(segment, forget=False)
                continue
            segment.min_timestamp = record.begin_timestamp
            segment.max_timestamp = record.end_timestamp
            if record.status is SegmentStatus.SEALED:
                segment.close()
            self.segments.append(segment)
            self._recorded_sizes[record.base_offset] = record.size
        for segment in self.segments:
            if segment.is_closed:
                continue
            real = await segment.correct_commit_position()
            corrected = corrected or real != self._recorded_sizes[segment.base_offset]
        self._held_memo = None
        return corrected

    def load(self, records: Sequence[SegmentRecord], *, limit_offset: int | None = None) -> None:
        """Become a read-only view of ``records`` as recorded: no provider call, no repair, no writes.

        NEW and SEALED rows become closed segments at their recorded sizes, trimmed at
        ``limit_offset`` (bytes past it are not counted as committed); other rows are ignored.
        """
        self.read_only = True
        self.segments = []
        self._recorded_sizes = {}
        for record in sorted(records, key=lambda r: r.base_offset):
            if record.status not in (SegmentStatus.NEW, SegmentStatus.SEALED):
                continue
            size = record.size
            if limit_offset is not None:
                if record.base_offset > limit_offset and self.segments:
                    break
                size = max(0, min(size, limit_offset - record.base_offset))
            segment = self.provider.segment(
                self.file_type, self.path, record.base_offset, commit_position=size, max_size=self.max_segment_size
            )
            segment.min_timestamp = record.begin_timestamp
            segment.max_timestamp = record.end_timestamp
            segment.close()
            self.segments.append(segment)
            self._recorded_sizes[record.base_offset] = size
