"""``tieredstore table sync | status | compact``: the Iceberg table of each topic, kept level with the archive."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import TaskID

from tieredstore.cli.app import CliState, app, state
from tieredstore.cli.common import checked_topic
from tieredstore.cli.inspect import human_bytes
from tieredstore.read.node import open_metadata_for_reading
from tieredstore.table.catalog import open_catalog

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

    from tieredstore.metadata import MetadataStore
    from tieredstore.table.sync import TopicCompaction, TopicSync

table_app = typer.Typer(help="The archive as Apache Iceberg tables, one per topic (pip install 'tieredstore[table]').")
app.add_typer(table_app, name="table")

STATUS_COLUMNS = ("topic", "table_offset", "archived_offset", "lag", "snapshots", "data_files", "data_bytes")

TopicArgument = Annotated[str | None, typer.Argument(metavar="[TOPIC]", help="Only this topic (default: all).")]
ProgressOption = Annotated[
    bool | None, typer.Option("--progress/--no-progress", help="Progress bar on stderr (default: on a terminal).")
]


@dataclass(frozen=True)
class _Session:
    """What every table command works with: the CLI state, the archive's metadata, the catalog, the topics."""

    cli: CliState
    metadata: MetadataStore
    catalog: Catalog
    topics: list[str]


@contextmanager
def _session(ctx: typer.Context, topic: str | None) -> Iterator[_Session]:
    """Open the metadata and the catalog for ``topic`` (all synced topics without one); close the metadata."""
    cli = state(ctx)
    if topic is not None:
        checked_topic(topic)
    metadata = open_metadata_for_reading(cli.config)
    try:
        catalog = open_catalog(cli.config)  # first: it names the extra to install when pyiceberg is missing
        # pyiceberg and pyarrow load only for the table commands, not for the rest of the CLI.
        from tieredstore.table.status import synced_topics

        yield _Session(cli, metadata, catalog, [topic] if topic is not None else synced_topics(metadata))
    finally:
        metadata.close()


@table_app.command("sync")
def sync(
    ctx: typer.Context,
    topic: TopicArgument = None,
    progress: ProgressOption = None,
) -> None:
    """Append to each topic's Iceberg table every archived message it does not hold yet, exactly once.

    A topic without a table gets one under the cold URL, filled from its first archived offset (a
    backfill). One line per topic: rows added, the table's offset and its lag behind the archive.
    Example: tieredstore table sync Orders
    """
    results: list[TopicSync] = []
    with _session(ctx, topic) as session:
        from tieredstore.table.sync import TableSyncer

        cli = session.cli
        show = progress if progress is not None else cli.output.err.is_terminal
        with cli.output.progress(show) as bar:
            tasks: list[TaskID] = []
            syncer = TableSyncer(
                cli.config,
                session.metadata,
                session.catalog,
                on_plan=lambda name, lag: tasks.append(bar.add_task(f"table {name}", total=lag)),
                on_rows=lambda rows: bar.advance(tasks[-1], rows),
            )
            for name in session.topics:
                result = syncer.sync_topic(name)
                results.append(result)
                if tasks:
                    bar.update(tasks[-1], completed=bar.tasks[-1].total)
                _print_sync(cli, result)
    if cli.output.is_json:
        cli.output.json({"topics": [result.as_json() for result in results]})


def _print_sync(cli: CliState, result: TopicSync) -> None:
    extras = [
        "registered again from its metadata files" if result.registered else "",
        f"{result.orphans_deleted} orphan files deleted" if result.orphans_deleted else "",
        f"{result.metadata_orphans_deleted} orphan metadata files deleted" if result.metadata_orphans_deleted else "",
        f"{result.rows_trimmed} rows trimmed below retention" if result.rows_trimmed else "",
        f"{result.snapshots_expired} snapshots expired" if result.snapshots_expired else "",
    ]
    tail = "".join(f", {extra}" for extra in extras if extra)
    cli.output.line(
        f"table {result.topic}: {result.rows_added} rows added in {result.commits} commits, "
        f"table offset {result.table_offset} of {result.archived_offset} archived, lag {result.lag}{tail}"
    )


@table_app.command("status")
def status(
    ctx: typer.Context,
    topic: TopicArgument = None,
) -> None:
    """Each topic's table: its offset against the archived offset (summed over queues), the lag in messages,
    snapshots, data files and bytes. A topic without a table shows its whole archive as lag.
    Example: tieredstore --output json table status Orders
    """
    with _session(ctx, topic) as session:
        from tieredstore.table.status import table_status

        config, metadata, catalog = session.cli.config, session.metadata, session.catalog
        rows = [table_status(config, metadata, catalog, name).as_json() for name in session.topics]
    session.cli.output.table("tables", STATUS_COLUMNS, rows, formatters={"data_bytes": human_bytes})


@table_app.command("compact")
def compact(
    ctx: typer.Context,
    topic: TopicArgument = None,
    progress: ProgressOption = None,
) -> None:
    """Merge the small data files of each topic's Iceberg table (what many short syncs leave) into files of
    about the target_file_size setting; the rows and the table's offsets do not change. One line per topic:
    data files before -> after, rows. A topic without a table is left alone.
    Example: tieredstore table compact Orders
    """
    results: list[TopicCompaction] = []
    with _session(ctx, topic) as session:
        from tieredstore.table.sync import compact_topic, require_unencrypted_allowed

        cli = session.cli
        require_unencrypted_allowed(cli.config)
        show = progress if progress is not None else cli.output.err.is_terminal
        with cli.output.progress(show) as bar:
            task = bar.add_task("table compact", total=len(session.topics))
            for name in session.topics:
                session.metadata.get_topic(name)  # NotFoundError (exit 3) for a topic the archive does not know
                result = compact_topic(cli.config, session.catalog, name)
                results.append(result)
                bar.advance(task)
                cli.output.line(
                    f"table {name}: {result.files_before} -> {result.files_after} data files, {result.rows} rows"
                )
    if cli.output.is_json:
        cli.output.json({"topics": [result.as_json() for result in results]})
