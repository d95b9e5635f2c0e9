"""``tieredstore put``: append messages read from stdin to the hot store, for scripts and tests.

Plain input is one body per line (the newline is not part of the body). ``--jsonl`` input is one JSON
object per line: ``body`` (text) or ``body_base64``, and optionally ``keys`` (a list or one string),
``tags`` and ``properties`` (an object of strings). Messages go in batches, each landing whole.
"""

from __future__ import annotations

import base64
import binascii
import json
import sys
from collections.abc import Iterator
from typing import Annotated, Any, BinaryIO

import typer

from tieredstore.basics import check_queue_id
from tieredstore.cli.app import app, state
from tieredstore.cli.common import checked_topic
from tieredstore.errors import TieredStoreError, ValidationError
from tieredstore.local.store import PutRequest, PutResult
from tieredstore.runtime import open_hot_store

BATCH = 1024


def _lines(stream: BinaryIO) -> Iterator[tuple[int, bytes]]:
    for number, line in enumerate(stream, start=1):
        yield number, line[:-1] if line.endswith(b"\n") else line


def _from_json(number: int, line: bytes, topic: str, queue_id: int) -> PutRequest:
    try:
        item = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValidationError(f"stdin line {number} is not JSON: {exc}") from exc
    if not isinstance(item, dict):
        raise ValidationError(f"stdin line {number} is not a JSON object")
    unknown = set(item) - {"body", "body_base64", "keys", "tags", "properties"}
    if unknown:
        raise ValidationError(f"stdin line {number} has unknown fields {sorted(unknown)}")
    if ("body" in item) == ("body_base64" in item):
        raise ValidationError(f"stdin line {number} needs exactly one of body or body_base64")
    body: bytes
    if "body" in item:
        if not isinstance(item["body"], str):
            raise ValidationError(f"stdin line {number}: body must be a string (use body_base64 for bytes)")
        body = item["body"].encode("utf-8")
    else:
        try:
            body = base64.b64decode(item["body_base64"], validate=True)
        except (binascii.Error, TypeError) as exc:
            raise ValidationError(f"stdin line {number}: body_base64 is not base64") from exc
    keys: Any = item.get("keys", [])
    if isinstance(keys, str):
        keys = keys.split()
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise ValidationError(f"stdin line {number}: keys must be a string or a list of strings")
    tags = item.get("tags")
    if tags is not None and not isinstance(tags, str):
        raise ValidationError(f"stdin line {number}: tags must be a string")
    properties = item.get("properties")
    if properties is not None and (
        not isinstance(properties, dict) or not all(isinstance(v, str) for v in properties.values())
    ):
        raise ValidationError(f"stdin line {number}: properties must be an object of strings")
    return PutRequest(topic, queue_id, body, keys=tuple(keys), tags=tags, properties=properties)


@app.command("put")
def put(
    ctx: typer.Context,
    topic: Annotated[str, typer.Argument(metavar="TOPIC", help="The topic.")],
    queue_id: Annotated[int, typer.Argument(metavar="QUEUE_ID", help="The queue id.")],
    key: Annotated[list[str] | None, typer.Option("--key", "-k", help="A key for every message (repeatable).")] = None,
    tag: Annotated[str | None, typer.Option("--tag", "-t", help="The tag of every message.")] = None,
    jsonl: Annotated[
        bool, typer.Option("--jsonl", help="Each line is {body|body_base64, keys, tags, properties}.")
    ] = False,
) -> None:
    """Append messages from stdin to the hot store: one body per line, or JSON lines with --jsonl.

    The hot store takes a writer lock: stop `tieredstore run` on this data directory first.

    Example: printf 'hello\\nworld\\n' | tieredstore put Orders 0 --key order-1 --tag created
    """
    cli = state(ctx)
    checked_topic(topic)
    check_queue_id(queue_id)
    if jsonl and (key or tag):
        raise typer.BadParameter("with --jsonl, keys and tags come from each line", param_hint="--key/--tag")
    results: list[PutResult] = []
    with open_hot_store(cli.config) as hot:
        batch: list[PutRequest] = []
        try:
            for number, line in _lines(sys.stdin.buffer):
                if jsonl:
                    if not line.strip():
                        continue
                    batch.append(_from_json(number, line, topic, queue_id))
                else:
                    batch.append(PutRequest(topic, queue_id, line, keys=tuple(key or ()), tags=tag))
                if len(batch) >= BATCH:
                    results.extend(hot.put_messages(batch))
                    batch = []
            if batch:
                results.extend(hot.put_messages(batch))
        except TieredStoreError:
            if results:
                cli.output.note(
                    f"{len(results)} messages were appended (offsets {results[0].queue_offset}.."
                    f"{results[-1].queue_offset}) before this error; the rest were not"
                )
            raise
    cli.output.record(
        "put",
        {
            "topic": topic,
            "queue_id": queue_id,
            "count": len(results),
            "first_offset": results[0].queue_offset if results else None,
            "next_offset": results[-1].queue_offset + 1 if results else None,
        },
    )
