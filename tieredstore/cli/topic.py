"""``tieredstore topic set-retention | delete`` and ``tieredstore retention``: cold data's lifetime."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import typer

from tieredstore import basics
from tieredstore.cli.app import app, state
from tieredstore.cli.common import checked_topic, no_archiver_running, parse_duration, run
from tieredstore.errors import ValidationError
from tieredstore.metadata import TopicStatus
from tieredstore.read.archived import archived_queue, segment_rows
from tieredstore.read.node import open_read_node
from tieredstore.read.records import iso
from tieredstore.retention import (
    QueueRetention,
    RetentionReport,
    apply_retention,
    index_cutoff,
    plan_queue,
    retention_ms,
)
from tieredstore.runtime import open_runtime

topic_app = typer.Typer(help="Per-topic settings and removal of a topic's cold data.")
app.add_typer(topic_app, name="topic")


@topic_app.command("set-retention")
def set_retention(
    ctx: typer.Context,
    topic: Annotated[str, typer.Argument(metavar="TOPIC", help="The topic.")],
    duration: Annotated[
        str,
        typer.Argument(metavar="DURATION", help="Keep cold data this long: 30s, 15m, 72h, 7d; a bare number is hours."),
    ],
) -> None:
    """Keep the topic's cold data for DURATION; the running archiver applies it on its next maintenance pass.

    Data goes at most DURATION plus [segments] commit_log_rolling_interval after it was stored.
    Example: tieredstore topic set-retention Orders 7d
    """
    cli = state(ctx)
    checked_topic(topic)
    seconds = parse_duration(duration)

    async def go() -> dict[str, Any]:
        async with open_read_node(cli.config) as node:
            info = await asyncio.to_thread(node.metadata.set_retention, topic, seconds / 3600)
            return {"topic": info.name, "reserve_hours": info.reserve_hours, "status": info.status.value}

    cli.output.record("retention", run(go()))


@topic_app.command("delete")
def delete(
    ctx: typer.Context,
    topic: Annotated[str, typer.Argument(metavar="TOPIC", help="The topic.")],
    yes: Annotated[bool, typer.Option("--yes", help="Really delete: required, nothing is deleted without it.")] = False,
) -> None:
    """Delete a topic's cold data (every segment object) and its metadata. Refuses without --yes.

    The hot store is not touched. Example: tieredstore topic delete OldOrders --yes
    """
    cli = state(ctx)
    checked_topic(topic)
    if not yes:
        raise ValidationError(f"deleting {topic!r} removes all of its archived messages for good; add --yes")

    async def go() -> dict[str, Any]:
        async with open_runtime(cli.config, hot=False, recover=False, create_metadata=False) as runtime:
            await asyncio.to_thread(runtime.metadata.get_topic, topic)
            queues = await asyncio.to_thread(runtime.metadata.list_queues, topic)
            await runtime.flat.destroy_topic(topic)
            return {"topic": topic, "queues": len(queues), "deleted": True}

    with no_archiver_running(cli.config, f"deleting topic {topic!r}"):
        cli.output.record("deleted", run(go()))


def _rows(report: RetentionReport) -> list[dict[str, Any]]:
    return [
        {
            "topic": queue.topic,
            "queue_id": queue.queue_id,
            "file_type": segment.file_type.value,
            "base_offset": segment.base_offset,
            "size": segment.size,
            "end_timestamp": segment.end_timestamp,
            "min_offset_before": queue.min_offset_before,
            "min_offset_after": queue.min_offset_after,
        }
        for queue in report.queues
        for segment in queue.segments
    ]


async def plan_retention(cli_config: Any, *, now_ms: int | None = None) -> RetentionReport:
    """What a retention pass would remove, from the recorded state, without recovery or any write."""
    now = basics.now_ms() if now_ms is None else now_ms
    report = RetentionReport(dry_run=True, now_ms=now)
    async with open_read_node(cli_config) as node:
        topics = {t.name: t for t in await asyncio.to_thread(node.metadata.list_topics)}
        for position in await asyncio.to_thread(node.metadata.list_queues):
            info = topics.get(position.topic)
            if info is None or info.status is not TopicStatus.ACTIVE:
                continue
            path = node.flat.queue_path(position.topic, position.queue_id)
            flat_file = archived_queue(node.flat, position, await asyncio.to_thread(segment_rows, node.metadata, path))
            plan: QueueRetention = await plan_queue(flat_file, now - retention_ms(info), now_ms=now)
            if plan.segments:
                report.queues.append(plan)
        cutoff = index_cutoff(now, cli_config.default_reserve_hours, topics.values())
    # The key index read-only, every namespace, as the real pass would see it.
    async with open_runtime(cli_config, hot=False, recover=False, create_metadata=False, cold_owner=False) as runtime:
        report.index_files = await runtime.keys.expired_files(cutoff)
    return report


@app.command("retention")
def retention(
    ctx: typer.Context,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only print what would be deleted.")] = False,
) -> None:
    """Delete cold segments older than their topic's retention now, printing each one, and expired index files.

    The running archiver (`tieredstore run`) does this itself on every maintenance pass
    ([archiver] maintain_interval); this command is for an on-demand pass while no archiver runs, and
    refuses to run beside one. Like the archiver, it first rolls segments older than
    [segments] commit_log_rolling_interval, so a quiet queue's data expires too.
    Example: tieredstore retention --dry-run
    """
    cli = state(ctx)

    async def go() -> RetentionReport:
        if dry_run:
            return await plan_retention(cli.config)
        async with open_runtime(cli.config, hot=False, create_metadata=False) as runtime:
            return await apply_retention(runtime)

    if dry_run:
        report = run(go())
    else:
        with no_archiver_running(
            cli.config, "applying retention (a running archiver applies it on its maintenance pass)"
        ):
            report = run(go())
    rows = _rows(report)
    if cli.output.is_json:
        cli.output.json(
            {
                "dry_run": report.dry_run,
                "now": report.now_ms,
                "segments": rows,
                "segment_count": report.segment_count,
                "bytes": report.bytes_removed,
                "index_files": list(report.index_files),
            }
        )
        return
    columns = ("topic", "queue_id", "file_type", "base_offset", "size", "end_timestamp", "min_offset_after")
    title = "would delete" if dry_run else "deleted"
    if rows:  # an empty table says less than the line below
        cli.output.table(title, columns, rows, formatters={"end_timestamp": lambda v: iso(int(v)) or ""})
    verb = "would remove" if dry_run else "removed"
    cli.output.line(
        f"retention {verb} {report.segment_count} segments ({report.bytes_removed} bytes)"
        + (f" and {len(report.index_files)} index files" if report.index_files else "")
    )
