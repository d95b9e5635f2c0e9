"""One queue read from both tiers the way a consumer sees it: the hot store read-only while it holds an
offset, the archived files as recorded otherwise, stepping over offsets recorded as lost.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Literal

from tieredstore.basics import BoundaryType
from tieredstore.errors import NotFoundError, SegmentNotFoundError
from tieredstore.flat.cold_reader import ColdQueueReader
from tieredstore.flat.message_file import FlatMessageFile
from tieredstore.formats.message import MessageRecord
from tieredstore.read.archived import (
    archived_queue,
    archived_range,
    cold_reader,
    lost_range_at,
    read_archived,
    segment_rows,
)
from tieredstore.read.node import ReadNode
from tieredstore.read.records import Tier, decode_message

TierChoice = Literal["auto", "hot", "cold"]


@dataclass(frozen=True, slots=True)
class ReadMessage:
    """One message as read: which tier served it, its record bytes and the decoded record.

    ``lost_before`` is the [start, end) of offsets recorded as lost that the read stepped over to
    reach this message (None when it follows on).
    """

    tier: Tier
    raw: bytes
    record: MessageRecord
    lost_before: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class ReadBatch:
    """Messages read in offset order and the offset to read from next (past any hole stepped over)."""

    messages: list[ReadMessage]
    next_offset: int

    def __len__(self) -> int:
        return len(self.messages)


class QueueReader:
    """Reads one queue from the hot store (read-only) and its archived files (as recorded).

    One cold reader serves every read of the queue, so a read going on from where the last one ended
    follows the cold commit log instead of reading consume-queue units again; given to ``open``, the cold
    reader of an earlier reader of the queue (a poll of ``tail`` before this one) goes on here.
    """

    def __init__(self, node: ReadNode, topic: str, queue_id: int, cold: FlatMessageFile | None) -> None:
        self.node = node
        self.topic = topic
        self.queue_id = queue_id
        self.cold = cold
        hot = node.hot
        self.hot_range = (hot.min_offset(topic, queue_id), hot.max_offset(topic, queue_id)) if hot else (0, 0)
        self.cold_range = archived_range(cold) if cold is not None else (0, 0)
        self.cold_reader: ColdQueueReader | None = None

    @classmethod
    async def open(
        cls,
        node: ReadNode,
        topic: str,
        queue_id: int,
        tier: TierChoice = "auto",
        *,
        cold_reader: ColdQueueReader | None = None,
    ) -> QueueReader:
        cold: FlatMessageFile | None = None
        positions = await asyncio.to_thread(node.metadata.list_queues, topic)
        position = next((p for p in positions if p.queue_id == queue_id), None)
        if position is not None:
            rows = await asyncio.to_thread(segment_rows, node.metadata, node.flat.queue_path(topic, queue_id))
            cold = archived_queue(node.flat, position, rows)
        reader = cls(node, topic, queue_id, cold)
        if cold_reader is not None and cold is not None:
            cold_reader.flat_file = cold  # this view of the queue's files is newer than the one it read
            reader.cold_reader = cold_reader
        if tier == "cold" and cold is None:
            raise NotFoundError(f"queue {topic}/{queue_id} has nothing archived (it is not in the metadata store)")
        if cold is None and reader.hot_range[1] == 0:
            raise NotFoundError(f"queue {topic}/{queue_id} is in neither the hot store nor the metadata store")
        return reader

    def ranges(self, tier: TierChoice) -> list[tuple[int, int]]:
        chosen = {"hot": [self.hot_range], "cold": [self.cold_range], "auto": [self.hot_range, self.cold_range]}[tier]
        return [(low, high) for low, high in chosen if low < high]

    def bounds(self, tier: TierChoice) -> tuple[int, int]:
        """[min, max) over the chosen tiers; both at the queue's end when they hold nothing."""
        held = self.ranges(tier)
        if not held:
            end = max(self.hot_range[1], self.cold_range[1])
            return end, end
        return min(low for low, _ in held), max(high for _, high in held)

    async def read(self, offset: int, count: int, tier: TierChoice) -> ReadBatch:
        """Up to ``count`` messages from ``offset``, stepping over offsets recorded as lost.

        NotFoundError below the chosen tiers' min offset.
        """
        low, _ = self.bounds(tier)
        if offset < low:
            raise NotFoundError(
                f"offset {offset} of {self.topic}/{self.queue_id} is below the min offset {low} ({tier})"
            )
        out: list[ReadMessage] = []
        lost: tuple[int, int] | None = None
        while len(out) < count:
            want = count - len(out)
            hot_low, hot_high = self.hot_range
            cold_low, cold_high = self.cold_range
            if tier != "cold" and hot_low <= offset < hot_high and self.node.hot is not None:
                raws = await asyncio.to_thread(self._read_hot, offset, min(want, hot_high - offset))
                source: Tier = "hot"
            elif tier != "hot" and self.cold is not None and cold_low <= offset < cold_high:
                hole = lost_range_at(self.cold, offset)
                if hole is not None:
                    # Never archived: go on at the first offset after the hole that some chosen tier holds.
                    resume = hole[1]
                    if tier == "auto" and offset < hot_low < resume:
                        resume = hot_low
                    lost = (lost[0] if lost is not None else offset, resume)
                    offset = resume
                    continue
                raws = await self._read_cold(offset, min(want, cold_high - offset), tier)
                source = "cold"
            else:
                break
            if not raws:
                break
            for raw in raws:
                where = f"{source} {self.topic}/{self.queue_id} at queue offset {offset}"
                out.append(ReadMessage(source, raw, decode_message(raw, where=where), lost))
                lost = None
                offset += 1
        return ReadBatch(out, offset if lost is None else lost[0])

    async def _read_cold(self, offset: int, count: int, tier: TierChoice) -> list[bytes]:
        """``read_archived``; where the archiver's retention removed a segment since the view was loaded, the
        view is loaded again, and an offset below its new min offset is NotFoundError naming that."""
        assert self.cold is not None
        if self.cold_reader is None:
            self.cold_reader = cold_reader(self.cold, count)
        try:
            return await read_archived(self.cold, offset, count, reader=self.cold_reader)
        except SegmentNotFoundError:
            await self.cold.refresh()
            self.cold_range = archived_range(self.cold)
            low, _ = self.bounds(tier)
            if offset < low:
                raise NotFoundError(
                    f"offset {offset} of {self.topic}/{self.queue_id} is below the min offset {low} ({tier}): "
                    "retention removed it"
                ) from None
            raise

    def _read_hot(self, offset: int, count: int) -> list[bytes]:
        assert self.node.hot is not None
        stored = self.node.hot.read_messages(self.topic, self.queue_id, offset, max_count=count, max_bytes=64 << 20)
        return [m.raw for m in stored]

    async def offset_for_time(self, timestamp: int, boundary: BoundaryType, tier: TierChoice) -> int:
        """LOWER: first offset stored at or after ``timestamp``; UPPER: last one at or before it."""
        candidates: list[int] = []
        hot = self.node.hot
        if tier != "cold" and hot is not None and self.hot_range[0] < self.hot_range[1]:
            low, high = self.hot_range
            found = await asyncio.to_thread(
                hot.offset_for_timestamp, self.topic, self.queue_id, timestamp, boundary.boundary
            )
            stamp = await asyncio.to_thread(hot.store_timestamp, self.topic, self.queue_id, min(found, high - 1))
            if _qualifies(found, high, stamp, timestamp, boundary):
                candidates.append(found)
        if tier != "hot" and self.cold is not None and self.cold_range[0] < self.cold_range[1]:
            low, high = self.cold_range
            found = min(await self.cold.find_queue_offset(timestamp, boundary), high)
            stamp = await self.cold.store_timestamp_of(await self.cold.consume_queue.read_unit(min(found, high - 1)))
            if _qualifies(found, high, stamp, timestamp, boundary):
                candidates.append(found)
        low, high = self.bounds(tier)
        if boundary is BoundaryType.LOWER:
            return min(candidates) if candidates else high
        return max(candidates) if candidates else low


def _qualifies(found: int, high: int, stamp: int, timestamp: int, boundary: BoundaryType) -> bool:
    if boundary is BoundaryType.LOWER:
        return found < high
    return found < high and stamp <= timestamp
