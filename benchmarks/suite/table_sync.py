"""``table sync`` on S3 (issue 34) beside ``archive_s3``'s archiver on the same messages, in the same run.

One moto server in its own process holds both. The baseline is ``archive_s3``'s own side: the real
Dispatcher's ``run_once`` (key index on, SQLite metadata) archiving the filled hot store into a fresh
bucket. Ours syncs the Iceberg table of an archive of the same hot store, made once before the rounds
in its own bucket: ``TableSyncer.sync_topic`` (what ``tieredstore table sync`` runs) reading the
archive back from S3 through ``tieredstore.scan`` and writing day-partitioned zstd Parquet under the
cold URL on the same server, with pyiceberg's SQL catalog in the same SQLite database. Each round syncs
a new table (its own namespace) from the first archived offsets, a backfill, whose objects are deleted
afterwards. Both rates count messages; "keeps up" means the table is filled at least as fast as the
archive is.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from benchmarks.baselines import s3_client
from benchmarks.harness import BenchmarkContext, Contender, Measurement, Target, benchmark
from benchmarks.services import MotoServer
from benchmarks.suite.archive_s3 import S3Sides
from benchmarks.tables import delete_table_objects, fresh_namespace, sync_tables
from benchmarks.workloads import (
    TOPIC,
    HotData,
    archive,
    config_for,
    fill_hot_store,
    node_dir_over,
    per_thousand,
    request_counts,
)

QUEUES = 16
BODY_BYTES = 1024
# archive_s3 archives 1,000,000; a table sync of that many 1 KiB messages writes ~1 GiB of Parquet into the
# moto server's memory per round, so this pair runs at a quarter (each side's rate is per message).
FULL_MESSAGES = 250_000
QUICK_MESSAGES = 800
ARCHIVE_PREFIX = "archive"
TARGET = Target.at_least(1.0, "≥ 1.0 (keeps up with the archiver)")


def _table_side(s3: MotoServer, hot: HotData, directory: Path) -> Contender:
    """Archive ``hot`` once into its own bucket; the side that syncs a fresh table of that archive each round."""
    bucket = s3.create_bucket(f"table-sync-{directory.name}")
    archived = config_for(
        node_dir_over(hot, directory), cold_url=f"s3://{bucket}/{ARCHIVE_PREFIX}", s3=s3, queues=hot.queues
    )
    archive(archived, with_index=True, expected=hot.messages)
    client = s3_client(s3.client_options(), max_pool_connections=1)

    def run(_: Path) -> Measurement:
        config = archived.model_copy(update={"table": archived.table.model_copy(update=fresh_namespace())})
        before = request_counts(s3)
        synced = sync_tables(config, expected=hot.messages)
        counts = request_counts(s3) - before
        delete_table_objects(client, bucket, ARCHIVE_PREFIX, config, TOPIC)
        return Measurement(
            seconds=synced.seconds,
            items=hot.messages,
            bytes=hot.record_bytes,
            extras={
                "commits": float(synced.commits),
                "get_requests": float(counts.get),
                "put_requests": float(counts.put),
                "put_requests_per_1000_messages": per_thousand(counts.put, hot.messages),
                "other_requests": float(counts.list + counts.head + counts.delete),
            },
        )

    return Contender("table sync (TableSyncer.sync_topic), S3 to S3", run)


def _warm_up(s3: MotoServer, directory: Path) -> None:
    """One untimed sync of a small archive: pyiceberg imports its write path at the first append, and the
    archiver's side has its imports done by the archive each table side starts from."""
    hot = fill_hot_store(directory / "source", messages=64, queues=4, body_bytes=BODY_BYTES)
    directory.joinpath("round").mkdir()
    _table_side(s3, hot, directory / "archived").run(directory / "round")


@benchmark(
    "table_sync",
    title="Iceberg table sync from an S3 archive vs archive_s3's archiver on the same messages",
    issue=34,
    summary=(
        f"{BODY_BYTES} B messages over {QUEUES} queues: `TableSyncer.sync_topic` (what `tieredstore table sync` "
        "runs) filling a new topic table from an archive on a moto S3 server in its own process (read back through "
        "`tieredstore.scan`, day-partitioned zstd Parquet written under the cold URL on the same server, "
        "pyiceberg's SQL catalog in the SQLite metadata database), beside `archive_s3`'s side: the real "
        "`Dispatcher.run_once` (key index on) archiving the same hot store into a fresh bucket. On `archive_s3`'s "
        "bodies (16 distinct random bodies in turn) and on unique random bodies."
    ),
)
def table_sync(ctx: BenchmarkContext) -> None:
    messages = ctx.scale(full=FULL_MESSAGES, quick=QUICK_MESSAGES)
    queues = ctx.scale(full=QUEUES, quick=4)
    workloads: list[tuple[str, str, Callable[[Path], HotData]]] = [
        (
            "archive_s3's messages",
            f"{queues} distinct random bodies in turn",
            lambda d: fill_hot_store(d, messages=messages, queues=queues, body_bytes=BODY_BYTES),
        ),
        (
            "unique random bodies",
            "every body new random bytes: incompressible",
            lambda d: fill_hot_store(d, messages=messages, queues=queues, body_bytes=BODY_BYTES, unique_bodies=True),
        ),
    ]
    if ctx.quick:
        workloads = workloads[:1]  # the smoke checks the pair runs; one workload is enough for that
    record_mib: dict[str, float] = {}
    with MotoServer(ctx.work_dir / "moto") as s3:
        _warm_up(s3, ctx.work_dir / "warm-up")
        for number, (name, bodies, fill) in enumerate(workloads):
            hot = fill(ctx.work_dir / f"source-{number}")
            record_mib[name] = round(hot.record_bytes / (1 << 20), 1)
            ours = _table_side(s3, hot, ctx.work_dir / f"archived-{number}")
            archiver = S3Sides(s3, hot)
            ctx.compare(
                f"table sync vs archiver, {name}",
                description=f"{messages:,} messages over {queues} queues, {bodies}",
                baseline=Contender("archive_s3's Dispatcher.run_once", archiver.ours),
                ours=ours,
                unit="msg",
                target=TARGET,
            )
    ctx.parameter(
        messages=messages,
        queues=queues,
        body_bytes=BODY_BYTES,
        record_mib=record_mib,
        catalog="SQLite (pyiceberg SQL catalog in the metadata database)",
        parquet_codec="zstd",
    )
    if not ctx.quick:
        ctx.note(
            f"archive_s3 archives 1,000,000 messages; this pair runs {messages:,}: every table round writes its "
            "Parquet into the moto server's memory, and both rates are per message."
        )
    ctx.note(
        "Ours' time is `sync_topic` alone (the node's metadata and catalog are opened before it, as a running node "
        "has them); the CLI adds an interpreter start and pyiceberg's import. The archiver's is `run_once` alone."
    )
