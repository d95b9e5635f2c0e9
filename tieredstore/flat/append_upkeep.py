"""AppendUpkeep: a FlatAppendFile's expiry, truncation, recovery from metadata and read-only loading."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from tieredstore.errors import ValidationError
from tieredstore.flat.append_base import RECOVERABLE_STATUSES, AppendFileBase
from tieredstore.metadata import SegmentRecord, SegmentStatus, SegmentUpdate
from tieredstore.providers.base import FileSegment


class AppendUpkeep(AppendFileBase):
    """Removing, cutting and rebuilding a FlatAppendFile's segments (see ``flat.append_file``)."""

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
        key_ids = {record.base_offset: record.key_id for record in records}
        for segment in self.segments:
            if segment.is_closed:
                continue
            real = await segment.correct_commit_position()
            corrected = corrected or real != self._recorded_sizes[segment.base_offset]
            if real == 0:
                await self._correct_key_id(segment, key_ids[segment.base_offset])
        self._held_memo = None
        return corrected

    async def _correct_key_id(self, segment: FileSegment, recorded: str | None) -> None:
        """Record the key a segment holding no byte yet will be wrapped by: one started before a restart
        with another active key is written under its stored ``.codec`` if one exists, else under today's
        key. A stale row would let ``keys list`` call a key unused that data needs; where storage cannot
        tell (a ``.codec`` without a key), today's key is named, which errs towards keeping a key."""
        key_id = await segment.stored_key_id() or self._policy_key_id(segment.base_offset)
        if key_id == recorded:
            return
        await asyncio.to_thread(
            self.metadata.update_segment,
            SegmentUpdate(self.path, self.file_type, segment.base_offset, key_id=key_id),
            queue=self.queue,
            expected_epoch=self._held_epoch(),
        )

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
