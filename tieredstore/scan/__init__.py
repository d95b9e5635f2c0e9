"""Scanning archived queues into Arrow batches, without pyspark: the engine under the Spark source.

    options = ScanOptions.from_config(config, ["orders"])
    for batch in scan_queue(options, "orders", 0, start=1000, end=2000):
        ...

``plan_partitions`` and ``read_partition`` are the two halves Spark drives (planning on the driver,
reading in tasks); ``scan_queue`` runs both for one queue's range. Every batch has columns of
``ARROW_SCHEMA``. ``tieredstore.spark`` adds only what needs pyspark.
"""

from tieredstore.scan.filters import ScanFilter
from tieredstore.scan.options import OnCorrupt, ScanOptions, TableMode
from tieredstore.scan.planning import PartitionPlan, plan_partitions, plan_scan
from tieredstore.scan.queue_range import scan_queue
from tieredstore.scan.reading import ReadStats, read_partition
from tieredstore.scan.schema import ARROW_SCHEMA, COLUMNS

__all__ = [
    "ARROW_SCHEMA",
    "COLUMNS",
    "OnCorrupt",
    "PartitionPlan",
    "ReadStats",
    "ScanFilter",
    "ScanOptions",
    "TableMode",
    "plan_partitions",
    "plan_scan",
    "read_partition",
    "scan_queue",
]
