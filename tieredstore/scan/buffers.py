"""Arrow string and binary columns built from byte ranges of one buffer, with no Python object per row.

An Arrow string column is one data buffer and one offsets buffer. The ranges (a body, a property value)
are copied end to end into a new data buffer, in the cheapest way their shape allows: one gather of
fixed-size items when every range has the same length (bodies of one producer often do), one index
gather when they are short, and one join of buffer slices when they are long and uneven.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa

Int64Array = npt.NDArray[np.int64]
ByteArray = npt.NDArray[np.uint8]

# Below this many bytes a range on average, a byte index per copied byte costs less than a slice per range.
_SHORT_RANGE = 64
_MAX_ARROW_OFFSET = (1 << 31) - 1


def gather_ranges(data: ByteArray, starts: Int64Array, lengths: Int64Array) -> tuple[ByteArray, Int64Array]:
    """The bytes ``data[starts[i]:starts[i] + lengths[i]]`` end to end, and the offsets of each in them."""
    count = len(starts)
    offsets = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    if total == 0:
        return np.zeros(0, dtype=np.uint8), offsets
    first = int(lengths[0])
    if first > 0 and bool((lengths == first).all()) and data.flags.c_contiguous:
        # Each range as one fixed-size item: a fancy index then copies a whole range at a time.
        items = np.ndarray((len(data) - first + 1,), dtype=np.dtype((np.void, first)), buffer=data, strides=(1,))
        return items[starts].view(np.uint8), offsets
    if total <= _SHORT_RANGE * count:
        index = np.repeat(starts - offsets[:-1], lengths) + np.arange(total, dtype=np.int64)
        gathered: ByteArray = data[index]
        return gathered, offsets
    view = memoryview(data.data)
    ranges = zip(starts.tolist(), lengths.tolist(), strict=True)
    joined = b"".join([view[start : start + length] for start, length in ranges])
    return np.frombuffer(joined, dtype=np.uint8), offsets


def string_array(
    data: ByteArray,
    offsets: Int64Array,
    *,
    valid: npt.NDArray[np.bool_] | None = None,
    arrow_type: pa.DataType | None = None,
) -> pa.Array:
    """A string (or ``arrow_type``: binary) column over ``data`` cut at ``offsets``; null where not ``valid``."""
    count = len(offsets) - 1
    if int(offsets[-1]) > _MAX_ARROW_OFFSET:
        raise OverflowError(f"{offsets[-1]} bytes in one column of a batch: lower the batch_rows option")
    validity = None
    null_count = 0
    if valid is not None:
        null_count = count - int(np.count_nonzero(valid))
        if null_count:
            validity = pa.py_buffer(np.packbits(valid, bitorder="little"))
    buffers = [validity, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)]
    return pa.Array.from_buffers(arrow_type or pa.string(), count, buffers, null_count=null_count)


def repeated_string(value: str, count: int) -> pa.Array:
    """A string column holding ``value`` ``count`` times."""
    encoded = np.frombuffer(value.encode(), dtype=np.uint8)
    offsets = np.arange(count + 1, dtype=np.int64) * len(encoded)
    return string_array(np.tile(encoded, count), offsets)
