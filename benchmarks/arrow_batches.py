"""A Python data source that yields ready-made Arrow batches: what Spark can take in from any Python source.

The ``spark_scan`` benchmark runs it beside the ``tieredstore`` source with the same schema and the same
row count, so the ratio between the two is the share of Spark's Python-source ceiling our reading and
decoding leave. The rows are a sample batch decoded once by the driver and written to an Arrow IPC file;
each Python worker reads that file once and caches it (Spark reuses its workers across queries, and the
benchmark runs an untimed query first), then yields it again and again, sliced at the end of a partition.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

FORMAT_NAME = "arrow_batches"


def write_sample(batch: pa.RecordBatch, path: Path) -> None:
    """Keep ``batch`` as an Arrow IPC file for the workers to read."""
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, batch.schema) as writer:
        writer.write_batch(batch)


@functools.cache
def _sample(path: str) -> pa.RecordBatch:
    with pa.memory_map(path) as source:
        table = pa.ipc.open_file(source).read_all()
    batches = table.combine_chunks().to_batches()
    return batches[0]


class _Share(InputPartition):
    def __init__(self, rows: int) -> None:
        super().__init__(rows)
        self.rows = rows


class _Reader(DataSourceReader):
    def __init__(self, sample: str, rows: int, partitions: int) -> None:
        self.sample = sample
        self.rows = rows
        self.partitions_count = partitions

    def partitions(self) -> list[InputPartition]:
        share, extra = divmod(self.rows, self.partitions_count)
        return [_Share(share + (1 if index < extra else 0)) for index in range(self.partitions_count)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        sample = _sample(self.sample)
        left = int(getattr(partition, "rows", 0))
        while left > 0:
            batch = sample if left >= sample.num_rows else sample.slice(0, left)
            left -= batch.num_rows
            yield batch


class ArrowBatchesSource(DataSource):
    """``spark.read.format("arrow_batches").schema(...).option("sample", path).option("rows", n).load()``."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> StructType:
        raise ValueError("arrow_batches: give the schema with .schema(...)")

    def reader(self, schema: StructType) -> _Reader:
        options: dict[str, Any] = dict(self.options)
        return _Reader(str(options["sample"]), int(options["rows"]), int(options["partitions"]))
