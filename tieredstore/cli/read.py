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
from collections.abc import Sequence
from typing import Annotated, Literal

import typer

from tieredstore.basics import BoundaryType, check_queue_id
from tieredstore.cli.app import CliState, app, state
from tieredstore.cli.common import checked_topic, parse_time, run
from tieredstore.errors import NotFoundError, ValidationError
from tieredstore.flat.cold_reader import ColdQueueReader
from tieredstore.flat.message_file import FlatMessageFile
from tieredstore.index.service import newest_first
from tieredstore.local.index_file import record_index_keys
from tieredstore.read.archived import archived_range, lost_range_at, read_archived
from tieredstore.read.node import ReadNode, open_hot_for_reading, open_read_node
from tieredstore.read.queue_reader import QueueReader, ReadMessage, TierChoice
from tieredstore.read.records import decode_message, iso, message_fields
from tieredstore.runtime import open_runtime

MessageFormat = Literal["text", "json", "raw"]
BATCH = 256
MAX_TIMESTAMP = (1 << 63) - 1


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
    """text: one line each; json: one object per line (docs/reference/json-output.md); raw: the record bytes.

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
    check_queue_id(queue_id)
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
    check_queue_id(queue_id)
    chosen = _resolve_format(cli, fmt)

    cold_readers: list[ColdQueueReader | None] = [None]  # kept across polls: each follows the one before

    async def print_from(position: int | None) -> int:
        async with open_read_node(cli.config, hot=tier != "cold") as node:
            reader = await QueueReader.open(node, topic, queue_id, tier, cold_reader=cold_readers[0])
            low, high = reader.bounds(tier)
            if position is None:
                position = max(low, high - count)
            while position < high:
                batch = await reader.read(position, min(BATCH, high - position), tier)
                if not batch:
                    break
                print_messages(cli, batch.messages, chosen)
                position = batch.next_offset
            cold_readers[0] = reader.cold_reader
            return position

    async def print_and_follow() -> None:
        position = await print_from(None)
        while follow:
            await asyncio.sleep(interval)
            position = await print_from(position)

    run(print_and_follow())


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
    check_queue_id(queue_id)
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
