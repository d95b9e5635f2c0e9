"""CPU per row of reading a Spark partition in one process: ``python -m benchmarks.spark_partition_cpu [messages]``.

The data is shaped as in ``spark_scan`` (1 KiB bodies, 16 queues, archived by the real Dispatcher) but kept
on a POSIX cold tier, and every partition is read by ``read_partition`` in this process, so nothing but our
reading and decoding is measured. CPU time (``time.process_time``) is reported beside wall time because it
holds steady while other processes share the cores. Beside it: the CPU per row of loading the same batches,
ready-made, from an Arrow IPC file (what the ``arrow_batches`` source of ``spark_scan`` does once per
worker), as the floor a Python source that does no decoding sits on. ``--s3`` archives to a moto server in
its own process instead, so the CPU of our S3 reads (requests, signing, responses) shows apart from the
server's.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from benchmarks.services import MotoServer
from benchmarks.suite.spark_scan import BODY_BYTES, QUEUES, spark_options
from benchmarks.workloads import TOPIC, archive, config_for, fill_hot_store
from tieredstore.scan.options import ScanOptions
from tieredstore.scan.planning import PartitionPlan, plan_partitions
from tieredstore.scan.reading import read_partition
from tieredstore.scan.schema import ARROW_SCHEMA


@dataclass(frozen=True, slots=True)
class Timing:
    cpu_seconds: float
    system_seconds: float  # the kernel's share of cpu_seconds: page faults of fresh buffers, file reads
    wall_seconds: float
    rows: int

    @property
    def cpu_us_per_row(self) -> float:
        return self.cpu_seconds / self.rows * 1e6

    @property
    def wall_us_per_row(self) -> float:
        return self.wall_seconds / self.rows * 1e6


class _Clock:
    """CPU, kernel CPU and wall time from now."""

    def __init__(self) -> None:
        self.cpu, self.system, self.wall = time.process_time(), os.times().system, time.perf_counter()

    def timing(self, rows: int) -> Timing:
        return Timing(
            time.process_time() - self.cpu, os.times().system - self.system, time.perf_counter() - self.wall, rows
        )


def read_all(plans: Sequence[PartitionPlan], options: ScanOptions, columns: Sequence[str]) -> Timing:
    """Every partition read in turn, each batch dropped once counted, as a Spark worker drops it once sent."""
    rows = 0
    started = _Clock()
    for plan in plans:
        rows += sum(batch.num_rows for batch in read_partition(plan, options, columns=columns))
    return started.timing(rows)


def write_batches(batches: Sequence[pa.RecordBatch], path: Path) -> None:
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, batches[0].schema) as writer:
        for batch in batches:
            writer.write_batch(batch)


def ready_made(path: Path) -> Timing:
    """The CPU of loading the batches of the Arrow IPC file ``path`` into memory one by one."""
    started = _Clock()
    rows = 0
    with pa.OSFile(str(path)) as source:
        reader = pa.ipc.open_file(source)
        for index in range(reader.num_record_batches):
            rows += reader.get_batch(index).num_rows
    return started.timing(rows)


def archived_topic(work_dir: Path, messages: int, *, keys: bool, s3: MotoServer | None = None) -> dict[str, str]:
    """Archive ``messages`` shaped as in ``spark_scan`` to a POSIX cold tier below ``work_dir`` (or to ``s3``);
    the source's options that read them."""
    hot = fill_hot_store(work_dir / "node", messages=messages, queues=QUEUES, body_bytes=BODY_BYTES, keys=keys)
    cold_url = None if s3 is None else f"s3://{s3.create_bucket('spark-partition-cpu')}/archive"
    config = config_for(hot.data_dir, queues=QUEUES, cold_url=cold_url, s3=s3)
    archive(config, with_index=False, expected=messages)
    if s3 is not None:
        return spark_options(config.effective_cold_url, config.effective_metadata_url, s3)
    return {"cold_url": config.effective_cold_url, "metadata_url": config.effective_metadata_url}


@contextmanager
def cold_tier(work_dir: Path, *, s3: bool) -> Iterator[MotoServer | None]:
    """A moto server for ``--s3``, stopped on exit; None for the POSIX tier."""
    with ExitStack() as stack:
        yield stack.enter_context(MotoServer(work_dir / "moto")) if s3 else None


class _Merge(argparse.Action):
    """Each ``--option NAME=VALUE`` added to one dict."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, {**getattr(namespace, self.dest), **values})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("messages", type=int, nargs="?", default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--keys", action="store_true", help="give every message a key (property KEYS)")
    parser.add_argument("--columns", default=",".join(ARROW_SCHEMA.names), help="comma-separated columns to build")
    parser.add_argument(
        "--option",
        type=lambda text: dict([text.split("=", 1)]),
        action=_Merge,
        default={},
        help="NAME=VALUE, a scan option",
    )
    parser.add_argument("--s3", action="store_true", help="archive to and read from a moto S3 server")
    parser.add_argument("--sort", default="tottime", help="the profile's order: tottime or cumulative")
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="print the N costliest functions")
    arguments = parser.parse_args()
    messages = arguments.messages
    columns = tuple(arguments.columns.split(","))
    with (
        tempfile.TemporaryDirectory(prefix="spark-partition-cpu-") as work,
        cold_tier(Path(work), s3=arguments.s3) as s3,
    ):
        work_dir = Path(work)
        reader_options = archived_topic(work_dir, messages, keys=arguments.keys, s3=s3)
        options = ScanOptions.parse({**reader_options, "path": TOPIC, **arguments.option})
        planning = _Clock()
        plans = plan_partitions(options)
        planned = planning.timing(messages)
        read_all(plans[:1], options, columns)  # imports and the worker's session, as a warm Spark worker has them
        batches = [batch for plan in plans for batch in read_partition(plan, options, columns=columns)]
        sample = work_dir / "batches.arrow"
        write_batches(batches, sample)
        del batches
        ours: list[Timing] = []
        floor: list[Timing] = []
        for _ in range(arguments.repeats):
            ours.append(read_all(plans, options, columns))
            if ours[-1].rows != messages:
                raise RuntimeError(f"read {ours[-1].rows} rows of {messages}")
            floor.append(ready_made(sample))
        if arguments.profile:
            profiler = cProfile.Profile()
            profiler.runcall(read_all, plans, options, columns)
            pstats.Stats(profiler).sort_stats(arguments.sort).print_stats(arguments.profile)
    print(f"{messages:,} messages in {len(plans)} partitions, columns: {', '.join(columns)}")
    print(
        f"planning (plan_partitions, once, on the driver): CPU µs/row {planned.cpu_us_per_row:.2f}, "
        f"wall µs/row {planned.wall_us_per_row:.2f}"
    )
    for label, timings in (("read_partition", ours), ("ready-made Arrow IPC batches", floor)):
        cpu = [timing.cpu_us_per_row for timing in timings]
        wall = [timing.wall_us_per_row for timing in timings]
        print(
            f"{label}: CPU µs/row median {statistics.median(cpu):.2f} (runs {', '.join(f'{v:.2f}' for v in cpu)}); "
            f"of it kernel µs/row {statistics.median(t.system_seconds / t.rows * 1e6 for t in timings):.2f}; "
            f"wall µs/row median {statistics.median(wall):.2f}"
        )


if __name__ == "__main__":
    main()
