"""Scrub: find what cold storage holds that metadata does not account for, and delete the old part of it.

What counts as an orphan is ``tieredstore.orphans``' rule, the one ``verify`` reports as ORPHAN_OBJECT
(plus the tails of sealed segments, which verify notes). Each orphan carries its size and its
last-modified time as the provider's listing reports them. A scrub with ``delete`` removes only the
orphans last written longer ago than ``older_than_ms``: a commit in flight writes its objects before
metadata records them, so a young orphan may be one, and is kept. Deleting beside a running archiver
is the caller's to refuse (the CLI does, as it does for retention).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from tieredstore import basics
from tieredstore.errors import StorageError
from tieredstore.formats.naming import FileType, queue_path, segment_key
from tieredstore.metadata import LIVE_SEGMENT_STATUSES, MetadataStore, SegmentRecord, SegmentStatus
from tieredstore.metrics import Metrics
from tieredstore.orphans import (
    NO_CATALOGUE_ROW,
    NO_LIVE_ROW,
    QUEUE_FILE_TYPES,
    abandoned_tail,
    broker_folder,
    index_namespaces,
    orphan_folders,
    uncatalogued_index_files,
    unrecorded_segments,
)
from tieredstore.providers.base import ListsObjects, Provider

log = structlog.get_logger(__name__)


class OrphanKind(enum.StrEnum):
    """Why metadata does not account for an orphan, in one word."""

    SEGMENT = "segment"  # a segment of a known queue without a live row
    FOLDER = "folder"  # a segment in a topic or queue folder metadata does not know
    INDEX_FILE = "index_file"  # a key-index file without a catalogue row
    SEALED_TAIL = "sealed_tail"  # bytes past the recorded size of a sealed segment


class Action(enum.StrEnum):
    """What the scrub did with an orphan."""

    WOULD_DELETE = "would_delete"  # a dry run, old enough
    DELETED = "deleted"
    KEPT = "kept"  # younger than the window


@dataclass(slots=True)
class Orphan:
    """One segment (or a sealed segment's tail) that metadata does not account for.

    ``size`` is what deleting it frees; ``recorded_size`` is where a sealed tail is cut back to.
    """

    kind: OrphanKind
    location: str
    reason: str
    path: str
    file_type: FileType
    base_offset: int
    size: int
    last_modified: int
    topic: str | None = None
    queue_id: int | None = None
    recorded_size: int | None = None
    action: Action = Action.KEPT

    def as_json(self, now_ms: int) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "location": self.location,
            "reason": self.reason,
            "topic": self.topic,
            "queue_id": self.queue_id,
            "file_type": self.file_type.value,
            "base_offset": self.base_offset,
            "size": self.size,
            "last_modified": self.last_modified,
            "age_ms": now_ms - self.last_modified,
            "action": self.action.value,
        }


@dataclass(slots=True)
class ScrubReport:
    """Every orphan found, what was done with each, and remarks for people."""

    delete: bool
    older_than_ms: int
    now_ms: int
    orphans: list[Orphan] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def count(self, action: Action) -> tuple[int, int]:
        """(orphans, bytes) that got ``action``."""
        chosen = [orphan for orphan in self.orphans if orphan.action is action]
        return len(chosen), sum(orphan.size for orphan in chosen)

    def as_json(self) -> dict[str, Any]:
        deleted, deleted_bytes = self.count(Action.DELETED)
        would, would_bytes = self.count(Action.WOULD_DELETE)
        kept, kept_bytes = self.count(Action.KEPT)
        return {
            "dry_run": not self.delete,
            "older_than_ms": self.older_than_ms,
            "now": self.now_ms,
            "orphans": [orphan.as_json(self.now_ms) for orphan in self.orphans],
            "orphan_count": len(self.orphans),
            "bytes": sum(orphan.size for orphan in self.orphans),
            "deleted": deleted,
            "deleted_bytes": deleted_bytes,
            "would_delete": would,
            "would_delete_bytes": would_bytes,
            "kept": kept,
            "kept_bytes": kept_bytes,
            "notes": list(self.notes),
        }


@dataclass(frozen=True, slots=True)
class ScrubScope:
    """Where to look: one broker's archive, all of it or one topic (the key index only for all)."""

    cluster: str
    broker: str
    topic: str | None = None


class Scrubber:
    """Finds the orphans of one broker's archive and, when asked, deletes the old ones."""

    def __init__(
        self,
        metadata: MetadataStore,
        provider: Provider,
        metrics: Metrics,
        *,
        on_plan: Callable[[int], None] | None = None,
        on_step: Callable[[], None] | None = None,
    ) -> None:
        if not isinstance(provider, ListsObjects):
            raise StorageError(f"{provider!r} cannot list objects with their last-modified times, which scrub needs")
        self.metadata = metadata
        self.provider = provider
        self.lister: ListsObjects = provider
        self.metrics = metrics
        self._on_plan = on_plan
        self._on_step = on_step
        self._notes: list[str] = []

    async def scrub(
        self, scope: ScrubScope, *, older_than_ms: int, delete: bool = False, now_ms: int | None = None
    ) -> ScrubReport:
        """Find every orphan in ``scope``; with ``delete``, remove those last written before now minus the window."""
        self._notes = []
        positions = await asyncio.to_thread(self.metadata.list_queues, scope.topic)
        namespaces = (
            await index_namespaces(self.metadata, self.provider, scope.cluster, scope.broker)
            if scope.topic is None
            else []
        )
        if self._on_plan is not None:
            self._on_plan(len(positions) + 1 + len(namespaces))
        found: list[Orphan] = []
        for position in positions:
            found += await self._queue_orphans(scope, position.topic, position.queue_id)
            self._step()
        found += await self._folder_orphans(scope, {(p.topic, p.queue_id) for p in positions})
        self._step()
        for folder, files in namespaces:
            stored = await self.provider.list_segments(folder, FileType.INDEX)
            for file_id in uncatalogued_index_files(stored, files):
                orphan = await self._orphan(OrphanKind.INDEX_FILE, NO_CATALOGUE_ROW, folder, FileType.INDEX, file_id)
                found += [orphan] if orphan is not None else []
            self._step()
        now = basics.now_ms() if now_ms is None else now_ms
        report = ScrubReport(delete, older_than_ms, now, found, self._notes)
        for orphan in found:
            if orphan.last_modified >= now - older_than_ms:
                orphan.action = Action.KEPT
            elif not delete:
                orphan.action = Action.WOULD_DELETE
            else:
                await self._delete(orphan)
        return report

    def _step(self) -> None:
        if self._on_step is not None:
            self._on_step()

    async def _queue_orphans(self, scope: ScrubScope, topic: str, queue_id: int) -> list[Orphan]:
        path = queue_path(scope.cluster, scope.broker, topic, queue_id)
        found: list[Orphan] = []
        for kind in QUEUE_FILE_TYPES:
            rows = await asyncio.to_thread(self.metadata.list_segments, path, kind.value, statuses=list(SegmentStatus))
            live = [row for row in rows if row.status in LIVE_SEGMENT_STATUSES]
            dead = {row.base_offset: row.status for row in rows if row.status not in LIVE_SEGMENT_STATUSES}
            for base in unrecorded_segments(await self.provider.list_segments(path, kind), live):
                status = dead.get(base)
                reason = NO_LIVE_ROW if status is None else f"{NO_LIVE_ROW} (its row is {status.value})"
                orphan = await self._orphan(OrphanKind.SEGMENT, reason, path, kind, base, topic, queue_id)
                found += [orphan] if orphan is not None else []
            for index, row in enumerate(live):
                if row.status is SegmentStatus.SEALED:
                    tail = await self._sealed_tail(live, index, path, kind, topic, queue_id)
                    found += [tail] if tail is not None else []
        return found

    async def _sealed_tail(
        self, live: list[SegmentRecord], index: int, path: str, kind: FileType, topic: str, queue_id: int
    ) -> Orphan | None:
        row = live[index]
        stored = await self.provider.segment(kind, path, row.base_offset, commit_position=row.size).real_size()
        if not abandoned_tail(live, index, stored):
            return None
        reason = (
            f"{stored - row.size} bytes past the recorded size {row.size} of this sealed segment, left by a "
            "recovery under leases (never read)"
        )
        orphan = await self._orphan(OrphanKind.SEALED_TAIL, reason, path, kind, row.base_offset, topic, queue_id)
        if orphan is None:
            return None
        # The tail is the segment's last write, so the segment's newest object dates it.
        orphan.size, orphan.recorded_size = stored - row.size, row.size
        return orphan

    async def _folder_orphans(self, scope: ScrubScope, known: set[tuple[str, int]]) -> list[Orphan]:
        found: list[Orphan] = []
        broker_path = broker_folder(scope.cluster, scope.broker)
        for folder in await orphan_folders(self.provider, broker_path, scope.topic, known):
            if folder.queue_id is None:
                self._notes.append(f"{folder.location}: not tieredstore's layout (no queue id), left alone")
                continue
            for kind, offsets in folder.segments.items():
                for base in offsets:
                    orphan = await self._orphan(
                        OrphanKind.FOLDER, folder.reason, folder.location, kind, base, folder.topic, folder.queue_id
                    )
                    found += [orphan] if orphan is not None else []
        return found

    async def _orphan(
        self,
        kind: OrphanKind,
        reason: str,
        path: str,
        file_type: FileType,
        base_offset: int,
        topic: str | None = None,
        queue_id: int | None = None,
    ) -> Orphan | None:
        """The orphan with its size and last write as listed; None when it is gone meanwhile."""
        key = segment_key(path, file_type, base_offset)
        objects = await self.lister.list_objects(key)
        if not objects:
            return None
        return Orphan(
            kind,
            key,
            reason,
            path,
            file_type,
            base_offset,
            size=sum(stored.size for stored in objects),
            last_modified=max(stored.last_modified for stored in objects),
            topic=topic,
            queue_id=queue_id,
        )

    async def _delete(self, orphan: Orphan) -> None:
        segment = self.provider.segment(
            orphan.file_type, orphan.path, orphan.base_offset, commit_position=orphan.recorded_size or 0
        )
        if orphan.recorded_size is not None:
            await segment.truncate(orphan.recorded_size)  # the recorded bytes stay, the tail goes
        else:
            await segment.destroy()
        orphan.action = Action.DELETED
        self.metrics.scrub_deleted_objects.labels(orphan.file_type.value).inc()
        self.metrics.scrub_deleted_bytes.labels(orphan.file_type.value).inc(orphan.size)
        log.info(
            "orphan deleted by scrub",
            location=orphan.location,
            kind=orphan.kind.value,
            reason=orphan.reason,
            topic=orphan.topic,
            queue_id=orphan.queue_id,
            file_type=orphan.file_type.value,
            base_offset=orphan.base_offset,
            size=orphan.size,
            last_modified=orphan.last_modified,
        )
