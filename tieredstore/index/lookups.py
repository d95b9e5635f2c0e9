"""Key lookups of IndexService: the files whose time range may hold a key, newest first, each hit confirmed."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from tieredstore.errors import ValidationError
from tieredstore.formats.index_file import key_hash
from tieredstore.formats.message import MessageRecord
from tieredstore.formats.naming import FileType
from tieredstore.index.file import lookup_segment, select_items
from tieredstore.index.format import IndexItem
from tieredstore.index.records import IndexFileRecord, IndexFileStatus
from tieredstore.index.service_state import IndexServiceState


@dataclass(frozen=True, slots=True)
class IndexHit:
    """A message whose keys really contain the key asked for."""

    topic_id: int
    queue_id: int
    queue_offset: int
    size: int
    timestamp: int


ConfirmKeys = Callable[[int, int, int], Awaitable[Sequence[str]]]
"""``confirm(topic_id, queue_id, queue_offset)``: the keys the stored message really has ([] if it is gone)."""


class _Found(Protocol):
    @property
    def record(self) -> MessageRecord: ...


FoundT = TypeVar("FoundT", bound=_Found)


def newest_first(messages: Iterable[FoundT], max_count: int) -> list[FoundT]:
    """The ``max_count`` most recently stored of ``messages`` found by key (from either tier), newest first."""
    ordered = sorted(
        messages, key=lambda m: (m.record.store_timestamp, m.record.queue_id, m.record.queue_offset), reverse=True
    )
    return ordered[:max_count]


class IndexLookups(IndexServiceState):
    """Answers ``query`` from the current file, sealed local files and uploaded files alike."""

    async def query(
        self,
        topic: str,
        topic_id: int,
        key: str,
        max_count: int,
        begin_timestamp: int,
        end_timestamp: int,
        confirm: ConfirmKeys,
    ) -> list[IndexHit]:
        """Messages of ``topic`` whose keys include ``key``, stored in [begin, end], newest files first.

        At most ``max_count`` hits; each hash match is confirmed with ``confirm`` before it counts.
        """
        self._require_started()
        if max_count < 1:
            raise ValidationError(f"max_count must be at least 1, got {max_count}")
        if begin_timestamp > end_timestamp:
            raise ValidationError(f"begin timestamp {begin_timestamp} is after end timestamp {end_timestamp}")
        if not key:
            raise ValidationError("the key to look up is empty")
        hash_value = key_hash(topic, key)
        if self.read_only:
            await asyncio.to_thread(self._reload_catalogue)
        candidates = [record for record in self.files() if self._may_hold(record, begin_timestamp, end_timestamp)]
        # A file still being filled has no end timestamp in the catalogue yet: it is the newest.
        candidates.sort(
            key=lambda r: (r.end_timestamp if r.end_timestamp is not None else 2**63, r.file_id), reverse=True
        )
        hits: list[IndexHit] = []
        seen: set[tuple[int, int]] = set()
        for candidate in candidates:
            items = await self._lookup_file(candidate.file_id, hash_value)
            for item in select_items(items, topic_id, begin_timestamp, end_timestamp):
                where = (item.queue_id, item.queue_offset)
                if where in seen:
                    continue
                seen.add(where)
                if key not in await confirm(item.topic_id, item.queue_id, item.queue_offset):
                    continue
                hits.append(IndexHit(item.topic_id, item.queue_id, item.queue_offset, item.size, item.timestamp))
                if len(hits) >= max_count:
                    return hits
        return hits

    def _may_hold(self, record: IndexFileRecord, begin_timestamp: int, end_timestamp: int) -> bool:
        # A reader cannot see the live counts of a file the owner is still filling: its catalogue
        # record's time range is stale, so such a file is always a candidate.
        if self.read_only and record.status is IndexFileStatus.UNSEALED:
            return record.begin_timestamp is None or record.begin_timestamp <= end_timestamp
        return record.overlaps(begin_timestamp, end_timestamp)

    async def _lookup_file(self, file_id: int, hash_value: int) -> list[IndexItem]:
        """Items with ``hash_value`` in one file, read from wherever the file is now."""
        async with self._write_lock:
            current = self._current
            if current is not None and current.file_id == file_id:
                return current.lookup(hash_value)
            record = self._records.get(file_id)
            if record is None:
                return []  # deleted by retention while the query ran
            if record.status is not IndexFileStatus.UPLOAD:
                try:
                    return self._local_reader(record).lookup(hash_value)
                except FileNotFoundError:
                    if not self.read_only:
                        raise
            if self.read_only and record.status is not IndexFileStatus.UPLOAD:
                # The owner uploaded it and removed the local file since the catalogue was read.
                self._reload_catalogue()
                record = self._records.get(file_id)
                if record is None or record.status is not IndexFileStatus.UPLOAD:
                    return []
        segment = self.provider.segment(FileType.INDEX, self.index_path, file_id, commit_position=record.size)
        return await lookup_segment(segment, record.compacted_header(), hash_value)
