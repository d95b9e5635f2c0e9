"""The batch record engine: where the fields of a run of records lie, worked out for all records at once.

A run is records at known starts in one buffer (back to back in a commit-log read, or gathered from a
hot store). Every reader that checks or decodes many records (the archiver's batch read, the cold
window check, restore, Spark, the checkers) starts from the same fixed heads and the same length walk,
so the record layout is read in one place; a record that fails is explained by the per-record decoder
in ``formats.message``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from tieredstore.formats.arrays import as_values, gather_rows, head_dtype_with_hosts
from tieredstore.formats.message import (
    MAGIC_V2,
    MIN_RECORD_SIZE,
    POS_BORN_HOST,
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_STOREHOST_V6,
)

Int64Array = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

# The fixed head of a record, through STORETIMESTAMP behind an IPv6 born host (76 bytes; every record is longer).
HEAD_BYTES = POS_BORN_HOST + 20 + 8
HEAD_DTYPE = head_dtype_with_hosts(HEAD_BYTES - POS_BORN_HOST)
assert HEAD_DTYPE.itemsize == HEAD_BYTES


class RecordRun(Protocol):
    """Records in one buffer: ``data``, where each starts (``starts``), its size (``sizes``) and its fixed
    head (``heads``, HEAD_DTYPE; garbage past a record shorter than HEAD_BYTES: check sizes first)."""

    @property
    def data(self) -> bytes | bytearray: ...

    @property
    def starts(self) -> Int64Array: ...

    @property
    def sizes(self) -> Int64Array: ...

    @property
    def heads(self) -> np.ndarray: ...


def gather_heads(data: bytes | bytearray, starts: Int64Array) -> np.ndarray:
    """The fixed heads (HEAD_DTYPE) of the records at ``starts`` of ``data``, one gather for all."""
    return as_values(gather_rows(np.frombuffer(data, dtype=np.uint8), starts, HEAD_BYTES), HEAD_DTYPE)


def store_timestamps_of(heads: np.ndarray) -> Int64Array:
    """Each record's STORETIMESTAMP, which follows a born host of 8 or 20 bytes."""
    hosts = heads["hosts"]
    v6 = (heads["sysflag"] & SYSFLAG_BORNHOST_V6) != 0
    ipv4_stamp = as_values(hosts[:, 8:16], ">i8")
    ipv6_stamp = as_values(hosts[:, 20:28], ">i8")
    return np.where(v6, ipv6_stamp, ipv4_stamp).astype(np.int64)


@dataclass(frozen=True, slots=True)
class Layout:
    """Where the variable parts of each record of a batch are, from its length fields, all records at once.

    Offsets are from each record's start. ``sound`` says the fields add up: BODYLEN, the topic length
    and the properties length each fit, and the properties end exactly where the record ends.
    """

    body_at: Int64Array
    body_length: Int64Array
    topic_at: Int64Array
    topic_length: Int64Array
    properties_at: Int64Array
    properties_length: Int64Array
    sound: BoolArray

    @classmethod
    def of(cls, batch: RecordRun) -> Layout:
        heads = batch.heads
        sizes = batch.sizes
        starts = batch.starts
        flat = np.frombuffer(batch.data, dtype=np.uint8)
        v2 = heads["magic"] == MAGIC_V2
        sysflag = heads["sysflag"]
        born = np.where((sysflag & SYSFLAG_BORNHOST_V6) != 0, 20, 8)
        stored = np.where((sysflag & SYSFLAG_STOREHOST_V6) != 0, 20, 8)
        body_length_at = POS_BORN_HOST + born + 8 + stored + 12
        sound = (sizes >= MIN_RECORD_SIZE) & (body_length_at + 4 <= sizes)
        body_length = as_values(gather_rows(flat, starts + body_length_at, 4), ">i4").astype(np.int64)
        body_at = body_length_at + 4
        sound &= (body_length >= 0) & (body_at + body_length <= sizes)
        topic_length_at = body_at + body_length
        topic_field = np.where(v2, 2, 1)
        sound &= topic_length_at + topic_field <= sizes
        length_bytes = gather_rows(flat, starts + topic_length_at, 2)
        topic_length = np.where(
            v2, as_values(length_bytes, ">i2").astype(np.int64), length_bytes[:, 0].view(np.int8).astype(np.int64)
        )
        topic_at = topic_length_at + topic_field
        sound &= (topic_length >= 0) & (topic_at + topic_length + 2 <= sizes)
        properties_at = topic_at + topic_length + 2
        properties_length = as_values(gather_rows(flat, starts + properties_at - 2, 2), ">i2").astype(np.int64)
        sound &= (properties_length >= 0) & (properties_at + properties_length == sizes)
        return cls(body_at, body_length, topic_at, topic_length, properties_at, properties_length, sound)
