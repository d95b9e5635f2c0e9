"""AppendFileBase: what every part of a FlatAppendFile shares: its segments and positions, the runs of
bytes they hold, and the segment-row changes it makes (under the file's lease, when it has one)."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tieredstore.basics import QueueKey, now_ms
from tieredstore.errors import ReadOnlyError, ValidationError
from tieredstore.formats.naming import FileType
from tieredstore.metadata import LeaseHold, MetadataStore, SegmentStatus, SegmentUpdate
from tieredstore.providers.base import FileSegment, Provider, SegmentId

if TYPE_CHECKING:
    from tieredstore.flat.append_file import FlatAppendFile

Clock = Callable[[], int]
RECOVERABLE_STATUSES = (SegmentStatus.NEW, SegmentStatus.SEALED, SegmentStatus.DELETING)
DEFAULT_ROLLING_INTERVAL_MS = 24 * 3600 * 1000


@dataclass(frozen=True, slots=True)
class HeldRuns:
    """``FlatAppendFile.held``'s answer: committed byte runs and the holes between them, with what they came from."""

    key: tuple[object, ...] = field(repr=False)
    runs: tuple[tuple[int, int], ...]
    holes: tuple[tuple[int, int], ...]


class AppendFileBase:
    """An ordered list of FileSegments of one type under one logical path: see ``flat.append_file``."""

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
        clock: Clock = now_ms,
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

    # ---- segment rows --------------------------------------------------------------------------------

    def _size_update(self, segment: FileSegment) -> SegmentUpdate:
        """The segment's committed size and time range, as its metadata row records them."""
        return SegmentUpdate(
            self.path,
            self.file_type,
            segment.base_offset,
            size=segment.commit_position,
            begin_timestamp=segment.min_timestamp,
            end_timestamp=segment.max_timestamp,
        )

    async def _seal(self, segment: FileSegment) -> None:
        segment.close()
        await asyncio.to_thread(
            self.metadata.update_segment,
            dataclasses.replace(self._size_update(segment), status=SegmentStatus.SEALED, sealed_timestamp=self.clock()),
            queue=self.queue,
            expected_epoch=self._held_epoch(),
        )
        self._recorded_sizes[segment.base_offset] = segment.commit_position

    def _policy_key_id(self, base_offset: int) -> str | None:
        """The key that will wrap the segment at ``base_offset`` if its first byte is written now."""
        codecs = self.provider.codecs
        codec = codecs.for_segment(SegmentId(self.file_type, self.path, base_offset))
        return codecs.keyring.active if codec is not None and codec.encrypt else None

    async def _start_segment(self, base_offset: int, timestamp: int | None) -> None:
        # Recorded before any byte is written, so that no encrypted segment is ever without its key id.
        key_id = self._policy_key_id(base_offset)
        await asyncio.to_thread(
            self.metadata.add_segment,
            self.path,
            self.file_type,
            base_offset,
            begin_timestamp=timestamp,
            queue=self.queue,
            expected_epoch=self._held_epoch(),
            key_id=key_id,
        )
        segment = self.provider.segment(self.file_type, self.path, base_offset, max_size=self.max_segment_size)
        self.segments.append(segment)
        self._recorded_sizes[base_offset] = 0

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
