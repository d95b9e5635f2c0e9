"""Reading a queue's archive for a restore: its range, the check before resuming, and batches read ahead.

Units are read only where a batch does not follow the one before; otherwise the records are split
straight out of the commit log where the batch before ended. Kept in one module so restore can move
onto a shared cold reader in one place.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

import numpy as np

from tieredstore.errors import CorruptRecordError, NotFoundError, SegmentNotFoundError, ValidationError
from tieredstore.flat.consume_queue import BoundaryType
from tieredstore.flat.message_file import FlatMessageFile
from tieredstore.formats.arrays import RECORD_HEAD_DTYPE, UNIT_DTYPE, gather
from tieredstore.formats.consume_queue import UNIT_SIZE
from tieredstore.formats.message import MIN_RECORD_SIZE, same_but_physical_offset, split_back_to_back
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
    commitlog_end: int  # where the record after the last one lies in the cold commit log


@dataclass(frozen=True, slots=True)
class Skip:
    """The queue goes on at ``offset``: the offsets before it were never archived."""

    offset: int


async def _read_units(flat_file: FlatMessageFile, offset: int, count: int) -> np.ndarray:
    """Up to ``count`` archived units from ``offset`` (fewer where a hole, the end or the storage object
    holding them comes first), one read."""
    name = f"{flat_file.topic}/{flat_file.queue_id}"
    consume_queue = flat_file.consume_queue
    raw = await consume_queue.read_from(offset * UNIT_SIZE, count * UNIT_SIZE)
    whole = len(raw) - len(raw) % UNIT_SIZE
    if whole < len(raw):
        # The object ends inside a unit (a commit split across objects): that unit is read on its own.
        raw = raw[:whole] if whole else await consume_queue.read(offset * UNIT_SIZE, UNIT_SIZE)
    if len(raw) % UNIT_SIZE:
        raise CorruptRecordError(
            f"cold consume queue of {name} returned {len(raw)} bytes, not whole units", offset=offset * UNIT_SIZE
        )
    if not raw:
        raise NotFoundError(f"cold queue {name} has no unit at offset {offset}")
    units = np.frombuffer(raw, dtype=UNIT_DTYPE)
    broken = np.flatnonzero((units["commitlog_offset"] < 0) | (units["size"] < 0))
    if len(broken):
        index = int(broken[0])
        raise CorruptRecordError(
            f"cold consume queue of {name} has a unit with negative offset {int(units['commitlog_offset'][index])} "
            f"or size {int(units['size'][index])} at queue offset {offset + index}",
            offset=(offset + index) * UNIT_SIZE,
        )
    return units


async def _read_batch(
    flat_file: FlatMessageFile, units: np.ndarray, offset: int, request: RestoreRequest, budget: ByteBudget
) -> Batch:
    """The records of ``units`` (from queue offset ``offset``) cut at ``batch_bytes`` (at least one record).

    One commit-log read, once its bytes fit in the budget, to the end of the storage object holding them
    at most (the records that object holds whole are the batch).
    """
    positions = units["commitlog_offset"].astype(np.int64)
    start = int(positions[0])
    ends = positions + units["size"].astype(np.int64) - start
    over = np.flatnonzero(ends > request.batch_bytes)
    taken = max(1, int(over[0])) if len(over) else len(units)
    positions, ends = positions[:taken] - start, ends[:taken]
    length = int(ends.max())
    held = await budget.acquire(length)
    try:
        raw = await flat_file.commit_log.read_from(start, length)
        if len(raw) < length:
            cut = int(np.argmin(ends <= len(raw)))  # the first record the read does not hold whole
            if cut:
                positions, ends = positions[:cut], ends[:cut]
                if int(ends.max()) < len(raw):
                    raw = raw[: int(ends.max())]
            else:
                raw = await flat_file.read_commit_log(start, length)
    except BaseException:
        await budget.release(held)
        raise
    short = np.flatnonzero((positions < 0) | (ends > len(raw)))
    if len(short):
        await budget.release(held)
        raise NotFoundError(
            f"cold commit log of {flat_file.topic}/{flat_file.queue_id} ends before the record at queue offset "
            f"{offset + int(short[0])}"
        )
    sizes = ends - positions
    if positions[0] != 0 or (positions[1:] != ends[:-1]).any() or len(raw) != ends[-1]:
        # Not back to back (never so in a commit log the archiver wrote): each record is cut out.
        view = memoryview(raw)
        raw = b"".join(view[begin:stop] for begin, stop in zip(positions.tolist(), ends.tolist(), strict=True))
    return Batch(JoinedRecords(raw, sizes.tolist()), held, start + int(ends[-1]))


async def _read_following(
    flat_file: FlatMessageFile,
    offset: int,
    count: int,
    commitlog_offset: int,
    record_bytes: float,
    request: RestoreRequest,
    budget: ByteBudget,
) -> Batch | None:
    """Up to ``count`` records from ``offset``, split out of the commit log from ``commitlog_offset``,
    where the batch before ended: one read, and no consume-queue read.

    A queue's cold commit log holds its records back to back in queue-offset order; each record split
    out by its TOTALSIZE must carry this queue's id and the next queue offset. None when they do not (a
    segment gone, damage): the consume queue then says where the records are.
    """
    wanted = min(request.batch_bytes, max(MIN_RECORD_SIZE, math.ceil(record_bytes * count)))
    held = await budget.acquire(wanted)
    try:
        raw = await flat_file.commit_log.read_from(commitlog_offset, wanted)
    except (NotFoundError, SegmentNotFoundError):
        raw = b""
    except BaseException:
        await budget.release(held)
        raise
    ends = np.asarray(split_back_to_back(raw, count), dtype=np.int64)
    found = len(ends) - 1
    if found:
        heads = gather(np.frombuffer(raw, dtype=np.uint8), ends[:-1], RECORD_HEAD_DTYPE)
        expected = np.arange(offset, offset + found, dtype=np.int64)
        if (heads["queue_offset"] != expected).any() or (heads["queue_id"] != flat_file.queue_id).any():
            found = 0
    if not found:
        await budget.release(held)
        return None
    if ends[-1] < len(raw):
        raw = raw[: int(ends[-1])]
    return Batch(JoinedRecords(raw, np.diff(ends).tolist()), held, commitlog_offset + int(ends[-1]))


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
    try:
        archived = await flat_file.read_messages(queue_offset, 1)
    except NotFoundError:
        return  # not archived (expired or lost): nothing to compare with
    if archived and not same_but_physical_offset(held, archived[0]):
        raise ValidationError(
            f"{sink.description} holds a different message at {topic}/{queue_id} offset {queue_offset} than the "
            f"archive: it is not an earlier restore of it (producers wrote into it?); restore into an empty "
            f"directory instead"
        )


async def read_queue(
    flat_file: FlatMessageFile,
    offset: int,
    end: int,
    request: RestoreRequest,
    budget: ByteBudget,
    ahead: asyncio.Queue[Batch | Skip | None],
) -> None:
    """Put the archived records of [offset, end) into ``ahead`` in queue-offset order: batches of at
    most ``batch_messages`` / ``batch_bytes`` holding their bytes of ``budget``, a ``Skip`` past each
    hole, then None.
    """
    # Units are read only where a batch does not follow the one before (the first, after a hole).
    units, units_at = np.empty(0, dtype=UNIT_DTYPE), offset
    # (queue offset, commit-log offset, mean record size): where the next batch probably starts; from
    # the oldest record, most likely the commit log's start (a batch checks its records either way).
    guess = flat_file.first_record_guess() if offset == flat_file.min_offset else None
    follows = None if guess is None else (offset, guess[0], guess[1])
    while offset < end:
        if flat_file.next_archived_offset(offset) != offset:
            # Never archived: the sink goes on after the hole (only a sink that holds gaps gets here).
            offset = min(flat_file.next_archived_offset(offset), end)
            await ahead.put(Skip(offset))
            continue
        count = min(request.batch_messages, end - offset, flat_file.archived_run_end(offset) - offset)
        batch = None
        if follows is not None and follows[0] == offset:
            batch = await _read_following(flat_file, offset, count, follows[1], follows[2], request, budget)
        if batch is None:
            if not 0 <= offset - units_at < len(units):
                units, units_at = await _read_units(flat_file, offset, count), offset
            within = offset - units_at
            batch = await _read_batch(flat_file, units[within : within + count], offset, request, budget)
        try:
            await ahead.put(batch)
        except BaseException:
            await budget.release(batch.held)
            raise
        offset += len(batch.records)
        follows = (offset, batch.commitlog_end, len(batch.records.data) / len(batch.records))
    await ahead.put(None)
