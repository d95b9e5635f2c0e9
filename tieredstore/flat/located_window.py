"""Windows for a reader that checks every record itself: each record located and proved to be the queue's
message at its offset, its body left to that reader's own check."""

from __future__ import annotations

import numpy as np

from tieredstore.errors import CorruptRecordError
from tieredstore.flat.served import ReadAheadBatch, verify_served
from tieredstore.formats.arrays import RECORD_HEAD_DTYPE, gather
from tieredstore.formats.message import MIN_RECORD_SIZE


def located_window(
    topic: str,
    queue_id: int,
    first_offset: int,
    data: bytes,
    commitlog_start: int,
    units: np.ndarray,
    *,
    tag_hashes_known: bool = True,
) -> ReadAheadBatch:
    """``check_window`` without the body: each record must lie whole in ``data`` with its TOTALSIZE, queue
    id and queue offset; one that does not is judged by ``verify_served``, as ``check_window`` judges it.

    For a reader that checks every record in full anyway (a restore's sinks): checking the bodies here
    too would double the cost of the read for nothing.
    """
    begins = units["commitlog_offset"].astype(np.int64) - commitlog_start
    sizes = units["size"].astype(np.int64)
    ends = begins + sizes
    tag_hashes = units["tag_hash"].tolist() if tag_hashes_known else None
    batch = ReadAheadBatch(
        topic, queue_id, first_offset, data, begins.tolist(), ends.tolist(), tag_hashes, commitlog_start
    )
    located = (begins >= 0) & (sizes >= MIN_RECORD_SIZE) & (ends <= len(data))
    if located.all():
        heads = gather(np.frombuffer(data, dtype=np.uint8), begins, RECORD_HEAD_DTYPE)
        located &= heads["total_size"] == sizes
        located &= heads["queue_id"] == queue_id
        located &= heads["queue_offset"] == np.arange(first_offset, first_offset + len(sizes), dtype=np.int64)
    else:
        located[:] = False  # rare (a damaged consume queue): each record is judged on its own
    for index in np.flatnonzero(~located).tolist():
        queue_offset = first_offset + index
        try:
            verify_served(topic, queue_id, queue_offset, batch.raw(queue_offset), batch.unit(queue_offset), "cold")
        except CorruptRecordError as error:
            batch.corrupt[queue_offset] = error
    return batch
