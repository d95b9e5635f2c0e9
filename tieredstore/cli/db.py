"""``tieredstore db``: schema migrations of the metadata database (Alembic underneath), and its rebuild from cold."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Annotated, Any

import typer
from rich.progress import Progress

from tieredstore.cli.app import CliState, app, state
from tieredstore.cli.common import run
from tieredstore.config import TieredStoreConfig
from tieredstore.errors import ValidationError
from tieredstore.leases import SingleArchiverLock
from tieredstore.metadata import MetadataStore, migrate
from tieredstore.metadata.engine import parse_url
from tieredstore.rebuild import RebuildReport, rebuild_metadata
from tieredstore.runtime import flat_file_settings, open_cold_provider

db_app = typer.Typer(
    help="Metadata database: upgrade its schema to the version this tieredstore knows, show it, or rebuild it."
)
app.add_typer(db_app, name="db")


@db_app.command("upgrade")
def upgrade(ctx: typer.Context) -> None:
    """Migrate the metadata database to the newest schema revision.

    Example: tieredstore --metadata-url postgresql+psycopg://postgres@127.0.0.1/archive db upgrade
    """
    cli = state(ctx)
    url = cli.config.effective_metadata_url
    before = migrate.current(url)
    migrate.upgrade(url)
    after = migrate.current(url)
    cli.output.record("schema", {"before": before, "after": after, "head": migrate.head()})


@db_app.command("current")
def current(ctx: typer.Context) -> None:
    """Show the schema revision of the metadata database and the one this tieredstore expects.

    Example: tieredstore --output json db current
    """
    cli = state(ctx)
    url = cli.config.effective_metadata_url
    revision = migrate.current(url)
    head = migrate.head()
    cli.output.record(
        "schema",
        {"current": revision, "head": head, "up_to_date": revision == head},
    )


@db_app.command("rebuild")
def rebuild(
    ctx: typer.Context,
    from_cold: Annotated[
        bool, typer.Option("--from-cold", help="Rebuild from the cold tier alone (the one source there is).")
    ] = False,
    progress: Annotated[
        bool | None, typer.Option("--progress/--no-progress", help="Progress bar on stderr (default: on a terminal).")
    ] = None,
) -> None:
    """Rebuild a lost metadata database from cold storage, into an empty database.

    Topics, queues, segments (sizes, states, time ranges, lost offsets) and the key-index catalogue
    come back; what cold storage cannot tell is defaulted and listed. Stop every archiver first.
    Example: tieredstore --metadata-url postgresql+psycopg://postgres@127.0.0.1/archive db rebuild --from-cold
    """
    if not from_cold:
        raise ValidationError("say where to rebuild from: tieredstore db rebuild --from-cold")
    cli = state(ctx)
    config = cli.config
    show = progress if progress is not None else cli.output.err.is_terminal
    with contextlib.ExitStack() as stack:
        lock = SingleArchiverLock.for_url(config.effective_metadata_url, action="rebuilding its metadata")
        if lock is not None:
            stack.enter_context(lock)
        target = stack.enter_context(_open_target(config))
        bar = stack.enter_context(cli.output.progress(show))
        report = run(_rebuild(config, target, bar))
    _print(cli, report)


def _open_target(config: TieredStoreConfig) -> MetadataStore:
    """The target database at the head schema: migrated first when it has none (a new PostgreSQL database)."""
    url = config.effective_metadata_url
    if parse_url(url).get_backend_name() != "sqlite" and migrate.current(url) is None:
        migrate.upgrade(url)
    return MetadataStore.open(url, create=True)


async def _rebuild(config: TieredStoreConfig, target: MetadataStore, bar: Progress) -> RebuildReport:
    task = bar.add_task("queues", total=None)

    def advance(done: int, total: int) -> None:
        bar.update(task, completed=done, total=total)

    provider = open_cold_provider(config)
    try:
        await provider.prepare()
        return await rebuild_metadata(
            provider,
            target,
            cluster=config.cluster,
            broker=config.broker,
            settings=flat_file_settings(config),
            progress=advance,
        )
    finally:
        await asyncio.shield(provider.close())


def _print(cli: CliState, report: RebuildReport) -> None:
    summary: dict[str, Any] = {
        "topics": report.topics,
        "queues": [
            {
                "topic": queue.topic,
                "queue_id": queue.queue_id,
                "min_offset": queue.min_offset,
                "max_offset": queue.max_offset,
                "commit_log_segments": queue.commit_log_segments,
                "consume_queue_segments": queue.consume_queue_segments,
                "lost_ranges": [list(lost) for lost in queue.lost_ranges],
                "dropped_units": queue.dropped_units,
                "orphan_bytes_removed": queue.orphan_bytes_removed,
            }
            for queue in report.queues
        ],
        "index_files": report.index_files,
        "rows": report.rows,
        "skipped": report.skipped,
        "defaulted": list(report.defaulted),
        "seconds": round(report.seconds, 3),
    }
    if cli.output.is_json:
        cli.output.json(summary)
        return
    cli.output.table(
        "rebuilt queues",
        ["topic", "queue_id", "min_offset", "max_offset", "commit_log_segments", "consume_queue_segments", "lost"],
        [{**row, "lost": " ".join(f"[{a}, {b})" for a, b in row["lost_ranges"])} for row in summary["queues"]],
    )
    rows = ", ".join(f"{count} {table}" for table, count in report.rows.items())
    cli.output.line(f"rebuilt {rows} in {report.seconds:.1f}s")
    for queue in report.queues:
        if queue.dropped_units or queue.orphan_bytes_removed:
            cli.output.line(
                f"{queue.topic}/{queue.queue_id}: recovery cut what a commit in flight left "
                f"({queue.dropped_units} units, {queue.orphan_bytes_removed} commit-log bytes)"
            )
    for skipped in report.skipped:
        cli.output.line(f"skipped {skipped}")
    cli.output.line("not known from cold storage, defaulted:")
    for item in report.defaulted:
        cli.output.line(f"  - {item}")
