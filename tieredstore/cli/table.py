"""``tieredstore table sync | status``: the Iceberg table of each topic, kept level with the archive."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import TaskID

from tieredstore.cli.app import CliState, app, state
from tieredstore.cli.common import checked_topic
from tieredstore.cli.inspect import human_bytes
from tieredstore.read.node import open_metadata_for_reading
from tieredstore.table.catalog import open_catalog

if TYPE_CHECKING:
    from tieredstore.table.sync import TopicSync

table_app = typer.Typer(help="The archive as Apache Iceberg tables, one per topic (pip install 'tieredstore[table]').")
app.add_typer(table_app, name="table")

STATUS_COLUMNS = ("topic", "table_offset", "archived_offset", "lag", "snapshots", "data_files", "data_bytes")


@table_app.command("sync")
def sync(
    ctx: typer.Context,
    topic: Annotated[str | None, typer.Argument(metavar="[TOPIC]", help="Only this topic (default: all).")] = None,
    progress: Annotated[
        bool | None, typer.Option("--progress/--no-progress", help="Progress bar on stderr (default: on a terminal).")
    ] = None,
) -> None:
    """Append to each topic's Iceberg table every archived message it does not hold yet, exactly once.

    A topic without a table gets one under the cold URL, filled from its first archived offset (a
    backfill). One line per topic: rows added, the table's offset and its lag behind the archive.
    Example: tieredstore table sync Orders
    """
    cli = state(ctx)
    if topic is not None:
        checked_topic(topic)
    show = progress if progress is not None else cli.output.err.is_terminal
    config = cli.config
    metadata = open_metadata_for_reading(config)
    results: list[TopicSync] = []
    try:
        catalog = open_catalog(config)  # first: it names the extra to install when pyiceberg is missing
        # pyiceberg and pyarrow load only for the table commands, not for the rest of the CLI.
        from tieredstore.table.status import synced_topics
        from tieredstore.table.sync import TableSyncer

        topics = [topic] if topic is not None else synced_topics(metadata)
        with cli.output.progress(show) as bar:
            tasks: list[TaskID] = []
            syncer = TableSyncer(
                config,
                metadata,
                catalog,
                on_plan=lambda name, lag: tasks.append(bar.add_task(f"table {name}", total=lag)),
                on_rows=lambda rows: bar.advance(tasks[-1], rows),
            )
            for name in topics:
                result = syncer.sync_topic(name)
                results.append(result)
                if tasks:
                    bar.update(tasks[-1], completed=bar.tasks[-1].total)
                _print_sync(cli, result)
    finally:
        metadata.close()
    if cli.output.is_json:
        cli.output.json({"topics": [result.as_json() for result in results]})


def _print_sync(cli: CliState, result: TopicSync) -> None:
    orphans = f", {result.orphans_deleted} orphan files deleted" if result.orphans_deleted else ""
    cli.output.line(
        f"table {result.topic}: {result.rows_added} rows added in {result.commits} commits, "
        f"table offset {result.table_offset} of {result.archived_offset} archived, lag {result.lag}{orphans}"
    )


@table_app.command("status")
def status(
    ctx: typer.Context,
    topic: Annotated[str | None, typer.Argument(metavar="[TOPIC]", help="Only this topic (default: all).")] = None,
) -> None:
    """Each topic's table: its offset against the archived offset (summed over queues), the lag in messages,
    snapshots, data files and bytes. A topic without a table shows its whole archive as lag.
    Example: tieredstore --output json table status Orders
    """
    cli = state(ctx)
    if topic is not None:
        checked_topic(topic)
    config = cli.config
    metadata = open_metadata_for_reading(config)
    try:
        catalog = open_catalog(config)
        from tieredstore.table.status import synced_topics, table_status

        topics = [topic] if topic is not None else synced_topics(metadata)
        rows = [table_status(config, metadata, catalog, name).as_json() for name in topics]
    finally:
        metadata.close()
    cli.output.table("tables", STATUS_COLUMNS, rows, formatters={"data_bytes": human_bytes})
