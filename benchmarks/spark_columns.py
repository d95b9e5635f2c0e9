"""What each column of the ``tieredstore`` Spark source costs: ``python -m benchmarks.spark_columns [messages]``.

The data is shaped as in ``spark_scan`` (1 KiB bodies, 16 queues, archived by the real Dispatcher) but
kept on a POSIX cold tier, so neither S3 nor moto takes a share of the two cores. Two measurements:

1. In this process, ``read_partition`` over every partition: the time spent building each column
   (every column builder of ``tieredstore.scan.columns`` is timed), and the read rate with all columns.
2. On a ``local[2]`` SparkSession, ``count(*)`` with the full schema, with each column dropped through
   ``.schema(...)``, and with one column only: the rows per second of each, best of ``--rounds`` rounds
   that each run every schema once.

It prints a Markdown table for BENCHMARKS.md. This is a measurement, not a benchmark with a baseline:
the harness's ``spark_scan`` is the comparison.
"""

from __future__ import annotations

import argparse
import functools
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql.types import StructType

from benchmarks.spark_partition_cpu import archived_topic
from benchmarks.suite.spark_scan import local_spark
from benchmarks.workloads import TOPIC
from tieredstore.scan import columns as column_module
from tieredstore.scan.options import ScanOptions
from tieredstore.scan.planning import plan_partitions
from tieredstore.scan.reading import read_partition
from tieredstore.scan.schema import ARROW_SCHEMA
from tieredstore.spark.schema import spark_schema


def _timed_builders(spent: dict[str, float]) -> None:
    """Wrap each column builder so that the seconds it takes add up in ``spent``."""

    def timed(name: str, build: Callable[[Any], pa.Array]) -> Callable[[Any], pa.Array]:
        @functools.wraps(build)
        def run(columns: Any) -> pa.Array:
            started = time.perf_counter()
            try:
                return build(columns)
            finally:
                spent[name] += time.perf_counter() - started

        return run

    for name, build in list(column_module._BUILDERS.items()):
        column_module._BUILDERS[name] = timed(name, build)


def in_process(options: ScanOptions, messages: int) -> tuple[float, dict[str, float]]:
    """Rows per second of ``read_partition`` over every partition, and the seconds each column took."""
    spent: dict[str, float] = defaultdict(float)
    original = dict(column_module._BUILDERS)
    _timed_builders(spent)
    try:
        started = time.perf_counter()
        rows = sum(batch.num_rows for plan in plan_partitions(options) for batch in read_partition(plan, options))
        seconds = time.perf_counter() - started
    finally:
        column_module._BUILDERS.update(original)
    if rows != messages:
        raise RuntimeError(f"read {rows} rows of {messages}")
    return messages / seconds, dict(spent)


def spark_rates(options: dict[str, str], messages: int, rounds: int) -> dict[str, float]:
    """Rows per second of count(*) on local[2] for each schema: all, all but one column, one column."""
    full = spark_schema()
    schemas: dict[str, StructType] = {"all 14 columns": full}
    for name in ARROW_SCHEMA.names:
        schemas[f"without {name}"] = StructType([field for field in full.fields if field.name != name])
    schemas["queue_offset only"] = StructType([full["queue_offset"]])
    rates: dict[str, float] = defaultdict(float)
    with local_spark() as spark:
        spark.read.format("tieredstore").options(**options).load(TOPIC).where("queue_offset < 4").count()
        # Every schema once per round, so that load from elsewhere drifting over the run spreads evenly.
        for _ in range(rounds):
            for label, schema in schemas.items():
                started = time.perf_counter()
                counted = spark.read.format("tieredstore").schema(schema).options(**options).load(TOPIC).count()
                seconds = time.perf_counter() - started
                if counted != messages:
                    raise RuntimeError(f"{label}: counted {counted} of {messages}")
                rates[label] = max(rates[label], messages / seconds)
    return dict(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("messages", type=int, nargs="?", default=200_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--keys", action="store_true", help="give every message a key (property KEYS)")
    parser.add_argument("--no-spark", action="store_true", help="the in-process measurement only")
    arguments = parser.parse_args()
    messages = arguments.messages
    with tempfile.TemporaryDirectory(prefix="spark-columns-") as work:
        reader_options = archived_topic(Path(work), messages, keys=arguments.keys)
        rate, spent = in_process(ScanOptions.parse({**reader_options, "path": TOPIC}), messages)
        rates = {} if arguments.no_spark else spark_rates(reader_options, messages, arguments.rounds)
    print(f"In one process: {rate:,.0f} rows/s over {messages:,} messages with every column built.\n")
    print("| column | build time, µs per row | Spark count(*) without it, rows/s |")
    print("|---|---|---|")
    for name in ARROW_SCHEMA.names:
        print(f"| {name} | {spent.get(name, 0.0) / messages * 1e6:.3f} | {rates.get(f'without {name}', 0):,.0f} |")
    print(f"| (all 14 columns) | {sum(spent.values()) / messages * 1e6:.3f} | {rates.get('all 14 columns', 0):,.0f} |")
    print(f"| (queue_offset only) | | {rates.get('queue_offset only', 0):,.0f} |")


if __name__ == "__main__":
    main()
