"""The archived rows of one queue's offset range as Arrow batches, through the scan machinery Spark uses."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from tieredstore.config import TieredStoreConfig
from tieredstore.runtime import provider_options
from tieredstore.spark.filters import ScanFilter
from tieredstore.spark.options import ScanOptions
from tieredstore.spark.planning import plan_partitions
from tieredstore.spark.reading import read_partition


def scan_options(config: TieredStoreConfig, topic: str) -> ScanOptions:
    """A scan of ``topic`` as ``config`` reaches it: metadata, cold URL, S3 settings and keyring."""
    return ScanOptions(
        topics=(topic,),
        cold_url=config.effective_cold_url,
        metadata_url=config.effective_metadata_url,
        cluster=config.cluster,
        broker=config.broker,
        provider_options=provider_options(config),
        keyring=config.encryption,
    )


def queue_rows(options: ScanOptions, topic: str, queue_id: int, start: int, end: int) -> Iterator[pa.RecordBatch]:
    """Rows of queue offsets [start, end) in offset order; offsets lost before archiving give no rows."""
    scan_filter = ScanFilter(
        topics=frozenset({topic}), queue_ids=frozenset({queue_id}), queue_offset_start=start, queue_offset_end=end
    )
    for plan in plan_partitions(options, scan_filter):
        yield from read_partition(plan, options)
