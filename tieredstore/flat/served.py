"""The record check of a cold read window: every record of a window checked once, all at once.

``check_window`` splits a commit-log read by its consume-queue units (or by units made from the records
themselves) and checks every record of it: size, magic, lengths, body CRC, topic, queue id and queue
offset, all records at once with numpy, one ``crc32`` per body. A record that fails keeps its
``CorruptRecordError`` naming its topic, queue and offset, raised to whoever asks for that offset.
``verify_served`` is the same check of one record (hot records are checked by it as they are served);
the vectorised pass only picks the records it must judge, so both give the same errors.
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from tieredstore.errors import CorruptRecordError
from tieredstore.formats.arrays import BODY_LEN_AFTER_HOSTS, RECORD_HEAD_DTYPE, UNIT_DTYPE, as_values, gather_rows
from tieredstore.formats.checksum import BODY_CRC_MASK, body_crc, crc32
from tieredstore.formats.consume_queue import UNIT_SIZE, ConsumeQueueUnit, iter_units
from tieredstore.formats.message import (
    MAGIC_V1,
    MAGIC_V2,
    MIN_RECORD_SIZE,
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_STOREHOST_V6,
    MessageRecord,
    decode,
    verify_record,
)

Tier = Literal["hot", "cold"]
_HEAD = struct.Struct(">iI")


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
) -> ReadAheadBatch:
    """Split a commit-log read by its consume-queue units and check every record once (see ``verify_served``).

    A vectorised pass over the window flags each record that may fail any of ``verify_served``'s checks;
    ``verify_served`` then judges each flagged record, so the errors (and which records are corrupt) are
    exactly what checking record by record gives. Units made from the records themselves carry no tag
    hash (``tag_hashes_known=False``).
    """
    begins = units["commitlog_offset"].astype(np.int64) - commitlog_start
    ends = begins + units["size"].astype(np.int64)
    tag_hashes = units["tag_hash"].tolist() if tag_hashes_known else None
    batch = ReadAheadBatch(
        topic, queue_id, first_offset, data, begins.tolist(), ends.tolist(), tag_hashes, commitlog_start
    )
    for index in _suspect_records(topic_bytes(topic), queue_id, first_offset, data, begins, ends - begins).tolist():
        queue_offset = first_offset + index
        raw = data[batch.starts[index] : batch.ends[index]]
        try:
            verify_served(topic, queue_id, queue_offset, raw, batch.unit(queue_offset), "cold")
        except CorruptRecordError as error:
            batch.corrupt[queue_offset] = error
    return batch


def _suspect_records(
    topic_raw: bytes, queue_id: int, first_offset: int, data: bytes, begins: np.ndarray, sizes: np.ndarray
) -> np.ndarray:
    """Indexes of the records that may fail ``verify_served``: never fewer than do (it may flag more).

    Each check of ``verify_served``/``verify_record`` is made for all records at once on their fixed
    fields and on the length fields they locate; the body CRC is one ``crc32`` per record.
    """
    count = len(begins)
    length = len(data)
    ok = (begins >= 0) & (sizes >= MIN_RECORD_SIZE) & (begins + sizes <= length)
    if not ok.any():
        return np.arange(count)
    buffer = np.frombuffer(data, dtype=np.uint8)
    base = np.where(ok, begins, 0)

    def gather(at: np.ndarray | int, width: int) -> np.ndarray:
        """``width`` bytes at ``base + at`` of each record, as a (count, width) array (clipped to the data)."""
        return gather_rows(buffer, base + at, width)

    head = as_values(gather(0, RECORD_HEAD_DTYPE.itemsize), RECORD_HEAD_DTYPE)
    magic = head["magic"]
    ok &= (magic == MAGIC_V1) | (magic == MAGIC_V2)
    ok &= head["total_size"] == sizes
    ok &= head["queue_id"] == queue_id
    ok &= head["queue_offset"] == np.arange(first_offset, first_offset + count, dtype=np.int64)
    sysflag = head["sysflag"]
    body_len_at = (
        BODY_LEN_AFTER_HOSTS
        + np.where(sysflag & SYSFLAG_BORNHOST_V6, 20, 8)
        + np.where(sysflag & SYSFLAG_STOREHOST_V6, 20, 8)
    )
    ok &= body_len_at + 4 <= sizes
    body_len = gather(body_len_at, 4).view(">i4")[:, 0].astype(np.int64)
    body_at = body_len_at + 4
    ok &= (body_len >= 0) & (body_at + body_len <= sizes)
    body_len = np.where(ok, body_len, 0)
    topic_len_at = body_at + body_len
    v2 = magic == MAGIC_V2
    topic_len_width = np.where(v2, 2, 1)
    ok &= topic_len_at + topic_len_width <= sizes
    pair = gather(topic_len_at, 2)
    topic_len = np.where(v2, pair.view(">i2")[:, 0], pair[:, 0].view(np.int8))
    topic_at = topic_len_at + topic_len_width
    # The topic must be ours (so its length is too), and PROPLEN(2) must follow it inside the record.
    ok &= (topic_len == len(topic_raw)) & (topic_at + len(topic_raw) + 2 <= sizes)
    ok &= (gather(topic_at, len(topic_raw)) == np.frombuffer(topic_raw, dtype=np.uint8)).all(axis=1)
    properties_len_at = topic_at + len(topic_raw)
    properties_len = gather(properties_len_at, 2).view(">i2")[:, 0]
    ok &= (properties_len >= 0) & (properties_len_at + 2 + properties_len == sizes)
    checked = np.flatnonzero(ok)
    body_starts = (base + body_at)[checked]
    view = memoryview(data)
    # The mask is applied to all at once: per body, the loop does the slice and the C call only.
    computed = [
        crc32(view[start:stop])
        for start, stop in zip(body_starts.tolist(), (body_starts + body_len[checked]).tolist(), strict=True)
    ]
    ok[checked] = head["body_crc"][checked] == np.array(computed, dtype=np.int64) & BODY_CRC_MASK
    return np.flatnonzero(~ok)


def verify_served(topic: str, queue_id: int, queue_offset: int, raw: bytes, unit: ConsumeQueueUnit, tier: Tier) -> None:
    """Check one record split out of a read without decoding it: size, magic, body CRC and identity.

    Any problem is a CorruptRecordError naming the topic, queue and queue offset.
    """

    def corrupt(reason: str) -> CorruptRecordError:
        return CorruptRecordError(
            f"corrupt record in the {tier} tier (commit-log offset {unit.commitlog_offset}): {reason}",
            location=f"{topic}/{queue_id}",
            offset=queue_offset,
        )

    if len(raw) != unit.size or len(raw) < MIN_RECORD_SIZE:
        raise corrupt(f"the consume queue says {unit.size} bytes but {len(raw)} were read")
    total, magic = _HEAD.unpack_from(raw)
    if magic not in (MAGIC_V1, MAGIC_V2):
        raise corrupt(f"bad magic code 0x{magic:08x}")
    if total != unit.size:
        raise corrupt(f"TOTALSIZE {total} but the consume queue says {unit.size}")
    try:
        fields = verify_record(raw, check_crc=False)
    except CorruptRecordError as exc:
        raise corrupt(str(exc)) from exc
    computed = body_crc(memoryview(raw)[fields.body_at : fields.body_at + fields.body_len])
    if computed != fields.body_crc:
        raise corrupt(f"body CRC mismatch: stored {fields.body_crc}, computed {computed}")
    topic_raw = raw[fields.topic_at : fields.topic_at + fields.topic_len]
    if fields.queue_id != queue_id or fields.queue_offset != queue_offset or topic_raw != topic_bytes(topic):
        owner = topic_raw.decode("utf-8", errors="replace")
        raise corrupt(f"the record belongs to {owner}/{fields.queue_id} at queue offset {fields.queue_offset}")


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
