"""What a follower checks and copies out of the writer's files: each record against its unit, runs of them at once.

A record the writer published is trusted only once it checks out against the unit that points at it
(``record_problem``), and it is checked again as it is copied out, since the writer's recovery may
rewrite what a follower checked before.
"""

from __future__ import annotations

import time

import numpy as np
import structlog

from tieredstore.errors import CorruptRecordError, NotFoundError
from tieredstore.formats.consume_queue import ConsumeQueueUnit
from tieredstore.formats.message import store_timestamp_of
from tieredstore.formats.records import Expected, Fault, describe, explain
from tieredstore.local.batch import (
    HotBatch,
    SharedWindow,
    build,
    copy_records,
    followed_problems,
    located_prefix,
    parse_units,
    units_from,
)
from tieredstore.local.checkpoint import FlushedBound
from tieredstore.local.followed_files import FollowedLog, FollowedQueue
from tieredstore.local.reading import TIMESTAMP_PREFIX, StoredMessage

log = structlog.get_logger(__name__)

# ``record_problem``'s words for what the batch record engine finds wrong with a record.
_FOLLOWED_WORDING = {
    Fault.SIZE: "{found} bytes where the unit says {expected}",
    Fault.MAGIC: "magic 0x{found:08x}",
    Fault.TOTAL_SIZE: "TOTALSIZE {found} where the unit says {expected}",
    **dict.fromkeys(
        (Fault.QUEUE_ID, Fault.QUEUE_OFFSET, Fault.PHYSICAL_OFFSET),
        "record of queue {queue_id} offset {queue_offset} at {physical_offset}, "
        "expected queue {expected_queue_id} offset {expected_queue_offset} at {expected_physical_offset}",
    ),
    Fault.UNTERMINATED: "properties do not end in 0x02 (not fully written)",
    Fault.TAG_HASH: "unit tag hash {expected} where the record's TAGS give {found}",
    Fault.BODY_CRC: "body CRC {expected} where the record says {found}",
}


def record_problem(
    raw: bytes, unit: tuple[int, int, int], topic_raw: bytes, queue_id: int, queue_offset: int
) -> str | None:
    """Why ``raw`` is not yet the whole record ``unit`` points at for this queue offset; None when it is."""
    commitlog_offset, size, tag = unit
    rule = Expected(
        topic=topic_raw,
        queue_id=queue_id,
        queue_offsets=queue_offset,
        physical_offsets=np.array([commitlog_offset], dtype=np.int64),
        tag_hashes=np.array([tag], dtype=np.int64),
        terminated=True,
    )
    findings = explain(raw, rule, size=size)
    return describe(findings, _FOLLOWED_WORDING, rule) if findings else None


def grow_checked(log_: FollowedLog, queue: FollowedQueue, release_every: int) -> None:
    """Extend the queue over every new unit whose record checks out; stop at the first that does not.

    Checking reads each record through the mapping. Every ``release_every`` bytes of commit log a check
    moves through (a queue first followed, or long unread), the pages behind it are unmapped again:
    a new follower would otherwise hold the whole hot store in its RSS from its first look.
    """
    retried = False
    checked_from: int | None = None  # where in the commit log this call's checks started
    while True:
        offset = queue.max_offset
        unit = queue.raw_unit(offset)
        if unit is None:
            if queue.map_next_file():
                continue
            return
        if unit[1] == 0:
            # The end for now. A file the writer's recovery replaced is mapped again by the
            # queue's next refresh, so an idle queue costs no system call here.
            return
        if unit[0] < log_.min_offset and offset == queue.min_offset:
            # Retention deleted the record after this follower last looked: it is below the min now.
            queue.min_offset = queue.max_offset = offset + 1
            continue
        raw = log_.read(unit[0], unit[1])
        if raw is None or record_problem(raw, unit, queue.topic_raw, queue.queue_id, offset) is not None:
            if not retried and (raw is None or log_.holder_replaced(unit[0])):
                retried = True
                log_.refresh()
                continue
            return
        queue.max_offset = offset + 1
        retried = False
        if checked_from is None:
            checked_from = unit[0]
        elif unit[0] - checked_from >= release_every:
            log_.release_range(checked_from, unit[0])
            checked_from = unit[0]


def read_checked_messages(
    log_: FollowedLog, queue: FollowedQueue, queue_offset: int, max_count: int, max_bytes: int
) -> list[StoredMessage]:
    """The follower's ``read_messages`` from a queue offset at or above the queue's min offset (under its lock)."""
    topic, queue_id = queue.topic, queue.queue_id
    messages: list[StoredMessage] = []
    total = 0
    for offset in range(queue_offset, min(queue.max_offset, queue_offset + max_count)):
        unit = queue.raw_unit(offset)
        raw = log_.read(unit[0], unit[1]) if unit is not None else None
        if unit is None or raw is None:
            if messages:
                break
            _relist_deleted(log_, queue)
            raise NotFoundError(f"offset {offset} of {topic}/{queue_id} was just deleted by retention")
        if messages and total + unit[1] > max_bytes:
            break
        problem = record_problem(raw, unit, queue.topic_raw, queue_id, offset)
        if problem is not None:
            raise CorruptRecordError(
                f"hot record of {topic}/{queue_id} offset {offset} changed after it was checked: {problem}",
                location="commitlog",
                offset=unit[0],
            )
        messages.append(StoredMessage(offset, raw, ConsumeQueueUnit(*unit)))
        total += unit[1]
    return messages


def read_checked_batch(
    log_: FollowedLog,
    queue: FollowedQueue,
    queue_offset: int,
    max_count: int,
    max_bytes: int,
    *,
    unmap: bool,
    window: SharedWindow | None = None,
) -> HotBatch:
    """The follower's ``read_batch`` from a queue offset at or above the queue's min offset (under its lock)."""
    topic, queue_id = queue.topic, queue.queue_id
    count = min(max_count, queue.max_offset - queue_offset)
    if count <= 0:
        return HotBatch.empty(topic, queue_id, queue_offset)
    units = parse_units(units_from(queue.files, queue_offset, count), max_bytes)
    held, which, local = located_prefix(log_.files, units)
    if held == 0:
        _relist_deleted(log_, queue)
        raise NotFoundError(f"offset {queue_offset} of {topic}/{queue_id} was just deleted by retention")
    units = units[:held]
    batch = build(
        topic,
        queue_id,
        queue_offset,
        units,
        copy_records(
            log_.files,
            which,
            local,
            units["size"].astype(np.int64),
            # A follower's mapping is read-only: every page it maps is on disk already.
            unmap_below=log_.files[-1].end_offset if unmap else None,
            window=window,
        ),
    )
    bad = followed_problems(batch, queue.topic_raw)
    if bad is not None:
        unit = tuple(int(field) for field in batch.units[bad].tolist())
        problem = record_problem(
            batch.record(bad), (unit[0], unit[1], unit[2]), queue.topic_raw, queue_id, queue_offset + bad
        )
        raise CorruptRecordError(
            f"hot record of {topic}/{queue_id} offset {queue_offset + bad} changed after it was checked: "
            f"{problem or 'it fails the batch check'}",
            location="commitlog",
            offset=unit[0],
        )
    return batch


def _relist_deleted(log_: FollowedLog, queue: FollowedQueue) -> None:
    """Retention took the file: relist now, so min_offset says so to the next caller."""
    log_.refresh()
    queue.refresh(log_.min_offset, time.monotonic())


def covers(flushed: FlushedBound, log_: FollowedLog, queue: FollowedQueue, queue_offset: int) -> bool:
    """Whether ``flushed`` covers the message at a checked queue offset: by where its record ends, else
    by its store timestamp (a RocketMQ broker's checkpoint), read from the record's header only."""
    unit = queue.raw_unit(queue_offset)
    if unit is None:
        return False
    if unit[0] + unit[1] <= flushed.offset:
        return True
    if flushed.stored_until <= 0:
        return False
    head = log_.read(unit[0], min(unit[1], TIMESTAMP_PREFIX))
    return head is not None and store_timestamp_of(head) <= flushed.stored_until


def log_flushed_source(checkpoint: str, flushed: FlushedBound) -> None:
    """Say where the durable bound comes from: else an archiver that takes nothing from a store that never
    flushed would not say why."""
    if not flushed.known:
        log.info(
            "the hot store's checkpoint says nothing is flushed yet; nothing is archived until its writer flushes",
            checkpoint=checkpoint,
            source=flushed.source,
        )
    elif flushed.source == "rocketmq":
        log.info(
            "following a RocketMQ broker's checkpoint: archiving records stored before its flush time",
            checkpoint=checkpoint,
            stored_until=flushed.stored_until,
            confirmed_offset=flushed.offset,
        )
    else:
        log.info("following the writer's checkpoint", checkpoint=checkpoint, confirmed_offset=flushed.offset)
