"""Retention of cold data: remove what is older than each topic's retention, and expired index files.

For every queue of an ACTIVE topic, whole head segments whose newest message is older than
``now - retention`` go: consume-queue segments first, then the commit-log segments no remaining
unit points into. Each is deleted from the provider first and then marked DELETED (a crash in
between is finished by recovery); the queue's min offset moves up. The last segment of a file is
never removed, so a queue keeps its position; that is why a pass first rolls every open segment
older than the rolling interval (``FlatMessageFile.roll_if_due``), so that a quiet queue's data
expires too, at most retention plus the rolling interval after it was stored. Index files hold keys
of every topic, so one goes only when its newest item is older than the longest retention of any topic.

The running archiver applies it to the queues it holds on each maintenance pass (``ArchiverRetention``,
called by ``Dispatcher.maintain``); ``tieredstore retention`` runs ``apply_retention`` on demand while
no archiver runs. ``dry_run`` reports what would go, from the same rules, and changes nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field

import structlog

from tieredstore import basics
from tieredstore.flat.message_file import FlatMessageFile
from tieredstore.formats.consume_queue import UNIT_SIZE
from tieredstore.formats.naming import FileType
from tieredstore.index.namespaces import KeyIndex
from tieredstore.metadata import MetadataStore, TopicInfo, TopicStatus
from tieredstore.metrics import Metrics
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


def retention_ms(topic: TopicInfo) -> int:
    """How long the topic's cold data is kept, in milliseconds."""
    return topic.reserve_seconds * 1000


def _expired_head(
    segments: list[FileSegment], before_timestamp: int, *, limit_offset: int | None = None, rolls: bool = False
) -> list[FileSegment]:
    """The head segments ``FlatAppendFile.destroy_expired`` removes, computed without removing them
    (``rolls``: after the last one was rolled, so that it is not the last one any more)."""
    chosen: list[FileSegment] = []
    for segment in segments if rolls else segments[:-1]:
        newest = segment.max_timestamp
        if newest is None or newest >= before_timestamp:
            break
        if limit_offset is not None and segment.base_offset + segment.commit_position > limit_offset:
            break
        chosen.append(segment)
    return chosen


async def plan_queue(flat_file: FlatMessageFile, before_timestamp: int, *, now_ms: int | None = None) -> QueueRetention:
    """What ``flat_file.destroy_expired(before_timestamp)`` would remove, and the min offset it would leave.

    With ``now_ms``: after ``flat_file.roll_if_due(now_ms)``, as a retention pass does it.
    """
    queue_segments = flat_file.consume_queue.segments
    expired_units = _expired_head(
        queue_segments,
        before_timestamp,
        rolls=now_ms is not None and flat_file.consume_queue.should_roll_by_time(now_ms),
    )
    min_after = flat_file.min_offset
    if expired_units:
        min_after = (
            queue_segments[len(expired_units)].base_offset // UNIT_SIZE
            if len(expired_units) < len(queue_segments)
            else flat_file.archived_offset
        )
    limit: int | None = None
    if flat_file.archived_offset > min_after:
        limit = (await flat_file.consume_queue.read_unit(min_after)).commitlog_offset
    expired_records = _expired_head(
        flat_file.commit_log.segments,
        before_timestamp,
        limit_offset=limit,
        rolls=now_ms is not None and flat_file.commit_log.should_roll_by_time(now_ms),
    )
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
    return now_ms - max([int(default_reserve_hours * HOUR_MS), *(retention_ms(t) for t in topics)])


async def apply_retention(runtime: Runtime, *, dry_run: bool = False, now_ms: int | None = None) -> RetentionReport:
    """Remove (or with ``dry_run`` list) expired cold segments of every queue and expired index files."""
    now = basics.now_ms() if now_ms is None else now_ms
    report = RetentionReport(dry_run=dry_run, now_ms=now)
    retention = ArchiverRetention(
        runtime.metadata, runtime.metrics, default_reserve_hours=runtime.config.default_reserve_hours, keys=runtime.keys
    )
    topics = await retention.topics()
    for flat_file in sorted(runtime.flat.files(), key=lambda f: (f.topic, f.queue_id)):
        if dry_run:
            topic = topics.get(flat_file.topic)
            if topic is not None and topic.status is TopicStatus.ACTIVE:
                plan = await plan_queue(flat_file, now - retention_ms(topic), now_ms=now)
                if plan.segments:
                    report.queues.append(plan)
            continue
        done = await retention.expire_queue(flat_file, topics.get(flat_file.topic), now)
        if done is not None:
            report.queues.append(done)
    if dry_run:
        report.index_files = await runtime.keys.expired_files(
            index_cutoff(now, runtime.config.default_reserve_hours, topics.values())
        )
    else:
        report.index_files = await retention.expire_index(now, topics)
    log.info(
        "retention pass",
        dry_run=dry_run,
        queues=len(report.queues),
        segments=report.segment_count,
        bytes=report.bytes_removed,
        index_files=len(report.index_files),
    )
    return report


class ArchiverRetention:
    """Cold retention as the archiver applies it, queue by queue, on each maintenance pass.

    ``keys`` is the whole broker's key index (None: no index retention). ``owner`` is the archiver's
    lease owner id when several archivers share the queues: each expires the queues it holds, and the
    live archiver whose owner id sorts first also expires the uploaded index files of every namespace
    (``KeyIndex.delete_expired``), so each file goes once.
    """

    def __init__(
        self,
        metadata: MetadataStore,
        metrics: Metrics,
        *,
        default_reserve_hours: float,
        keys: KeyIndex | None = None,
        owner: str | None = None,
    ) -> None:
        self.metadata = metadata
        self.metrics = metrics
        self.default_reserve_hours = default_reserve_hours
        self.keys = keys
        self.owner = owner

    async def topics(self) -> dict[str, TopicInfo]:
        """Every topic by name, with its retention, as the metadata store says now."""
        return {topic.name: topic for topic in await asyncio.to_thread(self.metadata.list_topics)}

    async def expire_queue(
        self, flat_file: FlatMessageFile, topic: TopicInfo | None, now_ms: int
    ) -> QueueRetention | None:
        """Roll the queue's segments that are due, then remove what its topic's retention expired; None if nothing.

        The caller holds the queue (its lock, and its lease under leases): nothing else writes it meanwhile.
        """
        await flat_file.roll_if_due(now_ms)
        if topic is None or topic.status is not TopicStatus.ACTIVE:
            return None
        before = now_ms - retention_ms(topic)
        plan = await plan_queue(flat_file, before)
        if not plan.segments:
            return None
        done = await _remove(flat_file, before, plan)
        for segment in done.segments:
            self.metrics.retention_segments.labels(done.topic, segment.file_type.value).inc()
            self.metrics.retention_bytes.labels(done.topic).inc(segment.size)
        return done

    async def expire_index(self, now_ms: int, topics: dict[str, TopicInfo]) -> list[int]:
        """Delete the key-index files older than the longest retention; returns their ids."""
        if self.keys is None:
            return []
        every_namespace = self.owner is None or await asyncio.to_thread(self._leads)
        cutoff = index_cutoff(now_ms, self.default_reserve_hours, topics.values())
        removed = await self.keys.delete_expired(cutoff, every_namespace=every_namespace)
        if removed:
            self.metrics.retention_index_files.inc(len(removed))
            log.info("key-index files deleted by retention", file_ids=removed, older_than=cutoff)
        return removed

    def _leads(self) -> bool:
        """Whether this archiver's owner id sorts first among the live archivers (see the class docstring).

        While archivers join or leave, two may each think so for a round: a file deleted twice is
        deleted all the same (its object and its catalogue row go, whoever is second finds them gone).
        """
        live = self.metadata.leases.live_archivers()
        return not live or live[0].startswith(f"{self.owner} (")


async def _remove(flat_file: FlatMessageFile, before_timestamp: int, plan: QueueRetention) -> QueueRetention:
    """Remove through the container (provider first, then DELETED), log each segment and report what really went."""
    queue_before = {s.base_offset: s for s in flat_file.consume_queue.segments}
    records_before = {s.base_offset: s for s in flat_file.commit_log.segments}
    await flat_file.destroy_expired(before_timestamp)
    queue_left = {s.base_offset for s in flat_file.consume_queue.segments}
    records_left = {s.base_offset for s in flat_file.commit_log.segments}
    removed = [
        _expired(segment, FileType.CONSUME_QUEUE) for base, segment in queue_before.items() if base not in queue_left
    ] + [_expired(segment, FileType.COMMIT_LOG) for base, segment in records_before.items() if base not in records_left]
    for segment in removed:
        log.info(
            "cold segment deleted by retention",
            topic=flat_file.topic,
            queue_id=flat_file.queue_id,
            file_type=segment.file_type.value,
            base_offset=segment.base_offset,
            size=segment.size,
            end_timestamp=segment.end_timestamp,
            min_offset=flat_file.min_offset,
        )
    return QueueRetention(plan.topic, plan.queue_id, plan.min_offset_before, flat_file.min_offset, removed)
