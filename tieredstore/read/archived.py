"""A queue's cold files as metadata records them, read without repair and never past the archived offset.

Recovery, which truncates unreferenced bytes, is the archiver's business: a reader beside it loads a
queue's files from the metadata rows as recorded, and clamps reads to the archived offset, which
metadata records in the same transaction as the segment sizes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from tieredstore.errors import NotFoundError
from tieredstore.flat.cold_reader import ColdQueueReader, ColdReadOptions, LostRange
from tieredstore.flat.message_file import FlatMessageFile
from tieredstore.flat.store import FlatFileStore
from tieredstore.formats.naming import FileType
from tieredstore.metadata import MetadataStore, QueuePosition, SegmentRecord, SegmentStatus
from tieredstore.read.node import ReadNode

LIVE_STATUSES = (SegmentStatus.NEW, SegmentStatus.SEALED)
# Bytes one window of a read holds at most: a window also ends where the storage object holding it does,
# so this bounds reads of a file system only.
READ_WINDOW_BYTES = 64 << 20


def segment_rows(
    metadata: MetadataStore, path: str, statuses: Iterable[SegmentStatus] = LIVE_STATUSES
) -> dict[FileType, list[SegmentRecord]]:
    return {
        file_type: metadata.list_segments(path, file_type.value, statuses=statuses)
        for file_type in (FileType.COMMIT_LOG, FileType.CONSUME_QUEUE)
    }


def archived_queue(
    flat: FlatFileStore, position: QueuePosition, rows: dict[FileType, list[SegmentRecord]]
) -> FlatMessageFile:
    """A queue's cold files exactly as metadata records them: read-only, nothing corrected or repaired."""
    return flat.read_only_file(position, rows.get(FileType.COMMIT_LOG, []), rows.get(FileType.CONSUME_QUEUE, []))


async def load_archived_queue(node: ReadNode, topic: str, queue_id: int) -> FlatMessageFile:
    """One queue's cold files as recorded; NotFoundError when the metadata has no such queue."""
    position = await asyncio.to_thread(node.metadata.get_queue, topic, queue_id)
    rows = await asyncio.to_thread(segment_rows, node.metadata, node.flat.queue_path(topic, queue_id))
    return archived_queue(node.flat, position, rows)


def archived_range(flat_file: FlatMessageFile) -> tuple[int, int]:
    """[min, archived) queue offsets that are readable from cold storage as recorded."""
    archived = min(flat_file.position.max_offset, flat_file.archived_offset)
    return min(flat_file.min_offset, archived), archived


def lost_range_at(flat_file: FlatMessageFile, queue_offset: int) -> tuple[int, int] | None:
    """The [start, end) offsets recorded as lost (never archived) that hold ``queue_offset``, if any.

    A reader jumps to ``end``: the first archived offset after the hole.
    """
    for start, end in flat_file.lost_ranges:
        if start <= queue_offset < end:
            return start, end
    return None


def cold_reader(flat_file: FlatMessageFile, count: int) -> ColdQueueReader:
    """A cold reader of ``flat_file`` for reads of up to ``count`` records a window."""
    return ColdQueueReader(flat_file, ColdReadOptions(window_count=count, window_bytes=READ_WINDOW_BYTES))


async def read_archived(
    flat_file: FlatMessageFile, queue_offset: int, count: int, *, reader: ColdQueueReader | None = None
) -> list[bytes]:
    """Up to ``count`` consecutive archived records from ``queue_offset`` (never past the archived offset).

    A read stops where offsets recorded as lost begin; one starting inside them is NotFoundError
    (``lost_range_at`` says where the hole ends). Read through ``reader`` (of ``flat_file``), a read
    going on from where the last one ended follows the commit log without a consume-queue read.
    """
    low, high = archived_range(flat_file)
    if queue_offset < low:
        raise NotFoundError(
            f"offset {queue_offset} of {flat_file.topic}/{flat_file.queue_id} is below the cold min offset {low}"
        )
    lost = lost_range_at(flat_file, queue_offset)
    if lost is not None:
        raise NotFoundError(
            f"offsets [{lost[0]}, {lost[1]}) of {flat_file.topic}/{flat_file.queue_id} were lost before they were "
            f"archived; the next archived offset is {lost[1]}"
        )
    count = min(count, high - queue_offset)
    if count <= 0:
        return []
    if reader is None:
        reader = cold_reader(flat_file, count)
    records: list[bytes] = []
    # Windows end where the storage object holding them does: as many as ``count`` takes.
    async for window in reader.windows(queue_offset, queue_offset + count, count):
        if isinstance(window, LostRange):
            break
        records.extend(window.raw(offset) for offset in range(window.first_offset, window.end_offset))
    return records
