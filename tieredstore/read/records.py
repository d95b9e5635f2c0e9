"""One record as a reader hands it on: decoded or checked whole, and its stable JSON shape for people and files."""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

from tieredstore.errors import CorruptRecordError
from tieredstore.formats.message import MessageRecord, decode, verify_record

Tier = Literal["hot", "cold"]


@contextmanager
def _one_record_at(where: str) -> Iterator[None]:
    """A CorruptRecordError from checking one record names ``where`` alone, not a byte position in it."""
    try:
        yield
    except CorruptRecordError as exc:
        raise CorruptRecordError(exc.reason, location=where) from exc


def verify_message(raw: bytes | memoryview, *, where: str) -> None:
    """``raw`` (one record) checked whole: magic, sizes, lengths, body CRC."""
    with _one_record_at(where):
        verify_record(raw)


def decode_message(raw: bytes, *, where: str) -> MessageRecord:
    """``raw`` (one record) decoded, every check made."""
    with _one_record_at(where):
        return decode(raw)


def iso(timestamp_ms: int | None) -> str | None:
    """A millisecond timestamp as ISO-8601 UTC for people; None stays None."""
    if timestamp_ms is None:
        return None
    moment = dt.datetime.fromtimestamp(timestamp_ms / 1000, tz=dt.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def body_fields(body: bytes) -> dict[str, str]:
    """``body`` as text when it is UTF-8, else base64, with ``body_encoding`` saying which."""
    try:
        return {"body": body.decode("utf-8"), "body_encoding": "utf-8"}
    except UnicodeDecodeError:
        return {"body": base64.b64encode(body).decode("ascii"), "body_encoding": "base64"}


def message_fields(record: MessageRecord, *, tier: Tier, size: int) -> dict[str, Any]:
    """The stable JSON shape of one message (documented in docs/reference/json-output.md)."""
    fields: dict[str, Any] = {
        "topic": record.topic,
        "queue_id": record.queue_id,
        "queue_offset": record.queue_offset,
        "tier": tier,
        "store_timestamp": record.store_timestamp,
        "born_timestamp": record.born_timestamp,
        "born_host": str(record.born_host),
        "store_host": str(record.store_host),
        "keys": record.keys,
        "tags": record.tags,
        "unique_key": record.unique_key,
        "properties": dict(record.properties),
        "size": size,
    }
    fields.update(body_fields(record.body))
    return fields
