"""Reading one table partition in a task: a Parquet file's row groups with pyarrow, only the columns asked for,
every row checked against its queue's range and the pushed filters.

The file is opened through pyiceberg's pyarrow FileIO, with the S3 settings the read's options carry (they
travel with the reader, never in a partition); one FileIO per set of settings is kept for the process, as
a Python worker reads partition after partition. Batches come out in ``ARROW_SCHEMA``'s types, which is
what Spark checks them against.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq

from tieredstore.scan.options import ScanOptions
from tieredstore.scan.schema import ARROW_SCHEMA
from tieredstore.table.read_plan import QueueRange, TableFilePlan, io_properties

if TYPE_CHECKING:
    from pyiceberg.io import FileIO

# The columns each row is checked by, read whether asked for or not.
_CHECKED = ("queue_id", "queue_offset", "store_timestamp")


@functools.lru_cache(maxsize=4)
def _file_io(properties: tuple[tuple[str, str], ...]) -> FileIO:
    from pyiceberg.io.pyarrow import PyArrowFileIO

    return PyArrowFileIO(dict(properties))


class QueueBounds:
    """Each queue's offset range as two arrays indexed by queue id, to check a batch's rows at once."""

    def __init__(self, ranges: Sequence[QueueRange]) -> None:
        size = max((queue_id for queue_id, _, _ in ranges), default=-1) + 1
        self.starts = np.zeros(size, dtype=np.int64)
        self.ends = np.zeros(size, dtype=np.int64)  # start == end: nothing of a queue not listed
        for queue_id, start, end in ranges:
            self.starts[queue_id], self.ends[queue_id] = start, end

    def matches(self, queue_ids: npt.NDArray[np.int64], offsets: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        known = (queue_ids >= 0) & (queue_ids < len(self.starts))
        index = np.where(known, queue_ids, 0)
        if not len(self.starts):
            return np.zeros(len(offsets), dtype=np.bool_)
        matches: npt.NDArray[np.bool_] = known & (offsets >= self.starts[index]) & (offsets < self.ends[index])
        return matches


def read_table_file(
    plan: TableFilePlan, options: ScanOptions, columns: Sequence[str] = tuple(ARROW_SCHEMA.names)
) -> Iterator[pa.RecordBatch]:
    """Batches of ``columns`` of the rows of ``plan``'s file (or its row groups) that its ranges and filter keep."""
    io = _file_io(tuple(sorted(io_properties(options).items())))
    target = pa.schema([ARROW_SCHEMA.field(name) for name in columns])
    read = list(dict.fromkeys([*columns, *_CHECKED]))
    bounds = QueueBounds(plan.queue_ranges)
    with io.new_input(plan.path).open(seekable=True) as stream:
        parquet = pq.ParquetFile(stream)
        first, end = plan.row_groups if plan.row_groups is not None else (0, parquet.num_row_groups)
        if first >= end:
            return
        for batch in parquet.iter_batches(batch_size=options.batch_rows, row_groups=range(first, end), columns=read):
            queue_ids = batch.column("queue_id").to_numpy(zero_copy_only=False).astype(np.int64)
            offsets = batch.column("queue_offset").to_numpy(zero_copy_only=False).astype(np.int64)
            micros = batch.column("store_timestamp").cast(pa.int64()).to_numpy(zero_copy_only=False)
            keep = bounds.matches(queue_ids, offsets) & plan.scan_filter.matches_rows(offsets, micros // 1000)
            if not keep.any():
                continue
            rows = batch.select(list(columns)) if keep.all() else batch.filter(pa.array(keep)).select(list(columns))
            yield rows.cast(target)
