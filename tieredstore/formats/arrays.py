"""The store formats as numpy sees them: consume-queue units and record heads, for whole batches at once.

The archiver's hot batch read, the cold append, the read-ahead window check and the restore writer
all read the same fixed-position fields of many records at a time. They share these layouts and the
one way to pick a fixed-width row out of a buffer at each of many positions, so a field can move in
one place only.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import sliding_window_view

from tieredstore.formats.consume_queue import UNIT_SIZE
from tieredstore.formats.message import HEADER_PREFIX, POS_BORN_HOST

# A consume-queue unit as stored: commit-log offset, size, tag hash (big-endian, packed).
UNIT_DTYPE = np.dtype([("commitlog_offset", ">i8"), ("size", ">i4"), ("tag_hash", ">i8")])
assert UNIT_DTYPE.itemsize == UNIT_SIZE

# A record's fixed 48-byte head, TOTALSIZE through BORNTIMESTAMP (``HEADER_PREFIX``).
_HEAD_FIELDS: list[tuple[str, str]] = [
    ("total_size", ">i4"),
    ("magic", ">u4"),
    ("body_crc", ">i4"),
    ("queue_id", ">i4"),
    ("flag", ">i4"),
    ("queue_offset", ">i8"),
    ("physical_offset", ">i8"),
    ("sysflag", ">i4"),
    ("born_timestamp", ">i8"),
]
RECORD_HEAD_DTYPE = np.dtype(_HEAD_FIELDS)
assert RECORD_HEAD_DTYPE.itemsize == HEADER_PREFIX.size == POS_BORN_HOST

# The head of a record with IPv4 born and store hosts (the writer's own layout), through BODYLEN.
IPV4_RECORD_HEAD_DTYPE = np.dtype(
    [
        *_HEAD_FIELDS,
        ("born_host", "V8"),
        ("store_timestamp", ">i8"),
        ("store_host", "V8"),
        ("reconsume_times", ">i4"),
        ("prepared_offset", ">i8"),
        ("body_len", ">i4"),
    ]
)
assert IPV4_RECORD_HEAD_DTYPE.itemsize == POS_BORN_HOST + 8 + 8 + 8 + 4 + 8 + 4

# From the end of the fixed head to BODYLEN, less the two hosts: STORETIMESTAMP, RECONSUMETIMES, PREPAREDTXOFFSET.
BODY_LEN_AFTER_HOSTS = HEADER_PREFIX.size + 8 + 4 + 8


def head_dtype_with_hosts(host_bytes: int) -> np.dtype[Any]:
    """The fixed head followed by ``host_bytes`` raw bytes (hosts and what follows them, layout unknown yet)."""
    return np.dtype([*_HEAD_FIELDS, ("hosts", "u1", (host_bytes,))])


def _windows(flat: npt.NDArray[np.uint8], width: int) -> npt.NDArray[np.uint8]:
    """Every ``width``-byte window of ``flat`` (``sliding_window_view``, read-only): a strided view over its
    buffer, built by the array constructor when ``flat`` is contiguous, which costs a few microseconds where
    ``sliding_window_view``'s checks cost tens (a window check gathers ten sets of rows)."""
    if not flat.flags.c_contiguous:
        return sliding_window_view(flat, width)
    view: npt.NDArray[np.uint8] = np.ndarray((len(flat) - width + 1, width), np.uint8, flat, 0, (1, 1))
    view.flags.writeable = False
    return view


def gather_rows(flat: npt.NDArray[np.uint8], positions: npt.NDArray[np.int64], width: int) -> npt.NDArray[np.uint8]:
    """``width`` bytes of ``flat`` from each position, as a (len(positions), width) array.

    When every row lies inside ``flat`` the rows come from a sliding-window view: one index per row
    rather than one per byte, which is what makes this cheap. Otherwise each byte index is clipped into
    ``flat`` (zeros when it is empty): a row running past the end keeps its leading bytes, the rest is
    garbage the caller must already have marked bad by a size or length check.
    """
    count = len(positions)
    if len(flat) >= width and (not count or (int(positions.min()) >= 0 and int(positions.max()) + width <= len(flat))):
        rows: npt.NDArray[np.uint8] = _windows(flat, width)[positions]
        return rows
    if not len(flat):
        return np.zeros((count, width), dtype=np.uint8)
    index = positions[:, None] + np.arange(width, dtype=np.int64)
    np.clip(index, 0, len(flat) - 1, out=index)
    clipped: npt.NDArray[np.uint8] = flat[index]
    return clipped


def as_values(rows: npt.NDArray[np.uint8], dtype: npt.DTypeLike) -> npt.NDArray[Any]:
    """Rows of bytes read as one (big-endian) value or structured record each."""
    return np.ascontiguousarray(rows).view(dtype).reshape(len(rows))


def gather(flat: npt.NDArray[np.uint8], positions: npt.NDArray[np.int64], dtype: npt.DTypeLike) -> npt.NDArray[Any]:
    """The ``dtype`` value at each position of ``flat`` (out-of-range positions as ``gather_rows`` says)."""
    return as_values(gather_rows(flat, positions, np.dtype(dtype).itemsize), dtype)
