"""Hot-page release: the archiver unmaps the hot commit log below where every queue reads next."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection
from dataclasses import dataclass

import structlog

from tieredstore.errors import TieredStoreError
from tieredstore.local.batch import SharedWindow
from tieredstore.local.hot_reader import HotReader

log = structlog.get_logger(__name__)

# Hot pages every queue has read are released after this much more was read, or this many seconds.
PAGE_RELEASE_BYTES = 8 << 20
PAGE_RELEASE_INTERVAL = 1.0
# How far behind the furthest batch read the hot commit log stays mapped for the other queues' batches:
# queues written together have their records interleaved, so one mapping serves them all instead of
# each faulting the same pages in again; bounded so that a queue far behind cannot keep the log in RSS,
# and to what the archiver's 256 MiB RSS target (issue 5) leaves beside its batch buffers.
HOT_WINDOW_BYTES = 12 << 20


@dataclass(frozen=True, slots=True)
class NextRead:
    """Where one queue reads next: its next queue offset, and where its last batch read ended in the hot
    commit log (None when not read since it was opened)."""

    topic: str
    queue_id: int
    offset: int
    position: int | None


class HotPages:
    """The hot commit log's pages the archiver's batch reads share (``window``): released below the next
    unread record of every queue, or below the window, now and then."""

    def __init__(self, hot: HotReader) -> None:
        self.hot = hot
        # Every batch read goes through it; it knows the furthest any reached in the hot commit log.
        self.window = SharedWindow(HOT_WINDOW_BYTES)
        self._released_at = 0.0
        self._read_end_at_release = 0

    @property
    def read_end(self) -> int:
        """The furthest any batch read reached in the hot commit log."""
        return self.window.furthest

    def read_to(self, position: int) -> None:
        """A batch read ended at ``position`` in the hot commit log."""
        self.window.reached(position)

    def due(self, *, force: bool = False) -> bool:
        """Whether enough was read, or enough time passed, since the last release (always when forced)."""
        return (
            force
            or self.read_end - self._read_end_at_release >= PAGE_RELEASE_BYTES
            or time.monotonic() - self._released_at >= PAGE_RELEASE_INTERVAL
        )

    async def release(self, unread: Collection[NextRead]) -> None:
        """Unmap the hot commit log below every queue's next unread record (``unread``: the queues with
        backlog), or below the window if that is higher.

        Batch reads leave the pages they copy from mapped within the window, for the other queues, and
        unmap what falls out of it as they go; this releases the window's pages once no queue needs
        them, and what else mapped hot pages: the store timestamps read for the group-commit timeout, a
        follower's checks of new records. Without it they would stay in the archiver's RSS until
        retention deletes the file. Only advisory: a page released too early is mapped again when read.
        """
        self._released_at, self._read_end_at_release = time.monotonic(), self.read_end
        await asyncio.to_thread(self._release_below, list(unread), self.read_end)

    def _release_below(self, unread: list[NextRead], read_end: int) -> None:
        bound = read_end
        floor = read_end - self.window.span  # what a queue below it reads, it maps and unmaps on its own
        for queue in unread:
            position = queue.position
            if position is None:  # not read since it was opened: where its next record is
                try:
                    position = self.hot.cq_unit(queue.topic, queue.queue_id, queue.offset).commitlog_offset
                except (TieredStoreError, OSError):
                    continue  # not in the hot store (a lost range): it reads nothing below the bound
            bound = min(bound, max(position, floor))
        released = self.hot.release_pages(bound)
        if released:
            log.debug("hot pages released", below=bound, bytes=released)
