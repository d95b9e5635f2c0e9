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
from tieredstore.errors import NotFoundError
from tieredstore.flat.append_file import HeldRuns
from tieredstore.flat.cold_reader import ColdQueueReader, ColdReadOptions, CountRead, PrefetchPool
from tieredstore.flat.message_file import FlatMessageFile
from tieredstore.flat.served import ReadAheadBatch
from tieredstore.flat.store import FlatFileStore
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


class QueueStates:
    """Every queue's read state, and each queue's cold file: ``flat``'s recovered queue, or with
    ``read_only_cold`` a read-only view kept in the queue's state."""

    def __init__(self, flat: FlatFileStore, read_only_cold: bool) -> None:
        self.flat = flat
        self.read_only_cold = read_only_cold
        self._states: dict[tuple[str, int], QueueState] = {}

    def get(self, topic: str, queue_id: int) -> QueueState | None:
        return self._states.get((topic, queue_id))

    def of(self, topic: str, queue_id: int) -> QueueState:
        """The queue's read state, created on first use."""
        state = self._states.get((topic, queue_id))
        if state is None:
            state = self._states[(topic, queue_id)] = QueueState()
        return state

    def all(self) -> list[QueueState]:
        return list(self._states.values())

    def loaded_cold_file(self, topic: str, queue_id: int) -> FlatMessageFile | None:
        """The queue's cold file if it is loaded already (``cold_file`` without opening or recovering one)."""
        if self.read_only_cold:
            state = self._states.get((topic, queue_id))
            return None if state is None else state.view
        try:
            return self.flat.get(topic, queue_id)
        except NotFoundError:
            return None

    async def cold_file(self, topic: str, queue_id: int) -> FlatMessageFile | None:
        """The queue's loaded cold file; None if cold storage does not know the queue (see
        ``MessageFetcher.cold_file``)."""
        loaded = self.loaded_cold_file(topic, queue_id)
        if loaded is not None:
            return loaded
        if self.read_only_cold:
            try:
                view = await self.flat.open_read_only(topic, queue_id)
            except NotFoundError:
                return None  # not cached: the archiver may create the queue later
            self.of(topic, queue_id).view = view
            return view
        if (topic, queue_id) in self.flat.failed:
            return await self.flat.get_or_create(topic, queue_id)
        return None

    async def refresh_cold(self, topic: str, queue_id: int, *, if_changed: bool) -> bool:
        """Re-read a read-only view's rows; False if there is none (see ``MessageFetcher.refresh_cold``)."""
        state = self._states.get((topic, queue_id))
        if state is None or state.view is None:
            return False
        try:
            await state.view.refresh(if_changed=if_changed)
        except NotFoundError:
            state.view = None
            state.continuation = None  # nor keep the view alive through it
        return True
