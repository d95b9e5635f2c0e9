"""Reading a queue's archive for a restore: its range, the check before resuming, and batches read ahead.

The batches are the cold reader's windows (``flat.cold_reader``): each one's bytes are held in the
restore's byte budget from before they are read until they are written.
"""

from __future__ import annotations

import asyncio
import operator
from dataclasses import dataclass

from tieredstore.basics import BoundaryType
from tieredstore.errors import CorruptRecordError, NotFoundError, ValidationError
from tieredstore.flat.cold_reader import ColdQueueReader, ColdReadOptions, LostRange
from tieredstore.flat.message_file import FlatMessageFile
from tieredstore.flat.served import ReadAheadBatch
from tieredstore.formats.message import same_but_physical_offset
from tieredstore.local.store import JoinedRecords
from tieredstore.read.archived import archived_range
from tieredstore.read.node import ReadNode
from tieredstore.read.queue_reader import QueueReader
from tieredstore.restore.budget import ByteBudget
from tieredstore.restore.request import RestoreRequest
from tieredstore.restore.sinks import RestoreSink


async def queue_range(node: ReadNode, flat_file: FlatMessageFile, request: RestoreRequest) -> tuple[int, int]:
    """[first, end): the archived offsets of this queue the request chooses, by offsets or store times."""
    low, high = archived_range(flat_file)
    first, end = low, high
    if request.from_offset is not None:
        first = max(low, request.from_offset)
    if request.to_offset is not None:
        end = min(high, request.to_offset)
    if request.since is not None or request.until is not None:
        reader = QueueReader(node, flat_file.topic, flat_file.queue_id, flat_file)
        if request.since is not None:
            first = await reader.offset_for_time(request.since, BoundaryType.LOWER, "cold")
        if request.until is not None:
            end = await reader.offset_for_time(request.until + 1, BoundaryType.LOWER, "cold")
    # A range starting inside a hole starts at the first archived offset after it.
    first = min(flat_file.next_archived_offset(first), max(first, end))
    return first, max(first, end)


@dataclass(frozen=True, slots=True)
class Batch:
    """Consecutive records of one queue as read, and the bytes of the budget they hold until written."""

    records: JoinedRecords
    held: int


@dataclass(frozen=True, slots=True)
class Skip:
    """The queue goes on at ``offset``: the offsets before it were never archived."""

    offset: int


class _WindowHold:
    """The restore's budget as its cold reader uses it, counting the bytes the window being read holds."""

    def __init__(self, budget: ByteBudget) -> None:
        self.budget = budget
        self.held = 0

    async def acquire(self, size: int) -> int:
        taken = await self.budget.acquire(size)
        self.held += taken
        return taken

    async def release(self, size: int) -> None:
        self.held -= size
        await self.budget.release(size)

    def take(self) -> int:
        """The bytes the window just read holds, now the caller's to give back."""
        held, self.held = self.held, 0
        return held


async def _batch_of(window: ReadAheadBatch, held: int, budget: ByteBudget) -> Batch:
    """A window's records as one buffer, holding no more of the budget than their bytes.

    A window read following the one before may end in part of a record: the records alone are kept, so
    the rest of its read is given back.
    """
    data, starts, ends = window.data, window.starts, window.ends
    sizes = list(map(operator.sub, ends, starts))
    if starts[1:] != ends[:-1]:
        # Not back to back (never so in a commit log the archiver wrote): each record is cut out.
        view = memoryview(data)
        records = b"".join(view[start:end] for start, end in zip(starts, ends, strict=True))
    elif starts[0] != 0 or ends[-1] != len(data):
        records = data[starts[0] : ends[-1]]
    else:
        records = data
    kept = min(held, len(records))
    if kept < held:
        await budget.release(held - kept)
    return Batch(JoinedRecords(records, sizes), kept)


def _refusal(window: ReadAheadBatch) -> CorruptRecordError | None:
    """The error of the window's first corrupt record, named by its queue offset as a sink's check names it."""
    try:
        window.raise_if_corrupt(window.first_offset, window.end_offset)
    except CorruptRecordError as error:
        where = f"{window.topic}/{window.queue_id} at queue offset {error.offset}"
        refused = CorruptRecordError(error.reason, location=where)
        refused.__cause__ = error
        return refused
    return None


async def read_queue(
    flat_file: FlatMessageFile,
    offset: int,
    end: int,
    request: RestoreRequest,
    budget: ByteBudget,
    ahead: asyncio.Queue[Batch | Skip | CorruptRecordError | None],
) -> None:
    """Put the archived records of [offset, end) into ``ahead`` in queue-offset order: batches of at
    most ``batch_messages`` / ``batch_bytes`` holding their bytes of ``budget``, a ``Skip`` past each
    hole, then None; or, in place of the batch holding a corrupt record, its error, and nothing after.

    The error goes through ``ahead`` so that the batches before it are written first.
    """
    # The sinks check every record in full before they write it: the reader only locates them.
    options = ColdReadOptions(request.batch_messages, request.batch_bytes, check_records=False)
    reader = ColdQueueReader(flat_file, options)
    hold = _WindowHold(budget)
    try:
        async for item in reader.windows(offset, end, budget=hold):
            if isinstance(item, LostRange):
                # Never archived: the sink goes on after the hole (only a sink that holds gaps gets here).
                await ahead.put(Skip(item.end))
                offset = item.end
                continue
            offset = item.end_offset
            held = hold.take()
            refused = _refusal(item)
            if refused is not None:
                await budget.release(held)
                await ahead.put(refused)
                return
            batch = await _batch_of(item, held, budget)
            try:
                await ahead.put(batch)
            except BaseException:
                await budget.release(batch.held)
                raise
    finally:
        # A read cut short (an error, the restore cancelled) gives back what its window held.
        if hold.held:
            await budget.release(hold.take())
    if offset < end:
        # Archived, yet the cold files hold nothing there: the restore must not end as if it were done.
        raise NotFoundError(f"cold queue {flat_file.topic}/{flat_file.queue_id} has no unit at offset {offset}")
    await ahead.put(None)


async def check_resume(flat_file: FlatMessageFile, sink: RestoreSink, queue_offset: int) -> None:
    """Refuse to resume into a target whose last record held is not the archive's message at that offset.

    A target that already holds offsets is taken for an earlier, interrupted restore of this archive. A
    hot store producers wrote into after it was replaced holds other messages at those offsets: going
    on would mix them with the archive's, and its own would never be archived.
    """
    topic, queue_id = flat_file.topic, flat_file.queue_id
    held = await asyncio.to_thread(sink.held_record, topic, queue_id, queue_offset)
    if held is None:
        return
    reader = ColdQueueReader(flat_file, ColdReadOptions(window_count=1, window_bytes=len(held)))
    try:
        archived = await reader.read(queue_offset, 1)
    except NotFoundError:
        archived = None
    if archived is None:
        return  # not archived (expired or lost): nothing to compare with
    if not same_but_physical_offset(held, archived.raw(queue_offset)):
        raise ValidationError(
            f"{sink.description} holds a different message at {topic}/{queue_id} offset {queue_offset} than the "
            f"archive: it is not an earlier restore of it (producers wrote into it?); restore into an empty "
            f"directory instead"
        )
