"""``tieredstore status | topics | queues | segments``: what is where, read without changing anything."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any

import typer
from rich.live import Live

from tieredstore.basics import check_queue_id, now_ms
from tieredstore.cli.app import app, state
from tieredstore.cli.common import checked_topic, run
from tieredstore.errors import NotFoundError
from tieredstore.formats.naming import FileType, segment_key
from tieredstore.metadata import SegmentFileType, SegmentRecord, SegmentStatus
from tieredstore.read.archived import LIVE_STATUSES
from tieredstore.read.node import ReadNode, open_read_node
from tieredstore.read.records import iso
from tieredstore.topic_filter import TopicFilter

STATUS_COLUMNS = (
    "topic",
    "queue_id",
    "hot_min",
    "hot_max",
    "archived",
    "cold_min",
    "lag",
    "unarchived_age_ms",
    "cold_bytes",
    "commit_log_segments",
    "consume_queue_segments",
    "excluded_by",
)


def human_bytes(value: Any) -> str:
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size} B"


def human_age(value: Any) -> str:
    seconds = int(value) / 1000
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def _iso_text(value: Any) -> str:
    return iso(int(value)) or ""


TIME_FORMAT: dict[str, Callable[[Any], str]] = {
    "begin_timestamp": _iso_text,
    "end_timestamp": _iso_text,
    "sealed_timestamp": _iso_text,
    "created_timestamp": _iso_text,
    "created": _iso_text,
}
SIZE_FORMAT: dict[str, Callable[[Any], str]] = {
    "cold_bytes": human_bytes,
    "size": human_bytes,
    "commit_log_bytes": human_bytes,
    "consume_queue_bytes": human_bytes,
}


@dataclass
class _ColdFiles:
    """One queue's live segment rows, by file type."""

    commit_log: list[SegmentRecord]
    consume_queue: list[SegmentRecord]

    @property
    def bytes(self) -> int:
        return sum(int(r.size) for r in self.commit_log) + sum(int(r.size) for r in self.consume_queue)

    @property
    def time_range(self) -> tuple[int | None, int | None]:
        begins = [r.begin_timestamp for r in self.commit_log if r.begin_timestamp is not None]
        ends = [r.end_timestamp for r in self.commit_log if r.end_timestamp is not None]
        return (min(begins) if begins else None, max(ends) if ends else None)


def _cold_files(node: ReadNode) -> dict[str, _ColdFiles]:
    grouped = node.metadata.list_all_segments(
        file_types=[FileType.COMMIT_LOG.value, FileType.CONSUME_QUEUE.value], statuses=LIVE_STATUSES
    )
    files: dict[str, _ColdFiles] = {}
    for (path, file_type), rows in grouped.items():
        entry = files.setdefault(path, _ColdFiles([], []))
        if file_type is SegmentFileType.COMMIT_LOG:
            entry.commit_log.extend(rows)
        else:
            entry.consume_queue.extend(rows)
    return files


def collect_status(node: ReadNode, topic: str | None = None) -> list[dict[str, Any]]:
    """One row per queue known to metadata or the hot store (docs/reference/json-output.md lists the fields)."""
    positions = {(p.topic, p.queue_id): p for p in node.metadata.list_queues(topic)}
    files = _cold_files(node)
    hot = node.hot
    keys = set(positions)
    hot_keys: set[tuple[str, int]] = set()
    if hot is not None:
        hot_keys = {k for k in hot.queues() if topic is None or k[0] == topic}
        keys.update(hot_keys)
    config = node.config
    topics = TopicFilter.of(config.archiver, cluster=config.cluster, broker=config.broker)
    now = now_ms()
    rows = []
    for key in sorted(keys):
        position = positions.get(key)
        cold = files.get(node.flat.queue_path(*key), _ColdFiles([], []))
        row: dict[str, Any] = dict.fromkeys(STATUS_COLUMNS)
        row.update(
            topic=key[0],
            queue_id=key[1],
            cold_bytes=cold.bytes,
            commit_log_segments=len(cold.commit_log),
            consume_queue_segments=len(cold.consume_queue),
        )
        archived = 0
        row["hot_behind_archive"] = False
        exclusion = topics.exclusion(key[0])
        row.update(excluded=exclusion is not None, excluded_by=exclusion)
        if position is not None:
            archived = position.max_offset
            row.update(archived=position.max_offset, cold_min=position.min_offset)
        if hot is not None and exclusion is not None:
            # Not archived on purpose: nothing of it is waiting for the archiver.
            row.update(hot_min=hot.min_offset(*key), hot_max=hot.max_offset(*key))
        elif hot is not None:
            hot_min, hot_max = hot.min_offset(*key), hot.max_offset(*key)
            row.update(hot_min=hot_min, hot_max=hot_max, lag=max(0, hot_max - archived))
            # The hot store knows the queue but holds fewer offsets than are archived: replaced or lost files.
            row["hot_behind_archive"] = key in hot_keys and hot_max < archived
            oldest = max(archived, hot_min)
            if oldest < hot_max:
                row["unarchived_age_ms"] = max(0, now - hot.store_timestamp(key[0], key[1], oldest))
            else:
                row["unarchived_age_ms"] = 0
        rows.append(row)
    return rows


def _add_table_lags(node: ReadNode, rows: list[dict[str, Any]]) -> None:
    """Each queue's lag behind its topic's Iceberg table (``table_lag``), when a table exists for the topic."""
    try:
        from tieredstore.table.status import queue_table_lags
    except ImportError:
        return  # pyiceberg and pyarrow not installed: there is no table to show
    lags = queue_table_lags(node.config, node.metadata, sorted({row["topic"] for row in rows}))
    if lags is None:
        return
    for row in rows:
        row["table_lag"] = lags.get((row["topic"], row["queue_id"]))


def _status_columns(rows: list[dict[str, Any]]) -> tuple[str, ...]:
    return STATUS_COLUMNS + (("table_lag",) if any("table_lag" in row for row in rows) else ())


@app.command("status")
def status(
    ctx: typer.Context,
    topic: Annotated[str | None, typer.Argument(metavar="[TOPIC]", help="Only this topic.")] = None,
    watch: Annotated[bool, typer.Option("--watch", "-w", help="Refresh until interrupted.")] = False,
    interval: Annotated[float, typer.Option(min=0.05, help="Seconds between refreshes with --watch.")] = 2.0,
    times: Annotated[int, typer.Option(min=0, help="Stop --watch after this many refreshes (0: never).")] = 0,
) -> None:
    """Per queue: hot min/max, archived offset, lag, age of the oldest unarchived message, cold bytes, segments.

    Example: tieredstore --data-dir /var/lib/tieredstore status --watch --interval 5
    """
    cli = state(ctx)
    if topic is not None:
        checked_topic(topic)

    async def snapshot() -> list[dict[str, Any]]:
        async with open_read_node(cli.config, hot=True) as node:
            rows = await asyncio.to_thread(collect_status, node, topic)
            await asyncio.to_thread(_add_table_lags, node, rows)
            return rows

    formatters = {"cold_bytes": human_bytes, "unarchived_age_ms": human_age}
    if not watch:
        rows = run(snapshot())
        cli.output.table("status", _status_columns(rows), rows, formatters=formatters)
        for row in rows:
            if row["hot_behind_archive"] and not cli.output.is_json:
                cli.output.note(
                    f"warning: {row['topic']}/{row['queue_id']}: the hot store holds offsets below {row['hot_max']} "
                    f"but {row['archived']} are archived (replaced, or lost files); messages put below "
                    f"{row['archived']} will not be archived: restore the archive into it first "
                    f"(tieredstore restore {row['topic']} --queue {row['queue_id']} --to-store DIR)"
                )
        return

    async def refresh(show: Callable[[int, list[dict[str, Any]]], None]) -> None:
        for count in itertools.count(1):
            taken = now_ms()
            show(taken, await snapshot())
            if times and count >= times:
                return
            await asyncio.sleep(interval)

    if cli.output.is_json:
        run(refresh(lambda taken, rows: cli.output.json({"title": "status", "timestamp": taken, "rows": rows})))
        return
    with Live(console=cli.output.console, auto_refresh=False) as live:

        def draw(taken: int, rows: list[dict[str, Any]]) -> None:
            live.update(
                cli.output.render_table(f"status at {iso(taken)}", _status_columns(rows), rows, formatters=formatters)
            )
            live.refresh()

        run(refresh(draw))


@app.command("topics")
def topics(ctx: typer.Context) -> None:
    """Every topic in the metadata store with its retention, queues, archived messages and cold bytes.

    Example: tieredstore --output json topics
    """
    cli = state(ctx)

    async def collect() -> list[dict[str, Any]]:
        async with open_read_node(cli.config) as node:
            return await asyncio.to_thread(_topic_rows, node)

    columns = ("topic", "reserve_hours", "status", "queues", "archived_messages", "cold_bytes", "created")
    cli.output.table("topics", columns, run(collect()), formatters={**SIZE_FORMAT, **TIME_FORMAT})


def _topic_rows(node: ReadNode) -> list[dict[str, Any]]:
    files = _cold_files(node)
    queues = node.metadata.list_queues()
    rows = []
    for info in node.metadata.list_topics():
        mine = [q for q in queues if q.topic == info.name]
        paths = {node.flat.queue_path(q.topic, q.queue_id) for q in mine}
        rows.append(
            {
                "topic": info.name,
                "reserve_hours": info.reserve_hours,
                "status": info.status.value,
                "queues": len(mine),
                "archived_messages": sum(q.max_offset - q.min_offset for q in mine),
                "cold_bytes": sum(files[p].bytes for p in paths if p in files),
                "created": info.created,
            }
        )
    return rows


@app.command("queues")
def queues(ctx: typer.Context, topic: Annotated[str, typer.Argument(metavar="TOPIC", help="The topic.")]) -> None:
    """A topic's queues: cold min and archived offsets, hot min/max, cold bytes, segments and time range.

    Example: tieredstore queues Orders
    """
    cli = state(ctx)
    checked_topic(topic)

    async def collect() -> list[dict[str, Any]]:
        async with open_read_node(cli.config, hot=True) as node:
            return await asyncio.to_thread(_queue_rows, node, topic)

    columns = (
        "queue_id",
        "cold_min",
        "archived",
        "hot_min",
        "hot_max",
        "commit_log_bytes",
        "consume_queue_bytes",
        "segments",
        "begin_timestamp",
        "end_timestamp",
    )
    cli.output.table(f"queues of {topic}", columns, run(collect()), formatters={**SIZE_FORMAT, **TIME_FORMAT})


def _queue_rows(node: ReadNode, topic: str) -> list[dict[str, Any]]:
    positions = {p.queue_id: p for p in node.metadata.list_queues(topic)}
    hot_ids = {q for t, q in node.hot.queues() if t == topic} if node.hot is not None else set()
    if not positions and not hot_ids:
        raise NotFoundError(f"topic {topic!r} has no queue in the metadata store or the hot store")
    files = _cold_files(node)
    rows = []
    for queue_id in sorted(set(positions) | hot_ids):
        cold = files.get(node.flat.queue_path(topic, queue_id), _ColdFiles([], []))
        position = positions.get(queue_id)
        begin, end = cold.time_range
        row: dict[str, Any] = {
            "queue_id": queue_id,
            "cold_min": position.min_offset if position else None,
            "archived": position.max_offset if position else None,
            "hot_min": node.hot.min_offset(topic, queue_id) if node.hot is not None else None,
            "hot_max": node.hot.max_offset(topic, queue_id) if node.hot is not None else None,
            "commit_log_bytes": sum(r.size for r in cold.commit_log),
            "consume_queue_bytes": sum(r.size for r in cold.consume_queue),
            "segments": len(cold.commit_log) + len(cold.consume_queue),
            "begin_timestamp": begin,
            "end_timestamp": end,
        }
        rows.append(row)
    return rows


_TYPE_CHOICES: Mapping[str, FileType] = {
    "commit_log": FileType.COMMIT_LOG,
    "consume_queue": FileType.CONSUME_QUEUE,
}


@app.command("segments")
def segments(
    ctx: typer.Context,
    topic: Annotated[str, typer.Argument(metavar="TOPIC", help="The topic.")],
    queue_id: Annotated[int, typer.Argument(metavar="QUEUE_ID", help="The queue id.")],
    file_type: Annotated[
        str | None, typer.Option("--type", help="commit_log or consume_queue (default: both).")
    ] = None,
    include_deleted: Annotated[bool, typer.Option("--all", help="Also DELETING and DELETED segments.")] = False,
) -> None:
    """A queue's cold segments: type, base offset, size, state, object key and time range.

    Example: tieredstore segments Orders 3 --type commit_log
    """
    cli = state(ctx)
    checked_topic(topic)
    check_queue_id(queue_id)
    types = list(_TYPE_CHOICES.values())
    if file_type is not None:
        chosen = _TYPE_CHOICES.get(file_type.lower())
        if chosen is None:
            raise typer.BadParameter(f"{file_type!r} is not one of {', '.join(_TYPE_CHOICES)}", param_hint="--type")
        types = [chosen]
    statuses = list(SegmentStatus) if include_deleted else list(LIVE_STATUSES)

    async def collect() -> list[dict[str, Any]]:
        async with open_read_node(cli.config) as node:
            await asyncio.to_thread(node.metadata.get_queue, topic, queue_id)
            path = node.flat.queue_path(topic, queue_id)
            rows: list[dict[str, Any]] = []
            for kind in types:
                records = await asyncio.to_thread(node.metadata.list_segments, path, kind.value, statuses=statuses)
                rows.extend(
                    {
                        "file_type": kind.value,
                        "base_offset": r.base_offset,
                        "size": r.size,
                        "status": r.status.value,
                        "begin_timestamp": r.begin_timestamp,
                        "end_timestamp": r.end_timestamp,
                        "sealed_timestamp": r.sealed_timestamp,
                        "created_timestamp": r.created_timestamp,
                        "key": segment_key(path, kind, r.base_offset),
                    }
                    for r in records
                )
            return rows

    columns = ("file_type", "base_offset", "size", "status", "begin_timestamp", "end_timestamp", "key")
    cli.output.table(
        f"segments of {topic}/{queue_id}", columns, run(collect()), formatters={**SIZE_FORMAT, **TIME_FORMAT}
    )
