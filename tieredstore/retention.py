"""Retention of cold data: remove what is older than each topic's ``reserve_hours``, and expired index files.

For every queue of an ACTIVE topic, whole head segments whose newest message is older than
``now - reserve_hours`` go: consume-queue segments first, then the commit-log segments no remaining
unit points into. Each is deleted from the provider first and then marked DELETED (a crash in
between is finished by recovery); the queue's min offset moves up. The last segment of a file is
never removed, so a queue keeps its position. Index files hold keys of every topic, so one goes only
when its newest item is older than the longest retention of any topic.

``dry_run`` reports what would go, from the same rules, and changes nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import structlog

from tieredstore.flat.message_file import FlatMessageFile
from tieredstore.formats.consume_queue import UNIT_SIZE
from tieredstore.formats.naming import FileType
from tieredstore.metadata import TopicInfo, TopicStatus
from tieredstore.providers.base import FileSegment
from tieredstore.runtime import Runtime

log = structlog.get_logger(__name__)

HOUR_MS = 3_600_000


@dataclass(frozen=True, slots=True)
class ExpiredSegment:
    """One cold segment that retention removes (or would remove)."""

    file_type: FileType
    base_offset: int
    size: int
    end_timestamp: int


@dataclass(frozen=True, slots=True)
class QueueRetention:
    """What retention does to one queue: its segments and how its min offset moves."""

    topic: str
    queue_id: int
    min_offset_before: int
    min_offset_after: int
    segments: list[ExpiredSegment]


@dataclass(slots=True)
class RetentionReport:
    """The outcome of one retention pass; with ``dry_run`` nothing was changed."""

    dry_run: bool
    now_ms: int
    queues: list[QueueRetention] = field(default_factory=list)
    index_files: list[int] = field(default_factory=list)

    @property
    def segment_count(self) -> int:
        return sum(len(queue.segments) for queue in self.queues)

    @property
    def bytes_removed(self) -> int:
        return sum(segment.size for queue in self.queues for segment in queue.segments)


def _expired(segment: FileSegment, file_type: FileType) -> ExpiredSegment:
    return ExpiredSegment(file_type, segment.base_offset, segment.commit_position, segment.max_timestamp or 0)


def _expired_head(
    segments: list[FileSegment], before_timestamp: int, *, limit_offset: int | None = None
) -> list[FileSegment]:
    """The head segments ``FlatAppendFile.destroy_expired`` removes, computed without removing them."""
    chosen: list[FileSegment] = []
    for segment in segments[:-1]:
        newest = segment.max_timestamp
        if newest is None or newest >= before_timestamp:
            break
        if limit_offset is not None and segment.base_offset + segment.commit_position > limit_offset:
            break
        chosen.append(segment)
    return chosen


async def plan_queue(flat_file: FlatMessageFile, before_timestamp: int) -> QueueRetention:
    """What ``flat_file.destroy_expired(before_timestamp)`` would remove, and the min offset it would leave."""
    queue_segments = flat_file.consume_queue.segments
    expired_units = _expired_head(queue_segments, before_timestamp)
    min_after = flat_file.min_offset
    if expired_units:
        min_after = queue_segments[len(expired_units)].base_offset // UNIT_SIZE
    limit: int | None = None
    if flat_file.archived_offset > min_after:
        limit = (await flat_file.consume_queue.read_unit(min_after)).commitlog_offset
    expired_records = _expired_head(flat_file.commit_log.segments, before_timestamp, limit_offset=limit)
    return QueueRetention(
        flat_file.topic,
        flat_file.queue_id,
        flat_file.min_offset,
        min_after,
        [_expired(s, FileType.CONSUME_QUEUE) for s in expired_units]
        + [_expired(s, FileType.COMMIT_LOG) for s in expired_records],
    )


def index_cutoff(now_ms: int, default_reserve_hours: float, topics: Iterable[TopicInfo]) -> int:
    """Index files whose newest item is older than this go: they hold keys of every topic, so the longest
    retention of any topic (or the default) decides."""
    longest_hours = max([default_reserve_hours, *(t.reserve_hours for t in topics)])
    return now_ms - int(longest_hours * HOUR_MS)


async def apply_retention(runtime: Runtime, *, dry_run: bool = False, now_ms: int | None = None) -> RetentionReport:
    """Remove (or with ``dry_run`` list) expired cold segments of every queue and expired index files."""
    now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    report = RetentionReport(dry_run=dry_run, now_ms=now)
    topics = await asyncio.to_thread(runtime.metadata.list_topics)
    by_topic = {topic.name: topic for topic in topics}
    for flat_file in sorted(runtime.flat.files(), key=lambda f: (f.topic, f.queue_id)):
        topic = by_topic.get(flat_file.topic)
        if topic is None or topic.status is not TopicStatus.ACTIVE:
            continue
        before = now - int(topic.reserve_hours * HOUR_MS)
        plan = await plan_queue(flat_file, before)
        if not plan.segments:
            continue
        if not dry_run:
            plan = await _remove(flat_file, before, plan)
        report.queues.append(plan)
    index_before = index_cutoff(now, runtime.config.default_reserve_hours, topics)
    if dry_run:
        report.index_files = await runtime.keys.expired_files(index_before)
    else:
        report.index_files = await runtime.keys.delete_expired(index_before)
    log.info(
        "retention pass",
        dry_run=dry_run,
        queues=len(report.queues),
        segments=report.segment_count,
        bytes=report.bytes_removed,
        index_files=len(report.index_files),
    )
    return report


async def _remove(flat_file: FlatMessageFile, before_timestamp: int, plan: QueueRetention) -> QueueRetention:
    """Remove through the container (provider first, then DELETED) and report what really went."""
    queue_before = {s.base_offset: s for s in flat_file.consume_queue.segments}
    records_before = {s.base_offset: s for s in flat_file.commit_log.segments}
    await flat_file.destroy_expired(before_timestamp)
    queue_left = {s.base_offset for s in flat_file.consume_queue.segments}
    records_left = {s.base_offset for s in flat_file.commit_log.segments}
    removed = [
        _expired(segment, FileType.CONSUME_QUEUE) for base, segment in queue_before.items() if base not in queue_left
    ] + [_expired(segment, FileType.COMMIT_LOG) for base, segment in records_before.items() if base not in records_left]
    return QueueRetention(plan.topic, plan.queue_id, plan.min_offset_before, flat_file.min_offset, removed)
