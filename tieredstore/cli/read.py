"""``tieredstore read | tail | offset-for-time | query-key``: messages out of either tier, read-only.

``--tier auto`` serves each offset from the hot store while it holds it and from cold storage
otherwise, the way a consumer would see the queue; ``hot`` and ``cold`` read one tier only.

Offsets the hot store lost before they were archived (a recorded hole in the cold consume queue)
are stepped over: the message after them carries ``lost_before`` = [start, end) (a JSON field on
every message, null when nothing was skipped), and text output prints a line saying so.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Literal

import typer

from tieredstore.cli.app import CliState, app, state
from tieredstore.cli.common import (
    ReadNode,
    Tier,
    archived_queue,
    archived_range,
    checked_queue_id,
    checked_topic,
    decode_message,
    iso,
    lost_range_at,
    message_fields,
    open_hot_for_reading,
    open_read_node,
    parse_time,
    read_archived,
    run,
    segment_rows,
)
from tieredstore.errors import NotFoundError, SegmentNotFoundError, ValidationError
from tieredstore.flat.consume_queue import BoundaryType
from tieredstore.flat.message_file import FlatMessageFile
from tieredstore.formats.message import MessageRecord
from tieredstore.index.service import newest_first
from tieredstore.local.index_file import record_index_keys
from tieredstore.runtime import open_runtime

TierChoice = Literal["auto", "hot", "cold"]
MessageFormat = Literal["text", "json", "raw"]
BATCH = 256
MAX_TIMESTAMP = (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class ReadMessage:
    """One message as read: which tier served it, its record bytes and the decoded record.

    ``lost_before`` is the [start, end) of offsets recorded as lost that the read stepped over to
    reach this message (None when it follows on).
    """

    tier: Tier
    raw: bytes
    record: MessageRecord
    lost_before: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class ReadBatch:
    """Messages read in offset order and the offset to read from next (past any hole stepped over)."""

    messages: list[ReadMessage]
    next_offset: int

    def __len__(self) -> int:
        return len(self.messages)


class QueueReader:
    """Reads one queue from the hot store (read-only) and its archived files (as recorded)."""

    def __init__(self, node: ReadNode, topic: str, queue_id: int, cold: FlatMessageFile | None) -> None:
        self.node = node
        self.topic = topic
        self.queue_id = queue_id
        self.cold = cold
        hot = node.hot
        self.hot_range = (hot.min_offset(topic, queue_id), hot.max_offset(topic, queue_id)) if hot else (0, 0)
        self.cold_range = archived_range(cold) if cold is not None else (0, 0)

    @classmethod
    async def open(cls, node: ReadNode, topic: str, queue_id: int, tier: TierChoice = "auto") -> QueueReader:
        cold: FlatMessageFile | None = None
        positions = await asyncio.to_thread(node.metadata.list_queues, topic)
        position = next((p for p in positions if p.queue_id == queue_id), None)
        if position is not None:
            rows = await asyncio.to_thread(segment_rows, node.metadata, node.flat.queue_path(topic, queue_id))
            cold = archived_queue(node.flat, position, rows)
        reader = cls(node, topic, queue_id, cold)
        if tier == "cold" and cold is None:
            raise NotFoundError(f"queue {topic}/{queue_id} has nothing archived (it is not in the metadata store)")
        if cold is None and reader.hot_range[1] == 0:
            raise NotFoundError(f"queue {topic}/{queue_id} is in neither the hot store nor the metadata store")
        return reader

    def ranges(self, tier: TierChoice) -> list[tuple[int, int]]:
        chosen = {"hot": [self.hot_range], "cold": [self.cold_range], "auto": [self.hot_range, self.cold_range]}[tier]
        return [(low, high) for low, high in chosen if low < high]

    def bounds(self, tier: TierChoice) -> tuple[int, int]:
        """[min, max) over the chosen tiers; both at the queue's end when they hold nothing."""
        held = self.ranges(tier)
        if not held:
            end = max(self.hot_range[1], self.cold_range[1])
            return end, end
        return min(low for low, _ in held), max(high for _, high in held)

    async def read(self, offset: int, count: int, tier: TierChoice) -> ReadBatch:
        """Up to ``count`` messages from ``offset``, stepping over offsets recorded as lost.

        NotFoundError below the chosen tiers' min offset.
        """
        low, _ = self.bounds(tier)
        if offset < low:
            raise NotFoundError(
                f"offset {offset} of {self.topic}/{self.queue_id} is below the min offset {low} ({tier})"
            )
        out: list[ReadMessage] = []
        lost: tuple[int, int] | None = None
        while len(out) < count:
            want = count - len(out)
            hot_low, hot_high = self.hot_range
            cold_low, cold_high = self.cold_range
            if tier != "cold" and hot_low <= offset < hot_high and self.node.hot is not None:
                raws = await asyncio.to_thread(self._read_hot, offset, min(want, hot_high - offset))
                source: Tier = "hot"
            elif tier != "hot" and self.cold is not None and cold_low <= offset < cold_high:
                hole = lost_range_at(self.cold, offset)
                if hole is not None:
                    # Never archived: go on at the first offset after the hole that some chosen tier holds.
                    resume = hole[1]
                    if tier == "auto" and offset < hot_low < resume:
                        resume = hot_low
                    lost = (lost[0] if lost is not None else offset, resume)
                    offset = resume
                    continue
                raws = await self._read_cold(offset, min(want, cold_high - offset), tier)
                source = "cold"
            else:
                break
            if not raws:
                break
            for raw in raws:
                where = f"{source} {self.topic}/{self.queue_id} at queue offset {offset}"
                out.append(ReadMessage(source, raw, decode_message(raw, where=where), lost))
                lost = None
                offset += 1
        return ReadBatch(out, offset if lost is None else lost[0])

    async def _read_cold(self, offset: int, count: int, tier: TierChoice) -> list[bytes]:
        """``read_archived``; where the archiver's retention removed a segment since the view was loaded, the
        view is loaded again, and an offset below its new min offset is NotFoundError naming that."""
        assert self.cold is not None
        try:
            return await read_archived(self.cold, offset, count)
        except SegmentNotFoundError:
            await self.cold.refresh()
            self.cold_range = archived_range(self.cold)
            low, _ = self.bounds(tier)
            if offset < low:
                raise NotFoundError(
                    f"offset {offset} of {self.topic}/{self.queue_id} is below the min offset {low} ({tier}): "
                    "retention removed it"
                ) from None
            raise

    def _read_hot(self, offset: int, count: int) -> list[bytes]:
        assert self.node.hot is not None
        stored = self.node.hot.read_messages(self.topic, self.queue_id, offset, max_count=count, max_bytes=64 << 20)
        return [m.raw for m in stored]

    async def offset_for_time(self, timestamp: int, boundary: BoundaryType, tier: TierChoice) -> int:
        """LOWER: first offset stored at or after ``timestamp``; UPPER: last one at or before it."""
        candidates: list[int] = []
        hot = self.node.hot
        if tier != "cold" and hot is not None and self.hot_range[0] < self.hot_range[1]:
            low, high = self.hot_range
            hot_boundary: Literal["lower", "upper"] = "lower" if boundary is BoundaryType.LOWER else "upper"
            found = await asyncio.to_thread(
                hot.offset_for_timestamp, self.topic, self.queue_id, timestamp, hot_boundary
            )
            stamp = await asyncio.to_thread(hot.store_timestamp, self.topic, self.queue_id, min(found, high - 1))
            if _qualifies(found, high, stamp, timestamp, boundary):
                candidates.append(found)
        if tier != "hot" and self.cold is not None and self.cold_range[0] < self.cold_range[1]:
            low, high = self.cold_range
            found = min(await self.cold.find_queue_offset(timestamp, boundary), high)
            stamp = await self.cold.store_timestamp_of(await self.cold.consume_queue.read_unit(min(found, high - 1)))
            if _qualifies(found, high, stamp, timestamp, boundary):
                candidates.append(found)
        low, high = self.bounds(tier)
        if boundary is BoundaryType.LOWER:
            return min(candidates) if candidates else high
        return max(candidates) if candidates else low


def _qualifies(found: int, high: int, stamp: int, timestamp: int, boundary: BoundaryType) -> bool:
    if boundary is BoundaryType.LOWER:
        return found < high
    return found < high and stamp <= timestamp


# ---- printing ------------------------------------------------------------------------------------


def _resolve_format(cli: CliState, chosen: MessageFormat | None) -> MessageFormat:
    if chosen is not None:
        return chosen
    return "json" if cli.output.is_json else "text"


def lost_line(topic: str, queue_id: int, lost: tuple[int, int]) -> str:
    return (
        f"{topic}/{queue_id}: offsets [{lost[0]}, {lost[1]}) were lost before they were archived "
        f"({lost[1] - lost[0]} messages); skipped"
    )


def print_messages(cli: CliState, messages: Sequence[ReadMessage], fmt: MessageFormat) -> None:
    """text: one line each; json: one object per line (README "JSON output"); raw: the record bytes.

    A hole stepped over is a line of its own in text, ``lost_before`` in JSON, a note on stderr in raw.
    """
    for message in messages:
        lost = message.lost_before
        if fmt == "raw":
            if lost is not None:
                sys.stdout.buffer.flush()
                cli.output.note(lost_line(message.record.topic, message.record.queue_id, lost))
            sys.stdout.buffer.write(message.raw)
            continue
        fields = message_fields(message.record, tier=message.tier, size=len(message.raw))
        if fmt == "json":
            fields["lost_before"] = None if lost is None else {"from_offset": lost[0], "to_offset": lost[1]}
            cli.output.json(fields)
            continue
        if lost is not None:
            cli.output.console.print(
                lost_line(fields["topic"], fields["queue_id"], lost), markup=False, highlight=False, soft_wrap=True
            )
        body = fields["body"] if fields["body_encoding"] == "utf-8" else f"base64:{fields['body']}"
        keys = ",".join(fields["keys"]) or "-"
        line = (
            f"{fields['topic']}/{fields['queue_id']}@{fields['queue_offset']} [{fields['tier']}] "
            f"{iso(fields['store_timestamp'])} keys={keys} tags={fields['tags'] or '-'} body={body}"
        )
        cli.output.console.print(line, markup=False, highlight=False, soft_wrap=True)
    if fmt == "raw":
        sys.stdout.buffer.flush()


# ---- commands ------------------------------------------------------------------------------------

TopicArg = Annotated[str, typer.Argument(metavar="TOPIC", help="The topic.")]
QueueArg = Annotated[int, typer.Argument(metavar="QUEUE_ID", help="The queue id.")]
TierOption = Annotated[
    TierChoice, typer.Option("--tier", help="auto: hot while it holds the offset, else cold; or one tier only.")
]
FormatOption = Annotated[
    MessageFormat | None,
    typer.Option("--format", "-f", help="text, json (one object per line) or raw record bytes; default: --output."),
]


@app.command("read")
def read(
    ctx: typer.Context,
    topic: TopicArg,
    queue_id: QueueArg,
    offset: Annotated[int, typer.Option("--offset", min=0, help="First queue offset to print.")],
    count: Annotated[int, typer.Option("--count", "-n", min=1, help="How many messages at most.")] = 1,
    tier: TierOption = "auto",
    fmt: FormatOption = None,
) -> None:
    """Print messages of one queue from a queue offset on.

    Example: tieredstore read Orders 0 --offset 1200 --count 10 --tier cold --format json
    """
    cli = state(ctx)
    checked_topic(topic)
    checked_queue_id(queue_id)
    chosen = _resolve_format(cli, fmt)

    async def go() -> None:
        async with open_read_node(cli.config, hot=tier != "cold") as node:
            reader = await QueueReader.open(node, topic, queue_id, tier)
            remaining, position = count, offset
            while remaining > 0:
                batch = await reader.read(position, min(remaining, BATCH), tier)
                if not batch:
                    break
                print_messages(cli, batch.messages, chosen)
                remaining -= len(batch)
                position = batch.next_offset
            if remaining == count:
                # Nothing at or after the offset (yet): say what the queue holds, so an empty answer is not a puzzle.
                low, high = reader.bounds(tier)
                held = f"holds offsets [{low}, {high})" if low < high else "holds nothing"
                where = "" if tier == "auto" else f" in the {tier} tier"
                cli.output.note(f"no messages from offset {offset}: {topic}/{queue_id} {held}{where}")

    run(go())


@app.command("tail")
def tail(
    ctx: typer.Context,
    topic: TopicArg,
    queue_id: QueueArg,
    count: Annotated[int, typer.Option("--count", "-n", min=1, help="How many of the newest messages.")] = 10,
    follow: Annotated[bool, typer.Option("--follow", "-F", help="Keep printing new messages.")] = False,
    interval: Annotated[float, typer.Option(min=0.05, help="Seconds between polls with --follow.")] = 1.0,
    tier: TierOption = "auto",
    fmt: FormatOption = None,
) -> None:
    """Print the newest messages of a queue, and with --follow those that arrive after them.

    Example: tieredstore tail Orders 0 -n 20 --follow
    """
    cli = state(ctx)
    checked_topic(topic)
    checked_queue_id(queue_id)
    chosen = _resolve_format(cli, fmt)

    async def print_from(position: int | None) -> int:
        async with open_read_node(cli.config, hot=tier != "cold") as node:
            reader = await QueueReader.open(node, topic, queue_id, tier)
            low, high = reader.bounds(tier)
            if position is None:
                position = max(low, high - count)
            while position < high:
                batch = await reader.read(position, min(BATCH, high - position), tier)
                if not batch:
                    break
                print_messages(cli, batch.messages, chosen)
                position = batch.next_offset
            return position

    position = run(print_from(None))
    while follow:
        time.sleep(interval)
        position = run(print_from(position))


@app.command("offset-for-time")
def offset_for_time(
    ctx: typer.Context,
    topic: TopicArg,
    queue_id: QueueArg,
    when: Annotated[str, typer.Argument(metavar="TIME", help="Epoch ms, ISO-8601, now, or a time ago: 15m, 2h, 1d.")],
    boundary: Annotated[
        BoundaryType, typer.Option(case_sensitive=False, help="LOWER: first at/after TIME; UPPER: last at/before.")
    ] = BoundaryType.LOWER,
    tier: TierOption = "auto",
) -> None:
    """The queue offset of the first message stored at or after TIME (or the last at or before it).

    Example: tieredstore offset-for-time Orders 0 2024-05-01T12:00:00Z --boundary lower
    """
    cli = state(ctx)
    checked_topic(topic)
    checked_queue_id(queue_id)
    timestamp = parse_time(when)

    async def go() -> int:
        async with open_read_node(cli.config, hot=tier != "cold") as node:
            reader = await QueueReader.open(node, topic, queue_id, tier)
            return await reader.offset_for_time(timestamp, boundary, tier)

    found = run(go())
    cli.output.record(
        "offset",
        {
            "topic": topic,
            "queue_id": queue_id,
            "timestamp": timestamp,
            "boundary": boundary.value,
            "queue_offset": found,
        },
    )


@app.command("query-key")
def query_key(
    ctx: typer.Context,
    topic: TopicArg,
    key: Annotated[str, typer.Argument(help="A message key (KEYS) or unique key (UNIQ_KEY).")],
    since: Annotated[str | None, typer.Option(help="Stored at or after (epoch ms, ISO-8601, 1d ...).")] = None,
    until: Annotated[str | None, typer.Option(help="Stored at or before (epoch ms, ISO-8601, now ...).")] = None,
    max_count: Annotated[int, typer.Option("--max", min=1, help="At most this many messages.")] = 32,
    fmt: FormatOption = None,
) -> None:
    """Messages of a topic with this key, newest first: through the hot store's key index (messages not
    archived yet) and the cold one.

    Example: tieredstore query-key Orders order-4711 --since 7d --format json
    """
    cli = state(ctx)
    checked_topic(topic)
    begin = parse_time(since) if since is not None else 0
    end = parse_time(until) if until is not None else MAX_TIMESTAMP
    if begin > end:
        raise ValidationError(f"--since ({iso(begin)}) is after --until ({iso(end)})")
    chosen = _resolve_format(cli, fmt)
    found = run(_query_key(cli, topic, key, begin, end, max_count))
    if not found:
        # Not an error (scripts get an empty stream and exit 0), but a person should not see silence.
        window = "" if since is None and until is None else f" stored {iso(begin)} .. {iso(end)}"
        cli.output.note(f"no message of {topic} has the key {key!r}{window}")
    print_messages(cli, found, chosen)


async def _query_key(cli: CliState, topic: str, key: str, begin: int, end: int, max_count: int) -> list[ReadMessage]:
    found: dict[tuple[int, int], ReadMessage] = {}
    # Read-only beside a running producer: its key index finds what the archiver has not moved yet.
    hot = await asyncio.to_thread(open_hot_for_reading, cli.config)
    hot_knows_topic = False
    if hot is not None:
        try:
            hot_knows_topic = any(name == topic for name, _ in hot.queues())
            for hit in await asyncio.to_thread(hot.query_keys, topic, key, max_count, begin, end):
                found[(hit.queue_id, hit.queue_offset)] = ReadMessage("hot", hit.raw, hit.record)
        finally:
            hot.close()
    # A reader beside a running archiver: the key index is only queried, its directory left to the archiver.
    async with open_runtime(cli.config, hot=False, create_metadata=False, cold_owner=False) as runtime:
        try:
            topic_info = await asyncio.to_thread(runtime.metadata.get_topic, topic)
        except NotFoundError:
            if hot_knows_topic:
                return newest_first(found.values(), max_count)  # not archived yet: the hot store answered
            raise
        node = ReadNode(runtime.config, runtime.metadata, runtime.provider, runtime.flat, None)
        queues: dict[int, FlatMessageFile] = {}
        read: dict[tuple[int, int], ReadMessage] = {}

        async def confirm(topic_id: int, queue_id: int, queue_offset: int) -> Sequence[str]:
            if topic_id != topic_info.id:
                return []
            known = found.get((queue_id, queue_offset))
            if known is not None:
                return record_index_keys(known.record)
            flat_file = queues.get(queue_id)
            if flat_file is None:
                reader = await QueueReader.open(node, topic, queue_id)
                if reader.cold is None:
                    return []
                flat_file = queues[queue_id] = reader.cold
            low, high = archived_range(flat_file)
            if not low <= queue_offset < high or lost_range_at(flat_file, queue_offset) is not None:
                return []  # expired since it was indexed (a lost offset was never indexed)
            raws = await read_archived(flat_file, queue_offset, 1)
            if not raws:
                return []
            record = decode_message(raws[0], where=f"cold {topic}/{queue_id} at queue offset {queue_offset}")
            read[(queue_id, queue_offset)] = ReadMessage("cold", raws[0], record)
            return record_index_keys(record)

        for cold_hit in await runtime.keys.query(topic, topic_info.id, key, max_count, begin, end, confirm):
            where = (cold_hit.queue_id, cold_hit.queue_offset)
            if where not in found:
                found[where] = read[where]
        return newest_first(found.values(), max_count)
