"""``tieredstore restore``: stream archived messages back into a hot store or out to files, resumably.

Into a hot store (``--to-store``) every record lands at its original queue offset
(``LocalMessageStore.restore_messages``), so consumers resume where they were; into a directory
(``--to-dir``) each queue becomes ``<topic>/<queue_id>.jsonl`` or ``.raw`` (the records' own bytes)
beside a ``.progress`` file that is replaced atomically after every fsynced batch. Re-running after an
interruption continues and never writes a message twice.

A restore into a hot store stops at the first offsets that were lost before they were archived (it
cannot hold a gap), having restored everything before them, reports where and why, and exits 3; the
records after the hole go into another (empty) hot store with ``--from-offset`` at the hole's end, or
into a directory, where the hole is skipped and reported.

The engine is the library package ``tieredstore.restore``; this module holds the command's arguments,
progress bar and output.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import (
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from tieredstore.basics import MIB, check_queue_id
from tieredstore.cli.app import app, state
from tieredstore.cli.common import checked_topic, parse_time, run
from tieredstore.errors import ConfigError, NotFoundError, StoreLockedError, ValidationError
from tieredstore.read.node import open_read_node
from tieredstore.restore import (
    DEFAULT_BATCH_MESSAGES,
    DirectorySink,
    ExportFormat,
    HotStoreSink,
    QueueOutcome,
    RestoreRequest,
    RestoreSink,
    RestoreSummary,
    restore_archive,
)
from tieredstore.tuning import tune_for_restore


def _lost_notes(summary: RestoreSummary) -> list[str]:
    """One line per hole met and per queue stopped at one, for people."""
    notes = []
    for queue in summary.queues:
        name = f"{queue.topic}/{queue.queue_id}"
        for start, end in queue.lost:
            if queue.stopped_at is not None and start > queue.stopped_at:
                continue
            if summary.dry_run:
                verb = "would be skipped" if queue.stopped_at is None else "would not be restored"
            else:
                verb = "skipped" if queue.stopped_at is None else "not restored"
            notes.append(f"{name}: offsets [{start}, {end}) were lost before they were archived; {verb}")
        if queue.stopped_at is not None:
            after = queue.lost[0][1]
            notes.append(
                f"{name}: stopped at offset {queue.stopped_at}: a hot store cannot hold a gap in a queue's offsets; "
                f"{queue.remaining} archived messages after it were not restored (restore them with "
                f"--from-offset {after} into an empty hot store, or with --to-dir)"
            )
    return notes


# ---- the command ------------------------------------------------------------------------------------


class _RateColumn(ProgressColumn):
    """Messages per second over the task so far."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text(f"{speed:,.0f} msg/s" if speed else "- msg/s", style="progress.data.speed")


@app.command("restore")
def restore(
    ctx: typer.Context,
    topic: Annotated[str, typer.Argument(metavar="TOPIC", help="The topic to restore.")],
    queue_id: Annotated[int | None, typer.Option("--queue", "-q", help="Only this queue.")] = None,
    from_offset: Annotated[int | None, typer.Option(min=0, help="First queue offset (inclusive).")] = None,
    to_offset: Annotated[int | None, typer.Option(min=0, help="Last queue offset (exclusive).")] = None,
    since: Annotated[str | None, typer.Option(help="Stored at or after (epoch ms, ISO-8601, 2d ...).")] = None,
    until: Annotated[str | None, typer.Option(help="Stored at or before (epoch ms, ISO-8601, now ...).")] = None,
    to_store: Annotated[Path | None, typer.Option(help="A hot store directory: offsets are kept.")] = None,
    to_dir: Annotated[Path | None, typer.Option(help="Export into this directory, one file per queue.")] = None,
    fmt: Annotated[
        ExportFormat | None, typer.Option("--format", help="With --to-dir: jsonl (default) or raw records.")
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print what would be restored; write nothing.")] = False,
    batch: Annotated[
        int, typer.Option(min=1, help="Messages per read from cold storage (at most 16 MiB of them).")
    ] = DEFAULT_BATCH_MESSAGES,
    parallel: Annotated[int, typer.Option(min=1, help="Queues restored at once.")] = 4,
    in_flight_mib: Annotated[
        int, typer.Option(min=1, help="Cap on record MiB read from cold storage and not yet written.")
    ] = 32,
    progress: Annotated[
        bool | None, typer.Option("--progress/--no-progress", help="Progress bar on stderr (default: on a terminal).")
    ] = None,
) -> None:
    """Rehydrate archived messages into a hot store (offsets preserved) or export them to files.

    Re-running after an interruption continues where the last run stopped and never duplicates.

    Examples: tieredstore restore Orders --to-store /var/lib/tieredstore/hot ·
    tieredstore restore Orders --queue 2 --since 2024-05-01T00:00:00Z --to-dir ./export --format raw
    """
    cli = state(ctx)
    checked_topic(topic)
    if queue_id is not None:
        check_queue_id(queue_id)
    if (to_store is None) == (to_dir is None):
        raise ValidationError("give exactly one target: --to-store DIR or --to-dir DIR")
    if to_store is not None and fmt is not None:
        raise ValidationError("--format applies to --to-dir only (a hot store holds records as they are)")
    request = RestoreRequest(
        topic,
        queue_id,
        from_offset,
        to_offset,
        parse_time(since) if since is not None else None,
        parse_time(until) if until is not None else None,
        batch_messages=batch,
        parallel=parallel,
        max_bytes_in_flight=in_flight_mib * MIB,
    )
    show = progress if progress is not None else cli.output.err.is_terminal
    if not dry_run:
        tune_for_restore()

    async def go() -> RestoreSummary:
        async with open_read_node(cli.config) as node:
            sink: RestoreSink
            if to_store is not None:
                if to_store.resolve() == cli.config.hot_dir.resolve() and not dry_run:
                    cli.output.note(f"restoring into this node's own hot store {to_store}")
                try:
                    sink = HotStoreSink(to_store, node, dry_run=dry_run)
                except StoreLockedError as error:
                    raise ConfigError(f"{error} (stop `tieredstore run` on it first)") from error
            else:
                assert to_dir is not None
                sink = DirectorySink(to_dir, fmt or "jsonl", dry_run=dry_run)
            try:
                rate = (_RateColumn(), TextColumn("ETA"), TimeRemainingColumn())
                with cli.output.progress(show and not dry_run, *rate) as bar:
                    tasks: list[TaskID] = []

                    def planned(queues: list[QueueOutcome]) -> None:
                        total = sum(q.planned for q in queues)
                        tasks.append(bar.add_task(f"restore {topic}", total=total))

                    def advanced(_queue: QueueOutcome, count: int) -> None:
                        bar.advance(tasks[0], count)

                    return await restore_archive(
                        node, request, sink, dry_run=dry_run, on_plan=planned, on_progress=advanced
                    )
            finally:
                await asyncio.to_thread(sink.close)

    summary = run(go())
    if cli.output.is_json:
        cli.output.json(summary.as_json())
    else:
        rows = summary.as_json()["queues"]
        cli.output.table(
            "restore plan" if dry_run else "restored",
            ("topic", "queue_id", "first", "end", "already_done", "restored", "remaining", "bytes"),
            rows,
        )
        totals = summary.as_json()
        cli.output.record(
            "dry run: nothing was written" if dry_run else "summary",
            {k: totals[k] for k in ("target", "messages", "bytes", "seconds", "messages_per_second")},
        )
    for note in _lost_notes(summary):
        cli.output.note(note)
    stopped = [q for q in summary.queues if q.stopped_at is not None]
    if stopped:
        where = ", ".join(f"{q.topic}/{q.queue_id} at {q.stopped_at}" for q in stopped)
        raise NotFoundError(
            f"{'the restore would stop' if dry_run else 'restore stopped'} where offsets were lost before they "
            f"were archived ({where}); everything before was {'to be ' if dry_run else ''}restored, see above"
        )
