"""Rebuild lost metadata from the cold tier alone: topics, queues, segments and the key-index catalogue.

Each queue folder of the broker is listed: a segment's base offset comes from its name, its size from
the provider (on S3 the end of its contiguous run of chunks), every segment but a file's last is SEALED
and the last one NEW, as the archiver leaves them. A hole between consume-queue segments is how offsets
lost before they were archived are recorded, so listing the segments brings the lost ranges back too.

Those rows describe the queue as a crash would leave it, so the archiver's own restart recovery then runs
on them (``FlatFileStore.get_or_create``): a trailing partial unit, units whose commit-log bytes did not
survive and commit-log bytes no unit references (a commit in flight when the database was lost) are cut
exactly as a restart cuts them. Time ranges come from the records: a segment's first and last record's
store time, read with a few ranged reads each, never whole segments (but for a commit-log segment whose
last record no unit points at, which only retention running ahead on the consume queue leaves).
Uploaded key-index files are catalogued from their compacted headers (time range, item count), and each
topic gets back the id the index items name it by (``_recover_topic_ids``). Which key wraps an encrypted
segment's data key comes from its ``.codec`` object, read without unwrapping (one small read each).

All of it is built in a scratch in-memory database first and copied into the target in one transaction
that refuses a target holding any row: the target gets the whole rebuild or nothing. What cold storage
cannot tell is defaulted and listed in ``DEFAULTED``.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from tieredstore.errors import CorruptRecordError, IntegrityError, NotFoundError
from tieredstore.flat.listing import ListedSegment, QueueFolder, listed_segments, queue_folders
from tieredstore.flat.message_file import FlatFileSettings, FlatMessageFile
from tieredstore.flat.store import FlatFileStore
from tieredstore.formats.consume_queue import UNIT_SIZE
from tieredstore.formats.index_file import record_key_hashes
from tieredstore.formats.message import (
    MIN_RECORD_SIZE,
    POS_QUEUE_OFFSET,
    index_keys_of,
    split_back_to_back,
    store_timestamp_of,
)
from tieredstore.formats.naming import FileType, index_path
from tieredstore.index.catalogue import MetadataIndexCatalogue
from tieredstore.index.format import (
    COMPACTED_ITEM_SIZE,
    HEADER_SIZE,
    CompactedHeader,
    IndexItem,
    compacted_item_position,
    decode_compacted_item_run,
)
from tieredstore.index.service import IndexFileRecord, IndexFileStatus, namespace_path, stored_namespaces
from tieredstore.metadata import MetadataStore, SegmentStatus, SegmentUpdate
from tieredstore.providers.base import Provider, SegmentId

SCRATCH_URL = "sqlite://"
DEFAULT_CONCURRENCY = 16

# What cold storage cannot tell, and what the rebuilt database holds instead
# (docs/operations/restore.md lists the same).
DEFAULTED = (
    "topic retention: 72 h for every topic (set it again with `topic set-retention`)",
    "topic status: ACTIVE (a topic that was being deleted is back; delete it again)",
    "when rows were written (topic created/updated, queue updated, segment created and sealed, "
    "index file created/updated): the rebuild's time",
    "queue versions, leases and epochs, and archiver memberships: none, they start afresh",
    "segments retention had removed (DELETED rows): not rebuilt",
    "an empty open segment (rolled, nothing written to it yet): not rebuilt; the next write starts it again",
    "offsets lost at the very end of a queue, with nothing archived after them: not known; the archiver "
    "records them again when it finds the hot store without them",
    "key-index files not uploaded yet (on an archiver's disk): not catalogued; their keys are not found by query-key",
)


@dataclass(frozen=True, slots=True)
class RebuiltQueue:
    """One queue as rebuilt: its offsets, segment counts, lost ranges and what recovery cut."""

    topic: str
    queue_id: int
    min_offset: int
    max_offset: int
    commit_log_segments: int
    consume_queue_segments: int
    lost_ranges: tuple[tuple[int, int], ...]
    dropped_units: int = 0
    orphan_bytes_removed: int = 0


@dataclass
class RebuildReport:
    """What ``rebuild_metadata`` wrote, what it skipped and what it had to default."""

    queues: list[RebuiltQueue] = field(default_factory=list)
    index_files: int = 0
    skipped: list[str] = field(default_factory=list)
    rows: dict[str, int] = field(default_factory=dict)
    defaulted: tuple[str, ...] = DEFAULTED
    seconds: float = 0.0

    @property
    def topics(self) -> list[str]:
        return sorted({queue.topic for queue in self.queues})


Progress = Callable[[int, int], None]


@contextmanager
def _first_failure() -> Iterator[None]:
    """A task group's failure raised as its first error: callers, and the CLI's exit codes, know that one."""
    try:
        yield
    except BaseExceptionGroup as failures:
        first: BaseException = failures
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from failures


async def rebuild_metadata(
    provider: Provider,
    target: MetadataStore,
    *,
    cluster: str,
    broker: str,
    settings: FlatFileSettings | None = None,
    progress: Progress | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
) -> RebuildReport:
    """Rebuild ``target`` (empty, at the head schema) from what ``provider`` holds for ``cluster``/``broker``.

    ValidationError, with nothing read or written, when ``target`` holds any row. ``progress`` is told
    (queues done, queues in all) as each queue is rebuilt. Cold storage changes only as the archiver's
    restart would change it (bytes of a commit in flight when the database was lost are cut).
    """
    started = time.perf_counter()
    await asyncio.to_thread(target.require_empty)
    report = RebuildReport()
    folders, report.skipped = await queue_folders(provider, cluster, broker)
    scratch = await asyncio.to_thread(MetadataStore.open, SCRATCH_URL)
    try:
        flat = FlatFileStore(provider, scratch, cluster=cluster, broker=broker, settings=settings)
        now = flat.clock()
        limit = asyncio.Semaphore(concurrency)
        done = 0

        async def one(folder: QueueFolder) -> RebuiltQueue | None:
            nonlocal done
            async with limit:
                rebuilt = await _rebuild_queue(flat, folder, now, report.skipped)
            done += 1
            if progress is not None:
                progress(done, len(folders))
            return rebuilt

        # A task group: when one queue fails, the others stop before the scratch database closes.
        with _first_failure():
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(one(folder)) for folder in folders]
        report.queues = [queue for task in tasks if (queue := task.result()) is not None]
        index_files = await _rebuild_index_catalogue(provider, scratch, cluster, broker, now, report.skipped, limit)
        report.index_files = len(index_files)
        if not report.queues and not index_files:
            raise NotFoundError(
                f"no archive of cluster {cluster!r}, broker {broker!r} under {provider.url}: nothing to rebuild "
                "(check --cold-url and the cluster and broker settings)"
            )
        topic_ids = await _recover_topic_ids(flat, index_files, report.topics)
        report.rows = await asyncio.to_thread(target.adopt_rows, scratch, topic_ids)
    finally:
        await asyncio.to_thread(scratch.close)
    report.seconds = time.perf_counter() - started
    return report


# ---- queues ---------------------------------------------------------------------------------------


async def _rebuild_queue(flat: FlatFileStore, folder: QueueFolder, now: int, skipped: list[str]) -> RebuiltQueue | None:
    provider, scratch = flat.provider, flat.metadata
    # The consume queue first: the archiver commits the commit log before it, so every unit listed
    # here points at commit-log bytes the later listing sees.
    consume_queue = await listed_segments(provider, folder.path, FileType.CONSUME_QUEUE)
    commit_log = await listed_segments(provider, folder.path, FileType.COMMIT_LOG)
    if consume_queue:
        min_offset = consume_queue[0].base_offset // UNIT_SIZE
        max_offset = max(min_offset, consume_queue[-1].end_offset // UNIT_SIZE)
    else:
        first = await _first_queue_offset(provider, folder.path, commit_log)
        if first is None:
            skipped.append(f"{folder.path}: no segment holding a record")
            return None
        min_offset = max_offset = first  # nothing archived: recovery removes the unreferenced records
    files = {FileType.CONSUME_QUEUE: consume_queue, FileType.COMMIT_LOG: commit_log}
    key_ids = await _stored_key_ids(provider, folder.path, files)
    await asyncio.to_thread(_record_listed, scratch, folder, min_offset, max_offset, files, key_ids, now)
    # The archiver's restart recovery, on rows that describe the queue as a crash would leave it.
    await flat.get_or_create(folder.topic, folder.queue_id)
    recovery = flat.pop_recovery(folder.topic, folder.queue_id)
    view = await flat.open_read_only(folder.topic, folder.queue_id)
    updates = await _time_ranges(view)
    await asyncio.to_thread(_apply, scratch, updates)
    return RebuiltQueue(
        topic=folder.topic,
        queue_id=folder.queue_id,
        min_offset=view.min_offset,
        max_offset=view.archived_offset,
        commit_log_segments=len(view.commit_log.segments),
        consume_queue_segments=len(view.consume_queue.segments),
        lost_ranges=tuple(view.lost_ranges),
        dropped_units=recovery.dropped_units if recovery else 0,
        orphan_bytes_removed=recovery.orphan_bytes_removed if recovery else 0,
    )


async def _first_queue_offset(provider: Provider, path: str, commit_log: Sequence[ListedSegment]) -> int | None:
    """QUEUEOFFSET of a commit log's first record: where a queue whose consume queue never landed began."""
    for listed in commit_log:
        if listed.size < MIN_RECORD_SIZE:
            continue
        segment = provider.segment(FileType.COMMIT_LOG, path, listed.base_offset, commit_position=listed.size)
        (queue_offset,) = struct.unpack_from(">q", await segment.read(0, MIN_RECORD_SIZE), POS_QUEUE_OFFSET)
        return int(queue_offset)
    return None


async def _stored_key_ids(
    provider: Provider, path: str, files: dict[FileType, list[ListedSegment]]
) -> dict[tuple[FileType, int], str | None]:
    """Which key wraps each listed segment's data key, as its ``.codec`` says (None: not encrypted)."""
    ids = [
        SegmentId(file_type, path, listed.base_offset) for file_type, segments in files.items() for listed in segments
    ]
    segments = (provider.segment(sid.file_type, sid.path, sid.base_offset) for sid in ids)
    found = await asyncio.gather(*(segment.stored_key_id() for segment in segments))
    return {(sid.file_type, sid.base_offset): key_id for sid, key_id in zip(ids, found, strict=True)}


def _record_listed(
    scratch: MetadataStore,
    folder: QueueFolder,
    min_offset: int,
    max_offset: int,
    files: dict[FileType, list[ListedSegment]],
    key_ids: dict[tuple[FileType, int], str | None],
    now: int,
) -> None:
    """The listed segments as rows: every one but a file's last SEALED, the last NEW, as the archiver leaves them."""
    position = scratch.get_or_create_queue(folder.topic, folder.queue_id, start_offset=min_offset)
    if max_offset != position.max_offset:
        scratch.update_queue(folder.topic, folder.queue_id, expected_version=position.version, max_offset=max_offset)
    for file_type, segments in files.items():
        for number, listed in enumerate(segments):
            last = number == len(segments) - 1
            scratch.add_segment(folder.path, file_type.value, listed.base_offset, created_timestamp=now)
            scratch.update_segment(
                SegmentUpdate(
                    folder.path,
                    file_type.value,
                    listed.base_offset,
                    size=listed.size,
                    status=SegmentStatus.NEW if last else SegmentStatus.SEALED,
                    sealed_timestamp=None if last else now,
                    key_id=key_ids.get((file_type, listed.base_offset)),
                )
            )


def _apply(scratch: MetadataStore, updates: Sequence[SegmentUpdate]) -> None:
    for update in updates:
        scratch.update_segment(update)


async def _time_ranges(view: FlatMessageFile) -> list[SegmentUpdate]:
    """Each segment's first and last record's store time, as the archiver records its time range."""
    heads: dict[int, bytes] = {}

    async def head(commitlog_offset: int) -> bytes:
        if commitlog_offset not in heads:
            heads[commitlog_offset] = await view.commit_log.record_head(commitlog_offset)
        return heads[commitlog_offset]

    async def stored_at(commitlog_offset: int) -> int:
        return store_timestamp_of(await head(commitlog_offset))

    updates = []
    for segment in view.consume_queue.segments:
        if segment.commit_position < UNIT_SIZE:
            continue
        first_offset = segment.base_offset // UNIT_SIZE
        last_offset = (segment.base_offset + segment.commit_position) // UNIT_SIZE - 1
        first, final = await view.read_units(first_offset, 1), await view.read_units(last_offset, 1)
        updates.append(
            SegmentUpdate(
                view.path,
                FileType.CONSUME_QUEUE.value,
                segment.base_offset,
                begin_timestamp=await stored_at(first[0].commitlog_offset),
                end_timestamp=await stored_at(final[0].commitlog_offset),
            )
        )
    segments = view.commit_log.segments
    for number, segment in enumerate(segments):
        if segment.commit_position < MIN_RECORD_SIZE:
            continue
        following = segments[number + 1] if number + 1 < len(segments) else None
        if following is not None and following.commit_position >= MIN_RECORD_SIZE:
            (next_queue_offset,) = struct.unpack_from(">q", await head(following.base_offset), POS_QUEUE_OFFSET)
        else:
            next_queue_offset = view.archived_offset
        last = await _last_record_start(view, segment.base_offset, segment.commit_position, next_queue_offset)
        updates.append(
            SegmentUpdate(
                view.path,
                FileType.COMMIT_LOG.value,
                segment.base_offset,
                begin_timestamp=await stored_at(segment.base_offset),
                end_timestamp=await stored_at(last),
            )
        )
    return updates


async def _last_record_start(view: FlatMessageFile, base_offset: int, size: int, next_queue_offset: int) -> int:
    """Where a commit-log segment's last record starts: the unit of the last archived offset before the
    next segment's first record (the commit log carries on across lost offsets), checked to end exactly
    where the segment does; else found by splitting the segment's records."""
    end = base_offset + size
    below = [(start, min(stop, next_queue_offset)) for start, stop in view.archived_runs if start < next_queue_offset]
    if below:
        units = await view.read_units(below[-1][1] - 1, 1)
        if units and base_offset <= units[0].commitlog_offset and units[0].commitlog_offset + units[0].size == end:
            return units[0].commitlog_offset
    raw = await view.read_commit_log(base_offset, size)
    starts = split_back_to_back(raw, len(raw) // MIN_RECORD_SIZE + 1)
    if len(starts) < 2 or starts[-1] != size:
        raise CorruptRecordError(
            "records do not fill the segment", location=f"{view.path}/{FileType.COMMIT_LOG.value}", offset=base_offset
        )
    return base_offset + starts[-2]


# ---- the key-index catalogue ---------------------------------------------------------------------------


async def _rebuild_index_catalogue(
    provider: Provider,
    scratch: MetadataStore,
    cluster: str,
    broker: str,
    now: int,
    skipped: list[str],
    limit: asyncio.Semaphore,
) -> list[tuple[str, IndexFileRecord]]:
    """Catalogue every uploaded index file, of the broker's root namespace and of each archiver's namespace;
    returns each with the path it lives under."""
    root = index_path(cluster, broker)
    namespaces = ["", *sorted(await stored_namespaces(provider, root))]
    catalogued = []

    async def one(path: str, file_id: int) -> None:
        async with limit:
            record = await _uploaded_index_file(provider, path, file_id, now, skipped)
        if record is not None:
            await asyncio.to_thread(MetadataIndexCatalogue(scratch, path).save, record)
            catalogued.append((path, record))

    for namespace in namespaces:
        path = namespace_path(root, namespace)
        with _first_failure():
            async with asyncio.TaskGroup() as group:
                for file_id in await provider.list_segments(path, FileType.INDEX):
                    group.create_task(one(path, file_id))
    return catalogued


async def _uploaded_index_file(
    provider: Provider, path: str, file_id: int, now: int, skipped: list[str]
) -> IndexFileRecord | None:
    """The catalogue record of one INDEX object, from its compacted header; None (and why, in ``skipped``)
    for an object that is not a whole compacted index file (an upload cut short)."""
    segment = provider.segment(FileType.INDEX, path, file_id)
    size = await segment.real_size()
    segment = provider.segment(FileType.INDEX, path, file_id, commit_position=size)
    try:
        header = CompactedHeader.decode(await segment.read(0, HEADER_SIZE), location=segment.key)
        if header.file_id != file_id or header.file_size != size:
            raise IntegrityError(
                f"its header is file {header.file_id} of {header.file_size} bytes, the object {size} bytes"
            )
    except IntegrityError as error:
        skipped.append(f"{segment.key}: not a whole compacted index file ({error})")
        return None
    return IndexFileRecord(
        file_id=file_id,
        status=IndexFileStatus.UPLOAD,
        created=now,
        begin_timestamp=header.begin_timestamp,
        end_timestamp=header.end_timestamp,
        item_count=header.item_count,
        size=size,
        key_id=await segment.stored_key_id(),
    )


# ---- topic ids ---------------------------------------------------------------------------------------

# Items tried per topic id before it is taken for a topic that is gone (its messages expired or deleted).
_TRIES_PER_TOPIC_ID = 8
_ITEMS_PER_READ = 4096


async def _recover_topic_ids(
    flat: FlatFileStore, index_files: Sequence[tuple[str, IndexFileRecord]], topics: Sequence[str]
) -> dict[str, int]:
    """Each topic's metadata id as the key index recorded it, so that its items still match the topic.

    An index item names its topic by id only. Items are read through, newest file first, until every
    topic is matched: an item matches the topic whose message at the item's queue and offset has a key
    hashing, with that topic's name, to the item's hash. A topic no item matches (its messages have no
    keys) gets an id above every id the items use, so that it is never taken for another topic's items.
    """
    found: dict[str, int] = {}
    tries: dict[int, int] = {}
    views: dict[tuple[str, int], FlatMessageFile | None] = {}
    ordered = sorted(index_files, key=lambda entry: (entry[1].end_timestamp or 0, entry[1].file_id), reverse=True)
    for path, record in ordered:
        if len(found) == len(topics):
            break
        header = record.compacted_header()
        segment = flat.provider.segment(FileType.INDEX, path, record.file_id, commit_position=record.size)
        first = compacted_item_position(header.slot_count, 0)
        for start in range(0, header.item_count, _ITEMS_PER_READ):
            count = min(_ITEMS_PER_READ, header.item_count - start)
            position = first + start * COMPACTED_ITEM_SIZE
            raw = await segment.read(position, count * COMPACTED_ITEM_SIZE)
            for item in decode_compacted_item_run(raw, header.begin_timestamp, location=segment.key, position=position):
                if item.topic_id in found.values() or tries.get(item.topic_id, 0) >= _TRIES_PER_TOPIC_ID:
                    continue
                tries[item.topic_id] = tries.get(item.topic_id, 0) + 1
                name = await _topic_of(flat, views, item, [t for t in topics if t not in found])
                if name is not None:
                    found[name] = item.topic_id
            if len(found) == len(topics):
                break
    next_id = max([0, *tries, *found.values()]) + 1
    for name in topics:
        if name not in found:
            found[name], next_id = next_id, next_id + 1
    return found


async def _topic_of(
    flat: FlatFileStore,
    views: dict[tuple[str, int], FlatMessageFile | None],
    item: IndexItem,
    candidates: Sequence[str],
) -> str | None:
    """The candidate topic whose archived message at the item's position has a key with the item's hash."""
    for topic in candidates:
        key = (topic, item.queue_id)
        if key not in views:
            try:
                views[key] = await flat.open_read_only(topic, item.queue_id)
            except NotFoundError:
                views[key] = None
        view = views[key]
        if view is None:
            continue
        try:
            view.archived_run_end(item.queue_offset)
        except NotFoundError:
            continue  # not archived there (expired, lost, or never that far)
        records = await view.read_messages(item.queue_offset, 1)
        if records and item.key_hash in record_key_hashes(topic, index_keys_of(records[0])):
            return topic
    return None
