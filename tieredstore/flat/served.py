"""The record check of a cold read window: every record of a window checked once, all at once.

``check_window`` splits a commit-log read by its consume-queue units (or by units made from the records
themselves) and checks every record of it: size, magic, lengths, body CRC, topic, queue id and queue
offset, all records at once through the batch record engine (``formats.records``). A record that fails
keeps its ``CorruptRecordError`` naming its topic, queue and offset, raised to whoever asks for that
offset. ``verify_served`` is the same rule for one record (hot records are checked by it as they are
served), worded from the engine's findings; the batch pass only picks the records it must judge, so both
give the same errors.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from tieredstore.errors import CorruptRecordError
from tieredstore.formats.arrays import UNIT_DTYPE
from tieredstore.formats.consume_queue import UNIT_SIZE, ConsumeQueueUnit, iter_units
from tieredstore.formats.message import MessageRecord, decode
from tieredstore.formats.records import Expected, Fault, PackedRun, accepts, describe, explain, problem_indexes

Tier = Literal["hot", "cold"]


@dataclass(eq=False, slots=True, weakref_slot=True)
class ReadAheadBatch:
    """One read-ahead window: the commit-log bytes as read, each record's place in them, checked once.

    The record at queue offset ``first_offset + i`` is ``data[starts[i]:ends[i]]``, with consume-queue tag
    hash ``tag_hashes[i]`` (None for a window split without its consume queue: a filter then looks at
    each record's tags); ``data`` begins at commit-log offset ``commitlog_start``. Every record was
    checked when the window was read (``check_window``); ``corrupt`` holds the typed error of each one
    that failed, raised to whoever asks for that offset. Serving the others is slicing only.
    """

    topic: str
    queue_id: int
    first_offset: int
    data: bytes = field(repr=False)
    starts: list[int] = field(repr=False)
    ends: list[int] = field(repr=False)
    tag_hashes: list[int] | None = field(repr=False)
    commitlog_start: int = 0
    corrupt: dict[int, CorruptRecordError] = field(default_factory=dict, repr=False)
    passes: int = field(default=0, repr=False)  # how many times a reader has been served its last record

    @property
    def end_offset(self) -> int:
        return self.first_offset + len(self.starts)

    def __len__(self) -> int:
        return len(self.starts)

    def raw(self, queue_offset: int) -> bytes:
        index = queue_offset - self.first_offset
        return self.data[self.starts[index] : self.ends[index]]

    def unit(self, queue_offset: int) -> ConsumeQueueUnit:
        """The consume-queue unit that pointed at the record (for messages about it)."""
        index = queue_offset - self.first_offset
        start = self.starts[index]
        tag_hash = 0 if self.tag_hashes is None else self.tag_hashes[index]
        return ConsumeQueueUnit(self.commitlog_start + start, self.ends[index] - start, tag_hash)

    def raise_if_corrupt(self, begin: int, end: int) -> None:
        """The CorruptRecordError of the first corrupt record in [begin, end), if there is one."""
        if self.corrupt:
            bad = [offset for offset in self.corrupt if begin <= offset < end]
            if bad:
                raise self.corrupt[min(bad)].with_traceback(None)


def parse_units(raw: bytes, location: str, position: int) -> np.ndarray:
    """Consume-queue bytes as a structured array (``UNIT_DTYPE``), with ``iter_units``' checks and errors."""
    if len(raw) % UNIT_SIZE:
        raise CorruptRecordError(
            f"consume queue returned {len(raw)} bytes, not whole units", location=location, offset=position
        )
    units = np.frombuffer(raw, dtype=UNIT_DTYPE)
    if len(units) and (units["commitlog_offset"].min() < 0 or units["size"].min() < 0):
        list(iter_units(raw))  # raises the CorruptRecordError naming the first bad unit
    return units


def check_window(
    topic: str,
    queue_id: int,
    first_offset: int,
    data: bytes,
    commitlog_start: int,
    units: np.ndarray,
    *,
    tag_hashes_known: bool = True,
    bodies: bool = True,
) -> ReadAheadBatch:
    """Split a commit-log read by its consume-queue units and check every record once (see ``verify_served``).

    The batch record engine flags each record that fails ``verify_served``'s rule;
    ``verify_served`` then judges each flagged record, so the errors (and which records are corrupt) are
    exactly what checking record by record gives. Units made from the records themselves carry no tag
    hash (``tag_hashes_known=False``). Without ``bodies`` only each record's place and head are checked
    (whole, its TOTALSIZE, queue id and queue offset): for a reader that checks every record in full itself
    (a restore's sinks), which would otherwise pay for the bodies twice.
    """
    begins = units["commitlog_offset"].astype(np.int64) - commitlog_start
    ends = begins + units["size"].astype(np.int64)
    tag_hashes = units["tag_hash"].tolist() if tag_hashes_known else None
    batch = ReadAheadBatch(
        topic, queue_id, first_offset, data, begins.tolist(), ends.tolist(), tag_hashes, commitlog_start
    )
    suspects = _suspect_records(topic_bytes(topic), queue_id, first_offset, data, begins, ends - begins, bodies)
    for index in suspects.tolist():
        queue_offset = first_offset + index
        raw = data[batch.starts[index] : batch.ends[index]]
        try:
            verify_served(topic, queue_id, queue_offset, raw, batch.unit(queue_offset), "cold")
        except CorruptRecordError as error:
            batch.corrupt[queue_offset] = error
    return batch


# ``check_window`` without the bodies, for readers that check every record in full themselves.
located_window = functools.partial(check_window, bodies=False)


def _suspect_records(
    topic_raw: bytes,
    queue_id: int,
    first_offset: int,
    data: bytes,
    begins: np.ndarray,
    sizes: np.ndarray,
    bodies: bool = True,
) -> np.ndarray:
    """Indexes of the records ``verify_served`` refuses: the batch record engine with the served rule (or, without
    ``bodies``, the part of it a record's place and head decide)."""
    if bodies:
        rule = Expected(topic=topic_raw, queue_id=queue_id, queue_offsets=first_offset)
    else:
        rule = Expected(queue_id=queue_id, queue_offsets=first_offset, check_crc=False, head_only=True)
    return problem_indexes(PackedRun.at(data, begins, sizes), rule)


# ``verify_served``'s words for what the batch record engine finds wrong with a record.
_SERVED_WORDING = {
    **dict.fromkeys((Fault.SIZE, Fault.SHORT), "the consume queue says {expected} bytes but {found} were read"),
    Fault.TOTAL_SIZE: "TOTALSIZE {found} but the consume queue says {expected}",
    Fault.LAYOUT: "{reason} at offset 0",
    **dict.fromkeys(
        (Fault.QUEUE_ID, Fault.QUEUE_OFFSET, Fault.TOPIC),
        "the record belongs to {topic}/{queue_id} at queue offset {queue_offset}",
    ),
}


def verify_served(topic: str, queue_id: int, queue_offset: int, raw: bytes, unit: ConsumeQueueUnit, tier: Tier) -> None:
    """Check one record split out of a read without decoding it: size, magic, body CRC and identity.

    Any problem is a CorruptRecordError naming the topic, queue and queue offset.
    """
    rule = Expected(topic=topic_bytes(topic), queue_id=queue_id, queue_offsets=queue_offset)
    if accepts(raw, rule, size=unit.size):
        return
    findings = explain(raw, rule, size=unit.size)
    if findings:
        raise CorruptRecordError(
            f"corrupt record in the {tier} tier (commit-log offset {unit.commitlog_offset}): "
            f"{describe(findings, _SERVED_WORDING, rule)}",
            location=f"{topic}/{queue_id}",
            offset=queue_offset,
        )


@functools.lru_cache(maxsize=4096)
def topic_bytes(topic: str) -> bytes:
    return topic.encode("utf-8")


def check_record(
    topic: str, queue_id: int, queue_offset: int, raw: bytes, unit: ConsumeQueueUnit, tier: Tier
) -> MessageRecord:
    """``verify_served``, then the decoded record. Any problem is a CorruptRecordError naming where."""
    verify_served(topic, queue_id, queue_offset, raw, unit, tier)
    try:
        return decode(raw, check_crc=False)
    except CorruptRecordError as exc:
        raise CorruptRecordError(
            f"corrupt record in the {tier} tier (commit-log offset {unit.commitlog_offset}): {exc}",
            location=f"{topic}/{queue_id}",
            offset=queue_offset,
        ) from exc
