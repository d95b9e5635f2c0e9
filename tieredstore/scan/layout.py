"""Where a queue's archive lives, found from metadata or by listing, and a read-only view over it.

The Spark source must never change the archive it reads: ``FlatMessageFile.recover`` corrects sizes
and removes orphan bytes, which is the archiver's job. ``ArchiveView`` therefore loads the queue as a
read-only flat file at the sizes it was given (``tieredstore.flat.listed_view``) and only reads through it.

A consume queue may have holes: offsets the hot store lost before they were archived, recorded as a
gap between two consume-queue segments while the commit log carries on unbroken. The view takes the
held runs of offsets from the flat consume queue, loaded read-only, and every search and step moves
over held offsets only.
"""

from __future__ import annotations

import asyncio
import bisect
import struct
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from tieredstore.errors import CorruptRecordError, NotFoundError
from tieredstore.flat.listed_view import listed_message_file
from tieredstore.flat.listing import listed_segments
from tieredstore.formats.consume_queue import UNIT_SIZE, ConsumeQueueUnit
from tieredstore.formats.message import MIN_RECORD_SIZE, POS_QUEUE_OFFSET, store_timestamp_of
from tieredstore.formats.naming import INDEX_TOPIC, FileType, cluster_folder, queue_path
from tieredstore.metadata import MetadataStore, SegmentFileType, SegmentRecord
from tieredstore.providers.base import FileSegment, Provider

RECORD_HEAD_SIZE = MIN_RECORD_SIZE + 40  # every fixed header field up to STORETIMESTAMP, IPv6 hosts included


@dataclass(frozen=True, slots=True)
class SegmentSpan:
    """One segment: where it starts in its logical file, its committed size, its store-time range if known."""

    base_offset: int
    size: int
    begin_timestamp: int | None = None
    end_timestamp: int | None = None

    @property
    def end_offset(self) -> int:
        return self.base_offset + self.size

    def may_hold_time(self, start_ms: int | None, end_ms: int | None) -> bool:
        """Whether a record stored in [start_ms, end_ms) can be here; True when the times are unknown."""
        if self.begin_timestamp is None or self.end_timestamp is None:
            return True
        if start_ms is not None and self.end_timestamp < start_ms:
            return False
        return not (end_ms is not None and self.begin_timestamp >= end_ms)


@dataclass(frozen=True, slots=True)
class QueueLayout:
    """One queue's archived range and segments. ``max_offset`` is exclusive (the archived offset)."""

    topic: str
    queue_id: int
    path: str
    min_offset: int
    max_offset: int
    commit_log: tuple[SegmentSpan, ...]
    consume_queue: tuple[SegmentSpan, ...]

    @property
    def is_empty(self) -> bool:
        return self.max_offset <= self.min_offset or not self.commit_log or not self.consume_queue


class ArchiveView:
    """Reads one queue's consume queue and commit log at the sizes its layout names; never writes."""

    def __init__(self, provider: Provider, layout: QueueLayout) -> None:
        self.provider = provider
        self.layout = layout
        # The queue as the flat layer sees it, loaded read-only at the given sizes: its held runs (holes left
        # out) are the flat file's own, and a partition reads it through the one cold reader.
        self.flat_file = listed_message_file(
            provider,
            layout.topic,
            layout.queue_id,
            layout.path,
            (layout.min_offset, layout.max_offset),
            layout.commit_log,
            layout.consume_queue,
        )
        self.consume_queue = self.flat_file.consume_queue
        self._commit_log = self.flat_file.commit_log.segments
        self._consume_queue = self.consume_queue.segments
        self._commit_log_bases = [segment.base_offset for segment in self._commit_log]
        self._consume_queue_bases = [segment.base_offset for segment in self._consume_queue]
        self._units: dict[int, ConsumeQueueUnit] = {}
        self._reading: dict[int, asyncio.Future[list[ConsumeQueueUnit]]] = {}
        self.held_runs = list(self.consume_queue.queue_runs().held)
        self._run_starts = [start for start, _ in self.held_runs]

    def _find(self, bases: Sequence[int], segments: Sequence[FileSegment], offset: int, what: str) -> FileSegment:
        index = bisect.bisect_right(bases, offset) - 1
        if index < 0:
            raise NotFoundError(f"{self.layout.path}/{what}: offset {offset} is below the first segment")
        return segments[index]

    def commit_log_segment(self, offset: int) -> FileSegment:
        """The commit-log segment holding byte ``offset``."""
        return self._find(self._commit_log_bases, self._commit_log, offset, FileType.COMMIT_LOG.value)

    def object_name(self, segment: FileSegment) -> str:
        """The segment as a user finds it in storage: the provider URL and the segment key."""
        return f"{self.provider.url.rstrip('/')}/{segment.key}"

    async def units(self, queue_offset: int, count: int) -> list[ConsumeQueueUnit]:
        """``count`` units from ``queue_offset`` (within one consume-queue segment); CorruptRecordError if short."""
        position = queue_offset * UNIT_SIZE
        segment = self._find(self._consume_queue_bases, self._consume_queue, position, FileType.CONSUME_QUEUE.value)
        at, wanted = position - segment.base_offset, count * UNIT_SIZE
        raw = b""
        if at == 0:
            # An object store names a segment's first chunk by its start, so it is read without listing
            # the segment's chunks: the first unit of a scan is most often there.
            raw = await segment.read_from(0, wanted)
        if len(raw) < wanted:
            raw = await segment.read(at, wanted)
        if len(raw) < UNIT_SIZE:
            raise CorruptRecordError(
                f"no consume-queue unit for queue offset {queue_offset}",
                location=self.object_name(segment),
                offset=at,
            )
        found = [ConsumeQueueUnit.decode(raw, at) for at in range(0, len(raw) - len(raw) % UNIT_SIZE, UNIT_SIZE)]
        for index, unit in enumerate(found):
            self._units[queue_offset + index] = unit
        return found

    async def unit(self, queue_offset: int) -> ConsumeQueueUnit:
        cached = self._units.get(queue_offset)
        if cached is not None:
            return cached
        # Concurrent searches (the split points of one piece) begin at the same probes: one read serves them all.
        reading = self._reading.get(queue_offset)
        if reading is None:
            reading = self._reading[queue_offset] = asyncio.ensure_future(self.units(queue_offset, 1))
            reading.add_done_callback(lambda _: self._reading.pop(queue_offset, None))
        return (await asyncio.shield(reading))[0]

    async def record_head(self, offset: int) -> bytes:
        head = await self.flat_file.read_commit_log(offset, RECORD_HEAD_SIZE)
        if len(head) < MIN_RECORD_SIZE:
            segment = self.commit_log_segment(offset)
            raise CorruptRecordError(
                f"only {len(head)} committed bytes where a record should start",
                location=self.object_name(segment),
                offset=offset - segment.base_offset,
            )
        return head

    async def first_queue_offset(self, span: SegmentSpan) -> int:
        """QUEUEOFFSET of the first record of a commit-log segment."""
        # The segment's first chunk is named by its start: read without listing the segment's chunks.
        head = await self.commit_log_segment(span.base_offset).read_from(0, RECORD_HEAD_SIZE)
        if len(head) < MIN_RECORD_SIZE:
            head = await self.record_head(span.base_offset)
        (queue_offset,) = struct.unpack_from(">q", head, POS_QUEUE_OFFSET)
        return int(queue_offset)

    # ---- held offsets (the consume queue minus its holes) ----------------------------------------

    def next_held(self, queue_offset: int) -> int | None:
        """The first held queue offset at or after ``queue_offset``; None past the last one."""
        index = max(0, bisect.bisect_right(self._run_starts, queue_offset) - 1)
        for start, end in self.held_runs[index:]:
            if queue_offset < end:
                return max(start, queue_offset)
        return None

    def last_held_before(self, queue_offset: int) -> int | None:
        """The last held queue offset below ``queue_offset``; None if there is none."""
        index = bisect.bisect_left(self._run_starts, queue_offset) - 1
        if index < 0:
            return None
        return min(self.held_runs[index][1], queue_offset) - 1

    def _held_within(self, low: int, high: int) -> list[tuple[int, int]]:
        return [(max(s, low), min(e, high)) for s, e in self.held_runs if s < high and e > low]

    def held_count(self, low: int, high: int) -> int:
        return sum(end - start for start, end in self._held_within(low, high))

    async def _first_held_where(
        self,
        low: int,
        high: int,
        predicate: Callable[[int], Awaitable[bool]],
        probe: Callable[[int, int], int] | None = None,
    ) -> int:
        """The smallest held offset in [low, high) where a monotonic ``predicate`` holds; ``high`` if none.

        ``probe(first, last)`` picks the rank among the held offsets to test next, in [first, last);
        by default the middle one.
        """
        runs = self._held_within(low, high)
        lengths = [end - start for start, end in runs]

        def offset_at(rank: int) -> int:
            for (start, _), length in zip(runs, lengths, strict=True):
                if rank < length:
                    return start + rank
                rank -= length
            return high

        first, last = 0, sum(lengths)
        while first < last:
            middle = (first + last) // 2 if probe is None else probe(first, last)
            if await predicate(offset_at(middle)):
                last = middle
            else:
                first = middle + 1
        return offset_at(first)

    async def store_timestamp(self, queue_offset: int) -> int:
        return store_timestamp_of(await self.record_head((await self.unit(queue_offset)).commitlog_offset))

    async def first_stored_at_or_after(self, timestamp_ms: int, low: int, high: int) -> int:
        """The smallest held queue offset in [low, high) stored at or after ``timestamp_ms``; ``high`` if none.

        Binary search: assumes store times do not decrease along the queue, as the archiver writes them.
        """

        async def stored_late_enough(queue_offset: int) -> bool:
            return await self.store_timestamp(queue_offset) >= timestamp_ms

        return await self._first_held_where(low, high, stored_late_enough)

    async def last_starting_at_or_before(
        self, commitlog_offset: int, low: int, high: int, spanned: tuple[int, int] | None = None
    ) -> tuple[int, ConsumeQueueUnit]:
        """Of the held queue offsets in [low, high), the last whose record starts at or before ``commitlog_offset``.

        Returns that queue offset and its unit; the caller guarantees the record at ``low`` qualifies.
        ``spanned``, the commit-log bytes from the start of the record at ``low`` to the end of the last
        one, lets the search guess by position (records are of like size) instead of halving the range:
        the same answer from fewer unit reads, and never more than about twice as many.
        """
        searched = _PositionSearch(commitlog_offset, self.held_count(low, high), spanned) if spanned else None

        async def starts_after(queue_offset: int) -> bool:
            start = (await self.unit(queue_offset)).commitlog_offset
            if searched is not None:
                searched.learn(start)
            return start > commitlog_offset

        past = await self._first_held_where(low, high, starts_after, None if searched is None else searched.probe)
        found = self.last_held_before(past)
        if found is None or found < low:
            raise NotFoundError(f"{self.layout.path}: no record at or before commit-log offset {commitlog_offset}")
        return found, await self.unit(found)


class _PositionSearch:
    """Probes for the first record starting after ``target``: interpolated between the closest known
    record starts, every other probe the middle of the range if the previous guess did not halve it."""

    def __init__(self, target: int, count: int, spanned: tuple[int, int]) -> None:
        self.target = target
        self.below = (0, spanned[0])  # a rank whose record starts at or before the target, and that start
        self.above = (count, spanned[1])  # one past the last record, "starting" where the last one ends
        self._probed = 0
        self._width: int | None = None
        self._guessed = False

    def probe(self, first: int, last: int) -> int:
        width = last - first
        halve = self._guessed and self._width is not None and 2 * width > self._width
        self._width, self._guessed = width, not halve
        if halve:
            self._probed = (first + last) // 2
        else:
            (low_rank, low_start), (high_rank, high_start) = self.below, self.above
            guess = low_rank + 1 + (self.target - low_start) * (high_rank - low_rank) // max(1, high_start - low_start)
            self._probed = min(max(guess, first), last - 1)
        return self._probed

    def learn(self, start: int) -> None:
        if start > self.target:
            self.above = (self._probed, start)
        else:
            self.below = (self._probed, start)


# ---- discovery ------------------------------------------------------------------------------------


def _spans(records: Sequence[SegmentRecord]) -> tuple[SegmentSpan, ...]:
    ordered = sorted(records, key=lambda record: record.base_offset)
    return tuple(SegmentSpan(r.base_offset, r.size, r.begin_timestamp, r.end_timestamp) for r in ordered)


def _bounded_layout(
    topic: str,
    queue_id: int,
    path: str,
    min_offset: int,
    max_offset: int,
    commit_log: tuple[SegmentSpan, ...],
    consume_queue: tuple[SegmentSpan, ...],
) -> QueueLayout:
    """Clamp the offsets to what the consume-queue segments can hold (retention may lag one another)."""
    if consume_queue:
        min_offset = max(min_offset, consume_queue[0].base_offset // UNIT_SIZE)
        max_offset = min(max_offset, consume_queue[-1].end_offset // UNIT_SIZE)
    return QueueLayout(topic, queue_id, path, min_offset, max(min_offset, max_offset), commit_log, consume_queue)


def layouts_from_metadata(
    metadata: MetadataStore,
    topics: Sequence[str],
    *,
    cluster: str,
    broker: str,
    queue_allowed: Callable[[int], bool],
) -> list[QueueLayout]:
    """Every queue of ``topics`` the metadata store knows: two queries per topic plus one for all segments.

    A topic the store does not know is a NotFoundError (most often a typo in ``load()``).
    """
    positions = []
    for topic in topics:
        metadata.get_topic(topic)
        positions += [p for p in metadata.list_queues(topic) if queue_allowed(p.queue_id)]
    # Positions are read before segments: a commit in between only makes segments longer than needed.
    grouped = metadata.list_all_segments(
        file_types=[SegmentFileType.COMMIT_LOG.value, SegmentFileType.CONSUME_QUEUE.value]
    )
    layouts = []
    for position in positions:
        path = queue_path(cluster, broker, position.topic, position.queue_id)
        layouts.append(
            _bounded_layout(
                position.topic,
                position.queue_id,
                path,
                position.min_offset,
                position.max_offset,
                _spans(grouped.get((path, SegmentFileType.COMMIT_LOG), [])),
                _spans(grouped.get((path, SegmentFileType.CONSUME_QUEUE), [])),
            )
        )
    return layouts


async def _listed_spans(provider: Provider, path: str, file_type: FileType) -> tuple[SegmentSpan, ...]:
    """Each segment in storage with its size (see ``tieredstore.flat.listing``); no time range is known."""
    return tuple(SegmentSpan(s.base_offset, s.size) for s in await listed_segments(provider, path, file_type))


async def _listed_layout(provider: Provider, topic: str, queue_id: int, path: str) -> QueueLayout:
    # The consume queue is listed first: the archiver commits the commit log before it, so every unit
    # listed here points at commit-log bytes that the later listing sees.
    consume_queue = await _listed_spans(provider, path, FileType.CONSUME_QUEUE)
    commit_log = await _listed_spans(provider, path, FileType.COMMIT_LOG)
    if not consume_queue:
        return QueueLayout(topic, queue_id, path, 0, 0, commit_log, consume_queue)
    min_offset = consume_queue[0].base_offset // UNIT_SIZE
    max_offset = consume_queue[-1].end_offset // UNIT_SIZE
    return QueueLayout(topic, queue_id, path, min_offset, max(min_offset, max_offset), commit_log, consume_queue)


async def layouts_by_listing(
    provider: Provider,
    topics: Sequence[str],
    *,
    cluster: str,
    broker: str | None,
    queue_allowed: Callable[[int], bool],
    concurrency: int,
) -> list[QueueLayout]:
    """Every queue of ``topics`` found under the cold URL, under one broker or (``broker`` None) all of them.

    Costs a listing per folder level and a size lookup per segment. A topic with no folder under any
    broker is a NotFoundError: without metadata an empty topic and a misspelt one look the same.
    """
    cluster_path = cluster_folder(cluster)
    brokers = [broker] if broker is not None else await provider.list_children(cluster_path)
    found_topics: set[str] = set()
    queues: list[tuple[str, int, str]] = []
    for broker_name in brokers:
        broker_path = f"{cluster_path}/{broker_name}"
        present = set(await provider.list_children(broker_path)) - {INDEX_TOPIC}
        for topic in topics:
            if topic not in present:
                continue
            found_topics.add(topic)
            for child in await provider.list_children(f"{broker_path}/{topic}"):
                if child.isdigit() and queue_allowed(int(child)):
                    queues.append((topic, int(child), f"{broker_path}/{topic}/{child}"))
    missing = [topic for topic in topics if topic not in found_topics]
    if missing:
        where = f"{cluster_path}/{broker}" if broker is not None else f"{cluster_path}/<any broker>"
        raise NotFoundError(f"no archive folder for topic(s) {missing} under {where} in {provider.url}")
    limit = asyncio.Semaphore(concurrency)

    async def one(topic: str, queue_id: int, path: str) -> QueueLayout:
        async with limit:
            return await _listed_layout(provider, topic, queue_id, path)

    return list(await asyncio.gather(*(one(*queue) for queue in queues)))
