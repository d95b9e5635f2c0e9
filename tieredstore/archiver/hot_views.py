"""What the hot store says about the queues the archiver serves: one queue's view, every queue's snapshot."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import structlog

from tieredstore.archiver.views import HotView, QueueKey
from tieredstore.errors import NotFoundError, TieredStoreError
from tieredstore.local.hot_reader import HotReader
from tieredstore.topic_filter import TopicFilter

log = structlog.get_logger(__name__)

# A pass that archives "everything now" over a followed hot store waits this many of the writer's flush
# intervals (at most FLUSH_WAIT_MAX seconds, looking every FLUSH_WAIT_POLL) for its checkpoint to cover
# what is written: a writer late by more than that is not waited for (see HotViews.settled).
FLUSH_WAIT_INTERVALS = 3
FLUSH_WAIT_MAX = 10.0
FLUSH_WAIT_POLL = 0.05


def read_hot_view(hot: HotReader, topic: str, queue_id: int, next_offset: int | None) -> HotView:
    """The queue's view now; ``next_offset``, where its archive goes on, times the oldest pending message."""
    hot_min = hot.min_offset(topic, queue_id)
    # Read before the write position, so that it never exceeds it.
    archivable = hot.durable_max_offset(topic, queue_id) if hot.read_only else None
    hot_max = hot.max_offset(topic, queue_id)
    if archivable is None:
        archivable = hot_max
    oldest: int | None = None
    if next_offset is not None and archivable > next_offset:
        try:
            oldest = hot.store_timestamp(topic, queue_id, max(next_offset, hot_min))
        except NotFoundError:
            oldest = None
        except (TieredStoreError, OSError):
            # A record whose timestamp cannot be read now (a follower just after the writer restarted):
            # make the queue due, so that its batch read reports the error and backs the queue off, as
            # for any hot-side failure, instead of the scan ending the process.
            oldest = 0
    return HotView(hot_min, hot_max, oldest, archivable)


class HotViews:
    """Snapshots of every hot queue the archiver archives and serves (``serves``: holds its lease)."""

    def __init__(self, hot: HotReader, topics: TopicFilter, serves: Callable[[QueueKey], bool]) -> None:
        self.hot = hot
        self.topics = topics
        self.serves = serves

    async def snapshot(self, next_offsets: dict[QueueKey, int]) -> dict[QueueKey, HotView]:
        """Every served queue's view; ``next_offsets``: where each opened queue's archive goes on."""
        return await asyncio.to_thread(self._read, next_offsets)

    def _read(self, next_offsets: dict[QueueKey, int]) -> dict[QueueKey, HotView]:
        views = {}
        for key in self.hot.queues():
            if not self.topics.archives(key[0]) or not self.serves(key):
                continue
            views[key] = read_hot_view(self.hot, *key, next_offsets.get(key))
        return views

    async def settled(self, next_offsets: Callable[[], dict[QueueKey, int]]) -> dict[QueueKey, HotView]:
        """The hot views for a pass that archives "everything now".

        A hot store this process writes can be archived up to its write position (the batch reads flush
        it). A followed one is flushed by its writer every ``flush_interval``: its checkpoint is waited
        for, a few flush intervals at most, and what that still does not cover is left to a later pass.
        """
        snapshot = await self.snapshot(next_offsets())
        written = {key: view.max_offset for key, view in snapshot.items()}
        waited = min(FLUSH_WAIT_INTERVALS * self.hot.config.flush_interval, FLUSH_WAIT_MAX)
        deadline = time.monotonic() + waited
        while time.monotonic() < deadline and any(
            view.archivable_offset < written.get(key, 0) for key, view in snapshot.items()
        ):
            await asyncio.sleep(FLUSH_WAIT_POLL)
            snapshot = await self.snapshot(next_offsets())
        unflushed = sum(max(0, written.get(key, 0) - view.archivable_offset) for key, view in snapshot.items())
        if unflushed:
            log.warning(
                "the hot store's writer has not flushed everything written yet; a later pass archives it",
                unflushed_messages=unflushed,
                waited_seconds=waited,
            )
        return snapshot
