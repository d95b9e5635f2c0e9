"""Planning a scan on the driver: one partition per (queue, commit-log segment), split to a byte budget.

For each queue the pushed filters become one queue-offset range: offsets directly, store times by a
binary search over the consume queue (after segments whose time range cannot match are dropped);
every search steps over consume-queue holes. The range's first and last records turn it into
commit-log bytes: from the segment rows where they can say (the queue's last record ends its commit
log; its oldest one most likely starts it), else from two consume-queue units. Each commit-log segment
the bytes touch is one partition, split at record boundaries (found by a search over the consume
queue that guesses by commit-log position) until none holds more than ``max_partition_bytes`` —
unless a single record is larger.

A whole queue whose files' first segments begin at the same store time is planned from the segment
rows alone: no read but one record head per further commit-log segment. Otherwise a plan costs, per
queue, up to two unit reads (the first one without a listing of chunks when it starts a consume-queue
segment), ~2·log2(n) reads per time bound and a few per split point (never more than ~2·log2(n));
queues are planned ``planning_concurrency`` at a time.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tieredstore.formats.consume_queue import UNIT_SIZE
from tieredstore.metadata import MetadataStore
from tieredstore.providers.base import Provider
from tieredstore.scan.filters import ScanFilter
from tieredstore.scan.layout import (
    ArchiveView,
    QueueLayout,
    SegmentSpan,
    layouts_by_listing,
    layouts_from_metadata,
)
from tieredstore.scan.options import ScanOptions
from tieredstore.scan.session import open_scan_provider

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PartitionPlan:
    """One task's work: records [queue_start, queue_end) at commit-log bytes [commitlog_start, commitlog_end).

    ``layout`` is trimmed to the one commit-log segment and the consume-queue segments the range
    needs. Holds no credentials: it is pickled to executors and shown by Spark.
    """

    layout: QueueLayout
    queue_start: int
    queue_end: int
    commitlog_start: int
    commitlog_end: int
    scan_filter: ScanFilter

    @property
    def topic(self) -> str:
        return self.layout.topic

    @property
    def queue_id(self) -> int:
        return self.layout.queue_id

    @property
    def size(self) -> int:
        return self.commitlog_end - self.commitlog_start

    def __str__(self) -> str:
        return (
            f"{self.topic}/{self.queue_id} offsets [{self.queue_start}, {self.queue_end}) "
            f"commit log [{self.commitlog_start}, {self.commitlog_end})"
        )


@dataclass(frozen=True, slots=True)
class _Piece:
    queue_start: int
    queue_end: int
    commitlog_start: int
    commitlog_end: int

    @property
    def size(self) -> int:
        return self.commitlog_end - self.commitlog_start


def _needs_split(view: ArchiveView, piece: _Piece, budget: int) -> bool:
    return piece.size > budget and view.held_count(piece.queue_start, piece.queue_end) > 1


async def _split(view: ArchiveView, piece: _Piece, budget: int) -> list[_Piece]:
    """``piece`` cut at record starts into pieces of at most ``budget`` bytes (or one record each)."""
    if not _needs_split(view, piece, budget):
        return [piece]
    count = -(-piece.size // budget)
    targets = [piece.commitlog_start + piece.size * k // count for k in range(1, count)]
    found = await asyncio.gather(
        *(
            view.last_starting_at_or_before(
                target, piece.queue_start, piece.queue_end, (piece.commitlog_start, piece.commitlog_end)
            )
            for target in targets
        )
    )
    cuts: dict[int, int] = {}
    for queue_offset, unit in found:
        if queue_offset == piece.queue_start:
            # The first record alone passes the target: cut right after it instead (there are at least two).
            following = view.next_held(piece.queue_start + 1)
            queue_offset = piece.queue_end if following is None else following
            unit = await view.unit(queue_offset)
        cuts[queue_offset] = unit.commitlog_offset
    bounds = [(piece.queue_start, piece.commitlog_start), *sorted(cuts.items()), (piece.queue_end, piece.commitlog_end)]
    pieces = [
        _Piece(start_q, end_q, start_c, end_c)
        for (start_q, start_c), (end_q, end_c) in itertools.pairwise(bounds)
        if end_q > start_q
    ]
    nested = await asyncio.gather(*(_split(view, p, budget) for p in pieces))
    return [p for group in nested for p in group]


async def _commit_log_range(view: ArchiveView, low: int, last: int) -> tuple[int, int, bool]:
    """Commit-log bytes from the record at ``low`` to the end of the one at ``last``, and whether the start is
    a guess; read from their consume-queue units only where the segment rows cannot say.

    The queue's last record ends its commit log, or ends before it: the archiver commits the commit log
    first and records both sizes in one transaction (a listing lists the consume queue first). The
    oldest record starts the commit log when both files' first segments begin at the same store time
    (else retention has left older records in the commit log); the reader checks the record it finds
    there and reads the consume queue if it is not the one, so a wrong guess costs a read, never a row.
    """
    layout = view.layout
    written = [span for span in layout.commit_log if span.size > 0]
    first_unit = next((span for span in layout.consume_queue if span.base_offset == low * UNIT_SIZE), None)
    at_end = view.next_held(last + 1) is None
    guessed = (
        first_unit is not None
        and bool(written)
        and low == view.next_held(layout.min_offset)
        and first_unit.begin_timestamp is not None
        and first_unit.begin_timestamp == written[0].begin_timestamp
    )

    async def start() -> int:
        return written[0].base_offset if guessed else (await view.unit(low)).commitlog_offset

    async def end() -> int:
        if at_end and written:
            return written[-1].end_offset
        unit = await view.unit(last)
        return unit.commitlog_offset + unit.size

    byte_low, byte_high = await asyncio.gather(start(), end())
    return byte_low, byte_high, guessed


def _trimmed(layout: QueueLayout, span: SegmentSpan, queue_start: int, queue_end: int) -> QueueLayout:
    first, last = queue_start * UNIT_SIZE, queue_end * UNIT_SIZE
    consume_queue = tuple(s for s in layout.consume_queue if s.base_offset < last and s.end_offset > first)
    return QueueLayout(layout.topic, layout.queue_id, layout.path, queue_start, queue_end, (span,), consume_queue)


async def plan_queue(
    provider: Provider, layout: QueueLayout, scan_filter: ScanFilter, max_partition_bytes: int
) -> list[PartitionPlan]:
    """The partitions of one queue under ``scan_filter``."""
    low = max(layout.min_offset, scan_filter.queue_offset_start)
    high = (
        layout.max_offset
        if scan_filter.queue_offset_end is None
        else min(layout.max_offset, scan_filter.queue_offset_end)
    )
    if layout.is_empty or low >= high:
        return []
    start_ms, end_ms = scan_filter.time_start_ms, scan_filter.time_end_ms
    spans = layout.commit_log
    if scan_filter.has_time_range and not any(s.may_hold_time(start_ms, end_ms) for s in spans):
        return []
    view = ArchiveView(provider, layout)
    held_low = view.next_held(low)
    low = high if held_low is None else held_low
    if start_ms is not None:
        low = await view.first_stored_at_or_after(start_ms, low, high)
    if end_ms is not None:
        high = await view.first_stored_at_or_after(end_ms, low, high)
    last_offset = view.last_held_before(high)
    if low >= high or last_offset is None or last_offset < low:
        return []
    byte_low, byte_high, guessed = await _commit_log_range(view, low, last_offset)
    touched = [s for s in spans if s.size > 0 and s.base_offset < byte_high and s.end_offset > byte_low]

    async def start_of(span: SegmentSpan) -> int:
        return low if span.base_offset <= byte_low else await view.first_queue_offset(span)

    starts = await asyncio.gather(*(start_of(span) for span in touched))
    pieces: list[tuple[SegmentSpan, _Piece]] = []
    for index, span in enumerate(touched):
        if not span.may_hold_time(start_ms, end_ms):
            continue
        # Clamped, and an empty piece dropped: with a guessed start a segment of older records can be touched.
        queue_start = max(starts[index], low)
        queue_end = min(starts[index + 1], high) if index + 1 < len(touched) else high
        if queue_end <= queue_start:
            continue
        piece = _Piece(queue_start, queue_end, max(span.base_offset, byte_low), min(span.end_offset, byte_high))
        if guessed and queue_start == low and _needs_split(view, piece, max_partition_bytes):
            # A split searches from where the first record really starts; only then is it worth a read.
            exact = (await view.unit(low)).commitlog_offset
            piece = _Piece(queue_start, queue_end, max(span.base_offset, exact), piece.commitlog_end)
        pieces.append((span, piece))
    split = await asyncio.gather(*(_split(view, piece, max_partition_bytes) for _, piece in pieces))
    plans = []
    for (span, _), parts in zip(pieces, split, strict=True):
        for part in parts:
            plans.append(
                PartitionPlan(
                    _trimmed(layout, span, part.queue_start, part.queue_end),
                    part.queue_start,
                    part.queue_end,
                    part.commitlog_start,
                    part.commitlog_end,
                    scan_filter,
                )
            )
    return plans


async def queue_layouts(provider: Provider, options: ScanOptions, scan_filter: ScanFilter) -> list[QueueLayout]:
    """The layout of every queue of ``options.topics`` that ``scan_filter`` allows (from metadata or a listing)."""
    topics = [topic for topic in options.topics if scan_filter.allows_topic(topic)]
    if not topics:
        return []
    if options.metadata_url is None:
        return await layouts_by_listing(
            provider,
            topics,
            cluster=options.cluster,
            broker=options.broker,
            queue_allowed=scan_filter.allows_queue,
            concurrency=options.planning_concurrency,
        )
    broker = options.broker
    assert broker is not None, "ScanOptions.parse gives metadata mode a broker"
    metadata = await asyncio.to_thread(MetadataStore, options.metadata_url)
    try:
        return await asyncio.to_thread(
            layouts_from_metadata,
            metadata,
            topics,
            cluster=options.cluster,
            broker=broker,
            queue_allowed=scan_filter.allows_queue,
        )
    finally:
        metadata.close()


async def plan_queues(
    provider: Provider,
    options: ScanOptions,
    layouts: Sequence[QueueLayout],
    filter_of: Callable[[QueueLayout], ScanFilter],
) -> list[PartitionPlan]:
    """The partitions of ``layouts``, each queue under its own filter, ``planning_concurrency`` queues at a time;
    ordered by topic, queue and offset."""
    limit = asyncio.Semaphore(options.planning_concurrency)

    async def one(layout: QueueLayout) -> list[PartitionPlan]:
        async with limit:
            return await plan_queue(provider, layout, filter_of(layout), options.max_partition_bytes)

    planned = await asyncio.gather(*(one(layout) for layout in layouts))
    return sorted(
        (plan for group in planned for plan in group), key=lambda p: (p.topic, p.queue_id, p.layout.path, p.queue_start)
    )


async def plan_scan(options: ScanOptions, scan_filter: ScanFilter | None = None) -> list[PartitionPlan]:
    """Every partition of a scan, ordered by topic, queue and offset. Runs on the driver."""
    scan_filter = scan_filter or ScanFilter()
    started = time.perf_counter()
    async with open_scan_provider(options) as provider:
        layouts = await queue_layouts(provider, options, scan_filter)
        plans = await plan_queues(provider, options, layouts, lambda _: scan_filter)
    log.info(
        "planned %d partitions over %d queues (%d bytes) for %s in %.2fs",
        len(plans),
        len(layouts),
        sum(plan.size for plan in plans),
        options,
        time.perf_counter() - started,
    )
    return plans


def plan_partitions(options: ScanOptions, scan_filter: ScanFilter | None = None) -> list[PartitionPlan]:
    """``plan_scan`` in an event loop of its own (the Spark planning worker has none)."""
    return asyncio.run(plan_scan(options, scan_filter))
