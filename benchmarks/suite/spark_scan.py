"""Spark scan of an S3 archive (issues 8, 31): ``spark.read.format("tieredstore")`` on local[2] beside two baselines.

The data is archived once by the real Dispatcher (1 KiB messages over 16 queues) to a moto server in
its own process. Each "ours" round runs ``count(*)`` and ``sum(length(body))`` over the whole topic on
one ``local[2]`` SparkSession kept across rounds: the driver plans the partitions from the SQLite
metadata and two Python workers read and decode them into Arrow. The baseline is two processes, each
GETting half of the cold commit-log chunk objects in full with boto3: the same record bytes, the same
two cores, nothing decoded or checked. GET requests of both sides are counted from the moto server's
request log (ours includes the consume-queue reads of planning).

The second baseline is what Spark can take in from any Python data source: ``benchmarks.arrow_batches``
yields ready-made Arrow batches of the same 14-column schema (a sample batch our reader decoded before
the rounds), as many rows in as many partitions, with no reading and no decoding at all.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import psutil

from benchmarks.arrow_batches import ArrowBatchesSource, write_sample
from benchmarks.baselines import s3_client
from benchmarks.harness import BenchmarkContext, Contender, Measurement, Target, benchmark, stopwatch
from benchmarks.services import S3_CREDENTIALS, S3_REGION, MotoServer
from benchmarks.workloads import TOPIC, archive, config_for, fill_hot_store, per_thousand, request_counts
from tieredstore.scan.options import DEFAULT_MAX_PARTITION_BYTES, DEFAULT_READ_BLOCK_BYTES, ScanOptions
from tieredstore.scan.planning import plan_partitions
from tieredstore.scan.reading import read_partition
from tieredstore.spark.schema import spark_schema

QUEUES = 16
BODY_BYTES = 1024
# The issue asks for 1,000,000; on this 2-core machine a Spark round of that would take ~130 s (12-14 s
# measured per 100,000 rows under the usual background load), so the full run scans half.
ISSUE_MESSAGES = 1_000_000
FULL_MESSAGES = 500_000
QUICK_MESSAGES = 2_000
RAW_PROCESSES = 2
READY_TIMEOUT_S = 60.0


def _commit_log_objects(client: Any, bucket: str) -> list[tuple[str, int]]:
    """(key, size) of every cold commit-log chunk object, in key order."""
    objects = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for item in page.get("Contents", []):
            if "/COMMIT_LOG/" in item["Key"]:
                objects.append((item["Key"], int(item["Size"])))
    return sorted(objects)


def _raw_reader(
    client_options: dict[str, Any], bucket: str, keys: Sequence[str], ready: Event, start: Event, results: Connection
) -> None:
    """A baseline process: build a client and connect, wait for the start, GET ``keys`` in full, send the bytes."""
    client = s3_client(client_options, max_pool_connections=1)
    client.head_bucket(Bucket=bucket)  # connect before the clock starts, as Spark's JVM is up before its rounds
    ready.set()
    start.wait()
    received = sum(len(client.get_object(Bucket=bucket, Key=key)["Body"].read()) for key in keys)
    results.send(received)
    results.close()


def raw_parallel_get(
    client_options: dict[str, Any], bucket: str, keys: Sequence[str], *, processes: int, items: int
) -> Measurement:
    """GET every key in full from ``processes`` processes (key i in process i mod n); only the GETs are timed."""
    context = multiprocessing.get_context("spawn")  # no fork of a process that drives a JVM
    start = context.Event()
    workers = []
    for index in range(processes):
        ready = context.Event()
        receive, send = context.Pipe(duplex=False)
        process = context.Process(
            target=_raw_reader,
            args=(client_options, bucket, list(keys[index::processes]), ready, start, send),
            name=f"raw-get-{index}",
        )
        process.start()
        send.close()
        workers.append((process, ready, receive))
    try:
        for process, ready, _ in workers:
            if not ready.wait(READY_TIMEOUT_S):
                raise RuntimeError(f"baseline process {process.name} did not start within {READY_TIMEOUT_S} s")
        with stopwatch() as elapsed:
            start.set()
            received = sum(int(receive.recv()) for _, _, receive in workers)
        seconds = elapsed()
    finally:
        for process, _, receive in workers:
            receive.close()
            process.join(10)
            if process.is_alive():
                process.kill()
                process.join()
    return Measurement(seconds=seconds, items=items, bytes=received)


@contextmanager
def local_spark() -> Iterator[Any]:
    """A local[2] SparkSession with the tieredstore source registered; its JVM is shut down on exit."""
    from pyspark.sql import SparkSession

    from tieredstore.spark import register

    # Python workers must be this interpreter: the one with tieredstore, pyarrow and aiobotocore.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master("local[2]")
        .appName("tieredstore-benchmark")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    session.dataSource.register(ArrowBatchesSource)
    try:
        yield session
    finally:
        session.stop()
        _shut_down_gateway()


def _shut_down_gateway() -> None:
    """Stop the JVM the session started, so later benchmarks of the same run do not share the cores with it."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is None:
        return
    process = getattr(gateway, "proc", None)
    gateway.shutdown()
    if process is not None:
        process.stdin.close()  # the gateway JVM exits when its parent's pipe closes
        try:
            process.wait(10)
        except Exception:  # noqa: BLE001 - a JVM that will not exit is killed; nothing else to do
            process.kill()
    SparkContext._gateway = None
    SparkContext._jvm = None


def spark_options(cold_url: str, metadata_url: str, s3: MotoServer) -> dict[str, str]:
    """Reader options of the tieredstore source for an archive on ``s3``."""
    return {
        "cold_url": cold_url,
        "metadata_url": metadata_url,
        "endpoint_url": s3.endpoint_url,
        "region": S3_REGION,
        "addressing_style": "path",
        "access_key_id": S3_CREDENTIALS["aws_access_key_id"],
        "secret_access_key": S3_CREDENTIALS["aws_secret_access_key"],
    }


@benchmark(
    "spark_scan",
    title="Spark scan of an S3 archive vs ready-made Arrow batches and vs raw GETs from two processes",
    issue=8,
    summary=(
        f"`count(*)` and `sum(length(body))` over every archived message ({BODY_BYTES} B bodies, {QUEUES} queues, "
        "archived by the Dispatcher to a moto S3 server in its own process) with "
        '`spark.read.format("tieredstore")` on one `local[2]` SparkSession kept across rounds, beside a Python '
        "data source yielding ready-made Arrow batches of the same schema and row count (issue 31), and beside two "
        "processes GETting half of the cold commit-log chunk objects each with boto3; the same scan of a POSIX copy "
        "of the archive beside the ready-made batches too."
    ),
)
def spark_scan(ctx: BenchmarkContext) -> None:
    from pyspark.sql import functions as F

    messages = ctx.scale(full=FULL_MESSAGES, quick=QUICK_MESSAGES)
    queues = ctx.scale(full=QUEUES, quick=4)
    with MotoServer(ctx.work_dir / "moto") as s3:
        bucket = s3.create_bucket("spark-scan")
        hot = fill_hot_store(ctx.work_dir / "node", messages=messages, queues=queues, body_bytes=BODY_BYTES)
        cold_url = f"s3://{bucket}/archive"
        config = config_for(hot.data_dir, cold_url=cold_url, s3=s3, queues=queues)
        archive_seconds = archive(config, with_index=False, expected=messages)
        # The same messages archived to a local directory too: a scan of it shows what the reader costs with
        # no S3 server sharing the two cores.
        posix_config = config_for(
            hot.data_dir,
            cold_url=str(ctx.work_dir / "cold"),
            metadata_url=f"sqlite:///{ctx.work_dir / 'posix-metadata.db'}",
            queues=queues,
        )
        archive(posix_config, with_index=False, expected=messages)
        posix_options = {
            "cold_url": posix_config.effective_cold_url,
            "metadata_url": posix_config.effective_metadata_url,
        }
        client = s3_client(s3.client_options(), max_pool_connections=1)
        objects = _commit_log_objects(client, bucket)
        keys = [key for key, _ in objects]
        options = spark_options(cold_url, config.effective_metadata_url, s3)
        scan_options = ScanOptions.parse({**options, "path": TOPIC})
        plans = plan_partitions(scan_options)
        partitions = len(plans)
        sample_path = ctx.work_dir / "sample.arrow"
        batches = read_partition(plans[0], scan_options)
        try:
            write_sample(next(batches), sample_path)
        finally:
            batches.close()
        ready_made = {"sample": str(sample_path), "rows": str(messages), "partitions": str(partitions)}
        ctx.parameter(
            messages=messages,
            queues=queues,
            body_bytes=BODY_BYTES,
            record_mib=round(hot.record_bytes / (1 << 20), 1),
            commit_log_objects=len(objects),
            commit_log_object_mib=round(sum(size for _, size in objects) / len(objects) / (1 << 20), 2),
            archive_seconds=round(archive_seconds, 1),
            spark_master="local[2]",
            raw_processes=RAW_PROCESSES,
            spark_partitions=partitions,
            max_partition_mib=DEFAULT_MAX_PARTITION_BYTES >> 20,
            read_block_mib=DEFAULT_READ_BLOCK_BYTES >> 20,
        )
        with local_spark() as spark:
            # Start the Python workers and import tieredstore in them before any round: a filter on
            # queue_offset prunes the warm-up to a few records per queue.
            spark.read.format("tieredstore").options(**options).load(TOPIC).where("queue_offset < 4").count()
            # The same for the ready-made source, whose workers read and cache the sample batch here.
            spark.read.format("arrow_batches").schema(spark_schema()).options(**ready_made).load().count()
            spark.read.format("tieredstore").options(**posix_options).load(TOPIC).where("queue_offset < 4").count()

            def scan(reader_options: dict[str, str]) -> float:
                """Seconds of one whole-topic scan through the tieredstore source, its result checked."""
                with stopwatch() as elapsed:
                    frame = spark.read.format("tieredstore").options(**reader_options).load(TOPIC)
                    row = frame.agg(F.count("*").alias("rows"), F.sum(F.length("body")).alias("body_bytes")).first()
                seconds = elapsed()
                if row is None or row["rows"] != messages or row["body_bytes"] != messages * BODY_BYTES:
                    raise RuntimeError(f"Spark counted {row} for {messages} messages of {BODY_BYTES} B")
                return seconds

            server = psutil.Process(s3.pid)

            def server_cpu() -> float:
                """CPU seconds the moto server (and any child) has used: it shares the two cores with Spark."""
                times = server.cpu_times()
                return times.user + times.system + times.children_user + times.children_system

            def ours(_: Path) -> Measurement:
                before = request_counts(s3)
                cpu_before = server_cpu()
                seconds = scan(options)
                server_seconds = server_cpu() - cpu_before
                counts = request_counts(s3) - before
                return Measurement(
                    seconds=seconds,
                    items=messages,
                    bytes=hot.record_bytes,
                    extras={
                        "get_requests": float(counts.get),
                        "get_requests_per_4096_messages": per_thousand(counts.get, messages) * 4.096,
                        "list_requests": float(counts.list),
                        "s3_server_cpu_seconds": server_seconds,
                        "s3_server_share_of_two_cores": server_seconds / (2 * seconds),
                    },
                )

            def ours_posix(_: Path) -> Measurement:
                return Measurement(seconds=scan(posix_options), items=messages, bytes=hot.record_bytes)

            def raw(_: Path) -> Measurement:
                before = request_counts(s3)
                cpu_before = server_cpu()
                fetched = raw_parallel_get(s3.client_options(), bucket, keys, processes=RAW_PROCESSES, items=messages)
                server_seconds = server_cpu() - cpu_before
                counts = request_counts(s3) - before
                if fetched.bytes != sum(size for _, size in objects):
                    raise RuntimeError(f"the baseline received {fetched.bytes} bytes of {sum(s for _, s in objects)}")
                return Measurement(
                    seconds=fetched.seconds,
                    items=messages,
                    bytes=fetched.bytes,
                    extras={
                        "get_requests": float(counts.get),
                        "get_requests_per_4096_messages": per_thousand(counts.get, messages) * 4.096,
                        "s3_server_cpu_seconds": server_seconds,
                    },
                )

            def arrow_batches(_: Path) -> Measurement:
                with stopwatch() as elapsed:
                    frame = spark.read.format("arrow_batches").schema(spark_schema()).options(**ready_made).load()
                    row = frame.agg(F.count("*").alias("rows"), F.sum(F.length("body")).alias("body_bytes")).first()
                seconds = elapsed()
                if row is None or row["rows"] != messages:
                    raise RuntimeError(f"Spark counted {row} rows of ready-made batches for {messages}")
                return Measurement(seconds=seconds, items=messages, bytes=hot.record_bytes)

            ctx.compare(
                "full scan vs Spark's Python-source ceiling",
                description=(
                    f"{messages:,} messages, count(*) and sum(length(body)), beside a Python source yielding "
                    f"ready-made Arrow batches of the same schema in {partitions} partitions"
                ),
                baseline=Contender("Python data source yielding ready-made Arrow batches", arrow_batches),
                ours=Contender("Spark local[2], tieredstore source", ours),
                unit="row",
                target=Target.at_least(0.8, "≥ 0.8 of the ready-made batches"),
            )
            ctx.compare(
                "POSIX archive vs Spark's Python-source ceiling",
                description=(
                    f"the same {messages:,} messages archived to a local directory, scanned as above: no S3 server "
                    "shares the cores"
                ),
                baseline=Contender("Python data source yielding ready-made Arrow batches", arrow_batches),
                ours=Contender("Spark local[2], tieredstore source, POSIX cold tier", ours_posix),
                unit="row",
                target=Target.at_least(0.8, "≥ 0.8 of the ready-made batches"),
            )
            ctx.compare(
                "full scan",
                description=f"{messages:,} messages, count(*) and sum(length(body)) over the whole topic",
                baseline=Contender(f"raw get_object of every commit-log chunk, {RAW_PROCESSES} processes", raw),
                ours=Contender("Spark local[2], tieredstore source", ours),
                unit="row",
                target=Target.at_least(0.5, "≥ 0.5 (50% of raw GETs)"),
            )
    if messages < ISSUE_MESSAGES and not ctx.quick:
        ctx.note(
            f"Scaled down from the issue's {ISSUE_MESSAGES:,} messages to {messages:,}: a Spark round of the full "
            "million would take over 90 s on this 2-core machine. The comparison is of rows per second; ours also "
            "carries a fixed cost per scan (planning, job start-up) that a larger scan spreads thinner."
        )
    ctx.note(
        "Ours' time covers load(), planning on the driver (metadata from SQLite, consume-queue unit reads from S3) "
        "and the job; its GET count includes planning's reads. The SparkSession (JVM and Python workers) is started "
        "once before the first round and reused."
    )
