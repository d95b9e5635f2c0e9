"""One queue's offset range as Arrow batches, in offset order: what the table sync reads.

It is the Spark source's scan narrowed to one queue: the planner cuts [start, end) into partitions
(one per commit-log segment, split to ``max_partition_bytes``) and each is read in turn, in this
thread, so rows come out in queue-offset order. Offsets the hot store lost before archiving (consume-
queue holes) have no record, so they yield no row, as in Spark.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

import pyarrow as pa

from tieredstore.errors import ValidationError
from tieredstore.formats.naming import validate_topic
from tieredstore.scan.filters import ScanFilter
from tieredstore.scan.options import ScanOptions
from tieredstore.scan.planning import plan_partitions
from tieredstore.scan.reading import read_partition
from tieredstore.scan.schema import ARROW_SCHEMA


def scan_queue(
    options: ScanOptions,
    topic: str,
    queue_id: int,
    start: int,
    end: int,
    columns: Sequence[str] = tuple(ARROW_SCHEMA.names),
) -> Iterator[pa.RecordBatch]:
    """Batches of ``columns`` of the archived records of ``topic``/``queue_id`` at offsets [start, end).

    Offsets outside what is archived yield nothing. ``options.topics`` is ignored: ``topic`` is scanned.
    """
    validate_topic(topic)
    if queue_id < 0 or start < 0 or end < start:
        raise ValidationError(f"cannot scan queue {queue_id} over offsets [{start}, {end})")
    unknown = [name for name in columns if name not in ARROW_SCHEMA.names]
    if unknown or not columns:
        raise ValidationError(f"scan columns {list(columns)} must be some of {ARROW_SCHEMA.names}")
    # Checked here, not in the generator, so a bad call fails where it is made rather than at first use.
    return _batches(dataclasses.replace(options, topics=(topic,)), topic, queue_id, start, end, columns)


def _batches(
    options: ScanOptions, topic: str, queue_id: int, start: int, end: int, columns: Sequence[str]
) -> Iterator[pa.RecordBatch]:
    if start == end:
        return
    scan_filter = ScanFilter(
        topics=frozenset({topic}), queue_ids=frozenset({queue_id}), queue_offset_start=start, queue_offset_end=end
    )
    # Partitions of one queue never overlap, so their starts order them; the planner sorts by path first.
    for plan in sorted(plan_partitions(options, scan_filter), key=lambda plan: plan.queue_start):
        yield from read_partition(plan, options, columns=columns)
