"""What reading a hot store means, whoever reads it: the writer's store and a follower share these helpers."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import NamedTuple, Protocol, TypeVar

from tieredstore.basics import Boundary as Boundary  # re-exported: the hot tier's readers take it from here
from tieredstore.basics import check_queue_id
from tieredstore.errors import CorruptRecordError, NotFoundError, ValidationError
from tieredstore.formats.consume_queue import ConsumeQueueUnit
from tieredstore.formats.message import MAGIC_V1, MAGIC_V2, POS_BORN_HOST, HostAddress, MessageRecord, decode
from tieredstore.formats.naming import validate_topic

# TOTALSIZE and MAGICCODE: what tells a record from zeros or a blank at an offset.
RECORD_HEAD = struct.Struct(">iI")
# Enough of a record to reach STORETIMESTAMP behind an IPv6 born host.
TIMESTAMP_PREFIX = POS_BORN_HOST + 20 + 8
_OFFSET = struct.Struct(">q")


class QueueRange(Protocol):
    """A queue's offsets in the hot store: [min_offset, max_offset)."""

    min_offset: int
    max_offset: int


_Queue = TypeVar("_Queue", bound=QueueRange)


class StoredMessage(NamedTuple):
    """One message as the archiver moves it: its queue offset, the record bytes and its consume-queue unit."""

    queue_offset: int
    raw: bytes
    unit: ConsumeQueueUnit


class UnitReads:
    """The reads a hot store answers from a queue's unit and its record, the same for the writer and a follower:
    each reader supplies ``cq_unit``, ``read_record`` and ``_store_timestamp_of`` its own way."""

    def cq_unit(self, topic: str, queue_id: int, queue_offset: int) -> ConsumeQueueUnit:
        raise NotImplementedError

    def read_record(self, unit: ConsumeQueueUnit) -> bytes:
        raise NotImplementedError

    def _store_timestamp_of(self, unit: ConsumeQueueUnit) -> int:
        raise NotImplementedError

    def get_message(self, topic: str, queue_id: int, queue_offset: int) -> MessageRecord:
        """The decoded message at a checked ``queue_offset`` (body CRC checked)."""
        unit = self.cq_unit(topic, queue_id, queue_offset)
        return decode_unit_record(self.read_record(unit), unit)

    def store_timestamp(self, topic: str, queue_id: int, queue_offset: int) -> int:
        return self._store_timestamp_of(self.cq_unit(topic, queue_id, queue_offset))


def check_unit_record(raw: bytes, unit: ConsumeQueueUnit) -> bytes:
    """``raw`` if it is a whole record of the unit's size (size and magic agree); CorruptRecordError otherwise."""
    size, magic = RECORD_HEAD.unpack_from(raw) if len(raw) >= RECORD_HEAD.size else (0, 0)
    if size != unit.size or magic not in (MAGIC_V1, MAGIC_V2):
        raise CorruptRecordError(
            f"consume-queue unit says {unit.size} bytes but the record header says {size} (magic 0x{magic:08x})",
            location="commitlog",
            offset=unit.commitlog_offset,
        )
    return raw


def check_boundary(boundary: str) -> None:
    if boundary not in ("lower", "upper"):
        raise ValidationError(f"boundary must be 'lower' or 'upper', not {boundary!r}")


def search_timestamp(
    min_offset: int, max_offset: int, timestamp: int, boundary: Boundary, stamp_at: Callable[[int], int]
) -> int:
    """Binary search of non-decreasing store timestamps over [min_offset, max_offset).

    ``lower``: the first offset stored at or after ``timestamp`` (max_offset if none); ``upper``: the last
    offset stored at or before it (min_offset if none).
    """
    check_boundary(boundary)
    low, high = min_offset, max_offset
    while low < high:
        middle = (low + high) // 2
        stamp = stamp_at(middle)
        if stamp < timestamp or (boundary == "upper" and stamp == timestamp):
            low = middle + 1
        else:
            high = middle
    return low if boundary == "lower" else max(min_offset, low - 1)


def decode_unit_record(raw: bytes, unit: ConsumeQueueUnit) -> MessageRecord:
    """The message of the record a unit points at (body CRC checked), errors naming where it lies."""
    return decode(raw, location=f"commitlog@{unit.commitlog_offset}")


def found_record(raw: bytes | None, commitlog_offset: int) -> bytes:
    """``raw``, the record found at ``commitlog_offset``; NotFoundError when none was (None)."""
    if raw is None:
        raise NotFoundError(f"no record starts at hot commit-log offset {commitlog_offset}")
    return raw


def offset_msg_id(store_host: HostAddress, commitlog_offset: int) -> str:
    """RocketMQ's offset message id of a record the store on ``store_host`` wrote."""
    return (store_host.encode() + _OFFSET.pack(commitlog_offset)).hex().upper()


def validate_queue(topic: str, queue_id: int) -> None:
    """Raise the error a (topic, queue id) to read deserves, if any."""
    validate_topic(topic)
    check_queue_id(queue_id)


def check_not_below(topic: str, queue_id: int, queue_offset: int, min_offset: int) -> None:
    """NotFoundError when ``queue_offset`` lies below the queue's first offset still in the hot store."""
    if queue_offset < min_offset:
        raise NotFoundError(
            f"offset {queue_offset} of {topic}/{queue_id} is below the hot store's min offset {min_offset}"
        )


def timestamp_offset(
    queue: _Queue | None, timestamp: int, boundary: Boundary, stamp_at: Callable[[_Queue, int], int]
) -> int:
    """``search_timestamp`` over the queue's offsets, ``stamp_at(queue, offset)`` giving each store timestamp;
    0 for a queue never written (None)."""
    if queue is None:
        return 0
    return search_timestamp(
        queue.min_offset, queue.max_offset, timestamp, boundary, lambda offset: stamp_at(queue, offset)
    )
