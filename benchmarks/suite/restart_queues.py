"""Restart with 10,000 queues (issue 3): FlatFileStore recovery from metadata, on SQLite and on PostgreSQL.

The queues are archived once through the real write path (FlatFileStore over a POSIX cold tier and an
embedded SQLite database); the PostgreSQL database is a row-for-row copy of the same metadata, so both
engines recover the very same cold files. The baseline is the least any restart must do: a plain SELECT
of every queue row and every recoverable segment row on a fresh connection. The ratio is then what
recovery costs beyond reading its metadata (building the flat files and checking the last segment of
each queue against the provider).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import Engine, delete, insert, select, text

from benchmarks.harness import BenchmarkContext, Contender, Measurement, Metric, benchmark, stopwatch
from benchmarks.services import fresh_postgres_database, postgres_server_version
from tieredstore.flat.append_file import RECOVERABLE_STATUSES
from tieredstore.flat.message_file import RecordRun
from tieredstore.flat.store import FlatFileStore
from tieredstore.formats.message import encode_raw
from tieredstore.metadata import MetadataStore, upgrade
from tieredstore.metadata.engine import create_metadata_engine
from tieredstore.metadata.models import Base
from tieredstore.providers.posix import PosixProvider

CLUSTER = "benchmark"
BROKER = "broker-a"
QUEUES_PER_TOPIC = 16
MESSAGES_PER_QUEUE = 4
BODY = b"m" * 256


def _queue_key(index: int) -> tuple[str, int]:
    return f"RestartTopic{index // QUEUES_PER_TOPIC:05d}", index % QUEUES_PER_TOPIC


async def _archive_queues(flat_store: FlatFileStore, start: int, end: int) -> None:
    """Archive ``MESSAGES_PER_QUEUE`` messages into each of queues ``start .. end-1`` through the write path."""
    for index in range(start, end):
        topic, queue_id = _queue_key(index)
        flat_file = await flat_store.get_or_create(topic, queue_id)
        for queue_offset in range(MESSAGES_PER_QUEUE):
            timestamp = 1_700_000_000_000 + queue_offset
            record = encode_raw(
                topic_raw=topic.encode("ascii"),
                queue_id=queue_id,
                body=BODY,
                properties_raw=b"",
                queue_offset=queue_offset,
                store_timestamp=timestamp,
            )
            await flat_file.append_records(RecordRun.of([(record, queue_offset, timestamp, 0)]))
    await flat_store.commit_all()


def _extend(sqlite_url: str, cold_root: Path, start: int, end: int) -> None:
    with MetadataStore.open(sqlite_url) as metadata:
        flat_store = FlatFileStore(PosixProvider(str(cold_root)), metadata, cluster=CLUSTER, broker=BROKER)
        asyncio.run(_archive_queues(flat_store, start, end))


def _copy_rows(source: Engine, target: Engine) -> None:
    """Make ``target``'s tieredstore tables hold exactly ``source``'s rows (ids included)."""
    tables = Base.metadata.sorted_tables
    with source.connect() as reader, target.begin() as writer:
        for table in reversed(tables):
            writer.execute(delete(table))
        for table in tables:
            rows = [dict(row._mapping) for row in reader.execute(select(table))]
            if rows:
                writer.execute(insert(table), rows)
        for table in tables:
            if "id" in table.c:
                # Explicit ids leave the sequences behind; a later insert must not collide.
                writer.execute(
                    text(
                        f"SELECT setval(pg_get_serial_sequence('{table.name}', 'id'), "
                        f"COALESCE((SELECT MAX(id) FROM {table.name}), 0) + 1, false)"
                    )
                )


def _plain_select(url: str) -> Callable[[Path], Measurement]:
    statuses = ", ".join(f"'{status.value}'" for status in RECOVERABLE_STATUSES)

    def run(_: Path) -> Measurement:
        with stopwatch() as elapsed:
            engine = create_metadata_engine(url)
            try:
                with engine.connect() as connection:
                    queues = connection.execute(
                        text("SELECT t.name, q.* FROM queues q JOIN topics t ON t.id = q.topic_id")
                    ).fetchall()
                    segments = connection.execute(
                        text(f"SELECT * FROM segments WHERE status IN ({statuses})")
                    ).fetchall()
            finally:
                engine.dispose()
        return Measurement(seconds=elapsed(), items=len(queues), extras={"segment_rows": float(len(segments))})

    return run


def _recover(url: str, cold_root: Path, expected_queues: int) -> Callable[[Path], Measurement]:
    def run(_: Path) -> Measurement:
        with stopwatch() as elapsed, MetadataStore(url) as metadata:
            flat_store = FlatFileStore(PosixProvider(str(cold_root)), metadata, cluster=CLUSTER, broker=BROKER)
            report = asyncio.run(flat_store.recover())
        if report.recovered != expected_queues or report.failed or report.changed:
            raise RuntimeError(
                f"recovery of {expected_queues} consistent queues recovered {report.recovered}, "
                f"changed {len(report.changed)}, failed {len(report.failed)}: {list(report.failed.values())[:3]}"
            )
        return Measurement(seconds=elapsed(), items=report.recovered)

    return run


@benchmark(
    "restart_queues",
    title="Restart with 10,000 queues",
    issue=3,
    summary=(
        "`FlatFileStore.recover()` of every archived queue from metadata (SQLite, then PostgreSQL) over a POSIX "
        "cold tier, beside a plain SELECT of all queue and segment rows on a fresh connection. The ratio is "
        "recovery time over SELECT time; the issue asks for a fast restart and a recorded figure, not a ratio."
    ),
)
def restart_queues(ctx: BenchmarkContext) -> None:
    steps = [1_000, 3_000, 10_000] if not ctx.quick else [20, 60]
    queue_count = steps[-1]
    sqlite_url = f"sqlite:///{ctx.work_dir / 'metadata.db'}"
    cold_root = ctx.work_dir / "cold"
    ctx.parameter(
        queues=queue_count,
        topics=queue_count // QUEUES_PER_TOPIC,
        messages_per_queue=MESSAGES_PER_QUEUE,
        cold_tier="POSIX (local directory)",
        postgresql=postgres_server_version(),
    )
    sqlite_curve: list[float] = []
    postgres_curve: list[float] = []
    populate_seconds = 0.0
    with fresh_postgres_database() as postgres_url:
        upgrade(postgres_url)
        sqlite_engine = create_metadata_engine(sqlite_url)
        postgres_engine = create_metadata_engine(postgres_url)
        try:
            archived = 0
            for step in steps:
                with stopwatch() as populating:
                    _extend(sqlite_url, cold_root, archived, step)
                    _copy_rows(sqlite_engine, postgres_engine)
                populate_seconds += populating()
                archived = step
                if step == queue_count:
                    break
                sqlite_curve.append(_recover(sqlite_url, cold_root, step)(ctx.work_dir).seconds)
                postgres_curve.append(_recover(postgres_url, cold_root, step)(ctx.work_dir).seconds)
        finally:
            sqlite_engine.dispose()
            postgres_engine.dispose()

        for engine_name, url, curve in (
            ("SQLite", sqlite_url, sqlite_curve),
            ("PostgreSQL", postgres_url, postgres_curve),
        ):
            comparison = ctx.compare(
                engine_name,
                description=f"{queue_count:,} queues",
                baseline=Contender("plain SELECT of queue + segment rows", _plain_select(url)),
                ours=Contender("FlatFileStore.recover()", _recover(url, cold_root, queue_count)),
                unit="queue",
                metric=Metric.SECONDS,
            )
            curve.append(comparison["ours"]["median"])

    ctx.curve(
        "recovery-time",
        title="FlatFileStore recovery time as queues grow",
        x_label="queues",
        y_label="seconds to recover every queue",
        x=steps,
        lines={"SQLite": sqlite_curve, "PostgreSQL": postgres_curve},
        log_x=True,
        log_y=True,
    )
    ctx.figure(
        "populate (not timed against anything)",
        [populate_seconds],
        "s",
        f"archiving {queue_count:,} queues once through FlatFileStore on SQLite, copying the rows to PostgreSQL",
    )
    ctx.note(
        "Points below the largest queue count on the curve are one recovery each; the largest is the median "
        "of the alternated rounds in the table."
    )
