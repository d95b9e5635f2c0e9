"""Tier routing: a queue's offsets over both tiers, which tier a read policy tries first, time lookups."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

from tieredstore.basics import BoundaryType
from tieredstore.config import ReadPolicy
from tieredstore.errors import NotFoundError
from tieredstore.flat.message_file import FlatMessageFile
from tieredstore.local.hot_reader import HotReader
from tieredstore.read.results import Boundary, QueueOffsets, Tier

# RocketMQ's accessMessageInMemoryMaxRatio: the share of physical memory the newest hot bytes are taken
# to occupy in the page cache.
IN_MEMORY_RATIO = 0.4


def physical_memory_bytes() -> int:
    """Total RAM as the OS reports it (0 when it cannot tell)."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 0


class TierRouter:
    """Which tier holds a queue's offset, and which one ``read_policy`` tries first.

    ``policy`` is asked on every decision, so a change of the reader's settings applies at once.
    """

    def __init__(
        self, hot: HotReader | None, policy: Callable[[], ReadPolicy], hot_in_memory_bytes: int | None
    ) -> None:
        self.hot = hot
        self.policy = policy
        self.hot_in_memory_bytes = (
            int(physical_memory_bytes() * IN_MEMORY_RATIO) if hot_in_memory_bytes is None else hot_in_memory_bytes
        )

    def hot_span(self, topic: str, queue_id: int) -> tuple[int, int] | None:
        """The hot store's [min, max) offsets of the queue; None when it holds none (or there is no hot store)."""
        hot = self.hot
        if hot is None:
            return None
        hot_max = hot.max_offset(topic, queue_id)
        return None if hot_max <= 0 else (hot.min_offset(topic, queue_id), hot_max)

    def offsets(self, topic: str, queue_id: int, cold: FlatMessageFile | None) -> QueueOffsets:
        """The queue's offsets in each tier and over the tiers this policy reads (``cold``: its cold file)."""
        hot_min = hot_max = cold_min = cold_max = 0
        cold_lost: tuple[tuple[int, int], ...] = ()
        known = False
        hot_span = self.hot_span(topic, queue_id)
        if hot_span is not None:
            known = True
            hot_min, hot_max = hot_span
        if cold is not None:
            known = True
            cold_min, cold_max = cold.min_offset, cold.archived_offset
            cold_lost = cold.consume_queue.queue_runs().lost
        ranges = [(start, end) for start, end in ((hot_min, hot_max), (cold_min, cold_max)) if start < end]
        if ranges:
            min_offset, max_offset = min(s for s, _ in ranges), max(e for _, e in ranges)
        else:
            # Nothing held: both ends sit where the queue will continue.
            min_offset = max_offset = max(hot_max, cold_max)
        return QueueOffsets(known, hot_min, hot_max, cold_min, cold_max, min_offset, max_offset, cold_lost)

    def tier_order(self, topic: str, queue_id: int, offset: int, view: QueueOffsets) -> list[Tier]:
        """The tiers to try for ``offset``, in order, among those that hold it."""
        hot_has, cold_has = view.hot_has(offset), view.cold_has(offset)
        if self.policy() is ReadPolicy.DISABLE:
            order: list[Tier] = ["hot"]
        elif self.cold_first(topic, queue_id, offset, view):
            order = ["cold", "hot"]
        else:
            order = ["hot", "cold"]
        return [tier for tier in order if (hot_has if tier == "hot" else cold_has)]

    def cold_first(self, topic: str, queue_id: int, offset: int, view: QueueOffsets) -> bool:
        """Whether the policy reads ``offset`` from cold storage before the hot store (were it in both)."""
        policy = self.policy()
        if policy is ReadPolicy.DISABLE:
            return False
        return (
            policy is ReadPolicy.FORCE
            or not view.hot_has(offset)
            or (policy is ReadPolicy.NOT_IN_MEM and not self._hot_in_memory(topic, queue_id, offset))
        )

    def _hot_in_memory(self, topic: str, queue_id: int, offset: int) -> bool:
        assert self.hot is not None
        try:
            unit = self.hot.cq_unit(topic, queue_id, offset)
        except NotFoundError:
            return False
        return self.hot.commitlog_max_offset - unit.commitlog_offset <= self.hot_in_memory_bytes

    async def offset_for_timestamp(
        self,
        topic: str,
        queue_id: int,
        timestamp: int,
        boundary: Boundary,
        view: QueueOffsets,
        cold: FlatMessageFile | None,
    ) -> int:
        """``lower``: the first offset stored at or after ``timestamp`` (max offset if none); ``upper``: the
        last offset stored at or before it (min offset if none); over the tiers ``view`` counts."""
        matches: list[int] = []
        if view.hot_min < view.hot_max:
            assert self.hot is not None
            hot = self.hot
            found = await asyncio.to_thread(hot.offset_for_timestamp, topic, queue_id, timestamp, boundary)
            if await asyncio.to_thread(_hot_matches, hot, topic, queue_id, found, timestamp, boundary):
                matches.append(found)
        if view.cold_min < view.cold_max:
            assert cold is not None
            found = await cold.find_queue_offset(timestamp, BoundaryType.of(boundary))
            if cold.min_offset <= found < cold.archived_offset:
                stamp = await cold.store_timestamp_of(await cold.consume_queue.read_unit(found))
                if (stamp >= timestamp) if boundary == "lower" else (stamp <= timestamp):
                    matches.append(found)
        if boundary == "lower":
            return min(matches) if matches else view.max_offset
        return max(matches) if matches else view.min_offset


def _hot_matches(hot: HotReader, topic: str, queue_id: int, offset: int, timestamp: int, boundary: Boundary) -> bool:
    """Whether the hot store's answer is a real match rather than its 'none' fallback."""
    if not hot.min_offset(topic, queue_id) <= offset < hot.max_offset(topic, queue_id):
        return False
    stamp = hot.store_timestamp(topic, queue_id, offset)
    return stamp >= timestamp if boundary == "lower" else stamp <= timestamp
