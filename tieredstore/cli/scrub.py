"""``tieredstore scrub``: list what cold storage holds that metadata does not account for; delete the old part.

A dry run by default. ``--delete`` removes the orphans last written before the safety window
(``--older-than``, 24 h) and refuses while an archiver runs on the same metadata, as ``retention`` does:
a commit in flight writes its objects before metadata records them.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.progress import TaskID

from tieredstore.cli.app import CliState, app, state
from tieredstore.cli.common import archivers_seen_running, checked_topic, no_archiver_running, parse_duration, run
from tieredstore.cli.inspect import human_age
from tieredstore.metrics import Metrics
from tieredstore.read.node import open_read_node
from tieredstore.read.records import iso
from tieredstore.scrub import Action, Scrubber, ScrubReport, ScrubScope


@app.command("scrub")
def scrub(
    ctx: typer.Context,
    topic: Annotated[
        str | None, typer.Argument(metavar="[TOPIC]", help="Only this topic's folder (default: all).")
    ] = None,
    older_than: Annotated[
        str,
        typer.Option("--older-than", help="Safety window: only orphans last written longer ago (30s, 15m, 24h, 7d)."),
    ] = "24h",
    delete: Annotated[bool, typer.Option("--delete", help="Delete the orphans older than the window.")] = False,
    progress: Annotated[
        bool | None, typer.Option("--progress/--no-progress", help="Progress bar on stderr (default: on a terminal).")
    ] = None,
) -> None:
    """List every object or key-index file in cold storage that metadata does not account for (verify's
    ORPHAN_OBJECT, and the tails of sealed segments), with its size, age and why; a dry run by default.

    With --delete, remove those last written longer ago than --older-than and nothing else; refused
    while an archiver runs on this metadata (exit 7).

    Example: tieredstore scrub --older-than 7d --delete
    """
    cli = state(ctx)
    if topic is not None:
        checked_topic(topic)
    window_ms = parse_duration(older_than) * 1000
    show = progress if progress is not None else cli.output.err.is_terminal
    running: list[str] = []

    async def go() -> ScrubReport:
        async with open_read_node(cli.config) as node:
            if not delete:
                running.extend(archivers_seen_running(cli.config, node.metadata))
            with cli.output.progress(show) as bar:
                task: list[TaskID] = []
                scrubber = Scrubber(
                    node.metadata,
                    node.provider,
                    Metrics(),
                    on_plan=lambda total: task.append(bar.add_task("scrub: listing", total=total)),
                    on_step=lambda: bar.advance(task[0]),
                )
                scope = ScrubScope(cli.config.cluster, cli.config.broker, topic)
                return await scrubber.scrub(scope, older_than_ms=window_ms, delete=delete)

    if delete:
        with no_archiver_running(cli.config, "deleting orphans (scrub --delete)"):
            report = run(go())
    else:
        report = run(go())
    if running:
        report.notes.append(
            f"an archiver is running on this metadata ({', '.join(running)}): orphans younger than the window "
            "may be commits in flight, whose metadata is not recorded yet"
        )
    _print(cli, report, older_than)


def _print(cli: CliState, report: ScrubReport, older_than: str) -> None:
    if cli.output.is_json:
        cli.output.json(report.as_json())
        return
    for orphan in report.orphans:
        # One line each, like verify's problems: a table would fold the long keys.
        cli.output.line(
            f"{orphan.action.value} {orphan.location} ({orphan.size} bytes, last written "
            f"{iso(orphan.last_modified)}, {human_age(report.now_ms - orphan.last_modified)} ago): "
            f"{orphan.kind.value}: {orphan.reason}"
        )
    for note in report.notes:
        cli.output.note(f"note: {note}")
    found = f"scrub: {len(report.orphans)} orphans ({sum(o.size for o in report.orphans)} bytes)"
    kept, kept_bytes = report.count(Action.KEPT)
    if report.delete:
        deleted, deleted_bytes = report.count(Action.DELETED)
        done = f"{deleted} deleted ({deleted_bytes} bytes)"
    else:
        would, would_bytes = report.count(Action.WOULD_DELETE)
        done = f"dry run: {would} would be deleted ({would_bytes} bytes) with --delete"
    cli.output.line(f"{found}: {done}, {kept} kept ({kept_bytes} bytes) as younger than {older_than}")
