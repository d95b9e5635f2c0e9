"""What the fetcher keeps about one queue between calls: one object per queue.

A ``QueueState`` holds the queue's read-only cold view (for a cold-only reader), its cold reader (where
the next record lies in the cold commit log, where the last window ended, the windows read ahead) and
where its last call ended inside a cached window (``Continuation``), so that the next call going on
from there is served from that window directly.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass

from tieredstore.config import ReadPolicy
from tieredstore.flat.append_file import HeldRuns
from tieredstore.flat.cold_reader import ColdQueueReader, ColdReadOptions, CountRead, PrefetchPool
from tieredstore.flat.message_file import FlatMessageFile
from tieredstore.flat.served import ReadAheadBatch
from tieredstore.read.cache import ReadAheadCache
from tieredstore.read.results import GetMessageResult, GetMessageStatus, QueueOffsets, window_messages


@dataclass(slots=True)
class Continuation:
    """Where a reader's last call ended inside a cached cold window, and what that answer rested on.

    The next call from ``next_offset`` is served from ``window`` directly (``QueueState.go_on``) while
    nothing it rested on changed: the window is still cached, the cold file and its segments are the same
    objects (``FlatAppendFile.held`` is one object until they change), the hot store's offsets for the
    queue are the same, and the policy would read these offsets from cold storage. A read-only view
    cannot see another process's changes without a metadata query, so there it also goes no longer than
    ``read_ahead_ttl`` after ``checked_at``, when the full path last looked for them.
    """

    next_offset: int
    # Not a strong reference: a window the cache evicted must not stay in memory for a reader that left.
    window: weakref.ref[ReadAheadBatch]
    view: QueueOffsets
    cold: FlatMessageFile
    held: HeldRuns
    checked_at: float


@dataclass(slots=True)
class QueueState:
    """One queue's read state: its read-only view, its cold reader and where its last call ended."""

    view: FlatMessageFile | None = None  # the read-only view of a cold-only reader, opened on first use
    cold: ColdQueueReader | None = None
    continuation: Continuation | None = None

    def cold_reader(
        self, flat_file: FlatMessageFile, options: ColdReadOptions, pool: PrefetchPool, count_read: CountRead
    ) -> ColdQueueReader:
        """The queue's cold reader, reading ``flat_file`` (the queue's current file) from now on."""
        if self.cold is None:
            self.cold = ColdQueueReader(flat_file, options, pool=pool, count_read=count_read)
        else:
            self.cold.flat_file = flat_file
        return self.cold

    def go_on(
        self,
        offset: int,
        max_count: int,
        *,
        policy: ReadPolicy,
        hot_span: Callable[[], tuple[int, int] | None],
        cold: Callable[[], FlatMessageFile | None],
        cache: ReadAheadCache,
        max_age: float | None = None,
    ) -> GetMessageResult | None:
        """The answer the full path would give a reader going on from where its last call ended inside a
        cached cold window, served from that window; None when any of what it rested on changed (see
        ``Continuation``), or the answer would not come from the window alone (it reaches past the
        window's end, or holds a corrupt record). ``hot_span`` and ``cold`` give the queue's hot offsets
        and cold file now; ``max_age``: how long a read-only view's answer may rest on what it saw.

        A consumer asks for a few messages many times per window; working out the queue's offsets, the
        tier and the cached run each time costs as much as serving the messages.
        """
        continuation = self.continuation
        if continuation is None or continuation.next_offset != offset:
            return None
        if max_age is not None and cache.clock() - continuation.checked_at >= max_age:
            return None  # time to look for the archiver's commits and retention (the full path does)
        window = continuation.window()
        end = offset + max_count
        if window is None or end > window.end_offset:
            return None
        view = continuation.view
        if policy is not ReadPolicy.FORCE and view.hot_min < end and offset < view.hot_max:
            return None  # the hot store holds some of these offsets: the policy may read them there
        if hot_span() != ((view.hot_min, view.hot_max) if view.hot_min < view.hot_max else None):
            return None
        loaded = cold()
        if loaded is not continuation.cold or loaded.consume_queue.held() is not continuation.held:
            return None
        if window.corrupt and any(offset <= bad < end for bad in window.corrupt):
            return None
        if not cache.renew(window, max_count):
            return None
        continuation.next_offset = end
        messages = window_messages(window, offset, end)
        if end == window.end_offset:
            cache.read_through(window)
        return GetMessageResult(GetMessageStatus.FOUND, end, view.min_offset, view.max_offset, messages)
