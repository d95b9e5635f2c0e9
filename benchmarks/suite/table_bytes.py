"""Parquet bytes of a topic's Iceberg table (issue 34) beside the records' bytes in the cold commit log.

Three workloads, each archived by the real Dispatcher to a POSIX cold tier (uncompressed, the default,
so the commit log holds the records as the hot store wrote them): ``archive_s3``'s 1 KiB random bodies
over 16 queues (16 distinct bodies in turn, so every message of a queue carries the same body: a
column encoder finds the repeats), the same with every body new random bytes (nothing compresses) and
the demo's JSON messages (``tieredstore run --demo``'s producer: compressible text). The baseline side
archives and counts the commit-log bytes the cold tier holds; ours archives the same and syncs the table
as ``tieredstore table sync`` does, counting its current snapshot's Parquet data files (zstd, the
table's codec). Metadata files (JSON, Avro manifests) are extras, not part of the ratio.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from benchmarks.baselines import tree_bytes
from benchmarks.cold_codecs import fill_demo_hot_store, stored_in_directory
from benchmarks.harness import BenchmarkContext, Contender, Measurement, Metric, Target, benchmark
from benchmarks.tables import data_files, fresh_namespace, sync_tables
from benchmarks.workloads import TOPIC, HotData, archive, config_for, fill_hot_store, node_dir_over
from tieredstore.cli.run import DEMO_TOPICS
from tieredstore.table.catalog import TABLES_FOLDER

FULL_MESSAGES = 100_000
QUICK_MESSAGES = 1_000
QUEUES = 16
BODY_BYTES = 1024
TARGET = Target.at_most(1.1, "≤ 1.1x the commit log's bytes")


def _sides(hot: HotData, topics: tuple[str, ...]) -> tuple[Contender, Contender]:
    def commit_log(directory: Path) -> Measurement:
        config = config_for(node_dir_over(hot, directory), queues=hot.queues)
        seconds = archive(config, with_index=False, expected=hot.messages)
        stored = stored_in_directory(Path(config.effective_cold_url))
        return Measurement(seconds=seconds, items=hot.messages, bytes=stored.commit_log)

    def table(directory: Path) -> Measurement:
        config = config_for(node_dir_over(hot, directory), queues=hot.queues, table=fresh_namespace())
        archive(config, with_index=False, expected=hot.messages)
        synced = sync_tables(config, expected=hot.messages, topics=topics)
        files = [file for topic in topics for file in data_files(config, topic)]
        parquet = sum(file.size for file in files)
        everything = tree_bytes([Path(config.effective_cold_url) / TABLES_FOLDER])
        return Measurement(
            seconds=synced.seconds,
            items=hot.messages,
            bytes=parquet,
            extras={
                "data_files": float(len(files)),
                "metadata_bytes": float(everything - parquet),
                "sync_commits": float(synced.commits),
            },
        )

    return (
        Contender("cold commit log, uncompressed", commit_log),
        Contender("Iceberg table's Parquet data files (zstd)", table),
    )


@benchmark(
    "table_bytes",
    title="Iceberg table's Parquet bytes vs the records' bytes in the cold commit log",
    issue=34,
    summary=(
        f"Each workload archived by the real `Dispatcher.run_once` to a POSIX cold tier (uncompressed, SQLite "
        f"metadata), then its table synced as `tieredstore table sync` does (SQLite catalog, table under the cold "
        f"URL): the bytes of the current snapshot's Parquet data files beside the commit-log bytes the cold tier "
        f"holds for the same messages. Workloads: `archive_s3`'s {BODY_BYTES} B random bodies over {QUEUES} queues "
        f"(16 distinct bodies in turn: each queue's body repeats), the same with every body unique (incompressible), "
        f"and the demo's JSON messages."
    ),
)
def table_bytes(ctx: BenchmarkContext) -> None:
    messages = ctx.scale(full=FULL_MESSAGES, quick=QUICK_MESSAGES)
    demo_topics = tuple(topic for topic, _ in DEMO_TOPICS)
    workloads: list[tuple[str, str, Callable[[Path], HotData], tuple[str, ...]]] = [
        (
            "archive_s3's messages",
            f"{QUEUES} queues, 16 distinct random bodies in turn",
            lambda d: fill_hot_store(d, messages=messages, queues=QUEUES, body_bytes=BODY_BYTES),
            (TOPIC,),
        ),
        (
            "unique random bodies",
            f"{QUEUES} queues, every body new random bytes: incompressible",
            lambda d: fill_hot_store(d, messages=messages, queues=QUEUES, body_bytes=BODY_BYTES, unique_bodies=True),
            (TOPIC,),
        ),
        (
            "demo JSON messages",
            f"the demo's messages, {sum(count for _, count in DEMO_TOPICS)} queues over two topics",
            lambda d: fill_demo_hot_store(d, messages=messages),
            demo_topics,
        ),
    ]
    if ctx.quick:
        # The smoke keeps one workload: each costs an archive and a table sync per round.
        workloads = workloads[1:2]
    record_mib: dict[str, float] = {}
    for number, (name, what, fill, topics) in enumerate(workloads):
        hot = fill(ctx.work_dir / f"source-{number}")
        record_mib[name] = round(hot.record_bytes / (1 << 20), 1)
        baseline, ours = _sides(hot, topics)
        ctx.compare(
            f"Parquet vs commit log, {name}",
            description=f"{messages:,} messages: {what}",
            baseline=baseline,
            ours=ours,
            unit="msg",
            metric=Metric.STORED_BYTES,
            target=TARGET,
        )
    ctx.parameter(
        messages=messages,
        record_mib=record_mib,
        cold_tier="POSIX, uncompressed",
        catalog="SQLite (pyiceberg SQL catalog in the metadata database)",
        parquet_codec="zstd (the table's write.parquet.compression-codec)",
    )
    ctx.note(
        "Each side's seconds are its own work (the archive's `run_once`, the table's `sync_topic`) and are not the "
        "comparison: the ratio is of bytes. A table's Parquet files hold every column of the Spark source, the "
        "decoded properties included; the commit log holds the records as written, headers and all."
    )
