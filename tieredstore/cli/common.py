"""What the commands share: opening a node's parts for reading, archived queues without repair, times, messages.

A CLI command may run beside the archiver of the same node, so the read-side commands never repair
anything: metadata is opened without creating a database, the hot store read-only (no lock taken), and
a queue's cold files are loaded from the metadata rows as recorded — recovery, which truncates
unreferenced bytes, is the archiver's business. Reads are clamped to the archived offset, which
metadata records in the same transaction as the segment sizes.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import os
import re
import time
from collections.abc import AsyncIterator, Coroutine, Iterable, Iterator
from contextlib import AsyncExitStack, ExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from tieredstore.config import TieredStoreConfig
from tieredstore.errors import ArchiverRunningError, CorruptRecordError, NotFoundError, ValidationError
from tieredstore.flat.message_file import FlatMessageFile
from tieredstore.flat.store import FlatFileStore
from tieredstore.formats.message import MessageRecord, decode, verify_record
from tieredstore.formats.naming import FileType, validate_topic
from tieredstore.leases import SingleArchiverLock
from tieredstore.local.hot_reader import HotReader
from tieredstore.local.store import LocalMessageStore
from tieredstore.local.store_dir import hot_store_at
from tieredstore.metadata import (
    MetadataStore,
    QueuePosition,
    SegmentRecord,
    SegmentStatus,
)
from tieredstore.metadata.engine import parse_url, sqlite_path
from tieredstore.providers.base import Provider
from tieredstore.runtime import flat_file_settings, local_store_config, open_cold_provider

T = TypeVar("T")
Tier = Literal["hot", "cold"]
LIVE_STATUSES = (SegmentStatus.NEW, SegmentStatus.SEALED)


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """The async edge of a command."""
    return asyncio.run(coroutine)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# ---- opening the parts of a node ------------------------------------------------------------------


def open_metadata_for_reading(config: TieredStoreConfig) -> MetadataStore:
    """The metadata store. The embedded database is created empty, as the archiver would, but only
    inside an existing data directory: a mistyped ``--data-dir`` is NotFoundError, not a new tree."""
    url = config.effective_metadata_url
    parsed = parse_url(url)
    path = sqlite_path(parsed) if parsed.get_backend_name() == "sqlite" else None
    if path is not None and not path.exists() and not path.parent.is_dir():
        raise NotFoundError(f"no metadata database at {path} (its directory does not exist); check --data-dir")
    return MetadataStore.open(url, create=True)


def open_hot_for_reading(config: TieredStoreConfig) -> HotReader | None:
    """The node's hot store opened read-only (beside a running archiver), or None when there is none.

    A ``hot_dir`` the user set must be a store (``hot_store_at``); the default may be absent (a cold-only node).
    """
    if not hot_store_at(config.hot_dir, required=config.hot_dir_given):
        return None
    return LocalMessageStore(config.hot_dir, config=local_store_config(config), read_only=True)


@dataclass
class ReadNode:
    """The opened read side of a node; ``hot`` is None when not asked for or not present."""

    config: TieredStoreConfig
    metadata: MetadataStore
    provider: Provider
    flat: FlatFileStore
    hot: HotReader | None


@asynccontextmanager
async def open_read_node(config: TieredStoreConfig, *, hot: bool = False, cold: bool = True) -> AsyncIterator[ReadNode]:
    """Metadata, the cold provider (``cold``) and the hot store read-only (``hot``); closed in reverse."""
    if hot:
        # Before the metadata is opened (which may create the embedded database): a bad hot_dir changes nothing.
        hot_store_at(config.hot_dir, required=config.hot_dir_given)
    async with AsyncExitStack() as stack:
        metadata = await asyncio.to_thread(open_metadata_for_reading, config)
        stack.callback(metadata.close)
        provider = open_cold_provider(config)
        stack.push_async_callback(provider.close)
        hot_store = await asyncio.to_thread(open_hot_for_reading, config) if hot else None
        if hot_store is not None:
            stack.callback(hot_store.close)
        flat = FlatFileStore(
            provider, metadata, cluster=config.cluster, broker=config.broker, settings=flat_file_settings(config)
        )
        yield ReadNode(config, metadata, provider, flat, hot_store)


@contextmanager
def no_archiver_running(config: TieredStoreConfig, action: str) -> Iterator[None]:
    """Refuse to change cold storage beside a running archiver (its queues are open; it would write them
    again): with SQLite, hold its lock file meanwhile, so none can start either; with any database,
    refuse while an archiver's heartbeat is live (scale-out archivers hold leases, not the lock).

    Checked before anything else is opened (retention's runtime recovers, and so writes, cold files).
    """
    with ExitStack() as stack:
        lock = SingleArchiverLock.for_url(config.effective_metadata_url, action=action)
        if lock is not None:
            stack.enter_context(lock)
        with MetadataStore.open(config.effective_metadata_url, create=False) as metadata:
            live = metadata.live_archivers()
        if live:
            raise ArchiverRunningError(
                f"{len(live)} archiver(s) running on this metadata database: {', '.join(live)}; stop them "
                f"before {action} (a stopped archiver's heartbeat expires within its lease duration)"
            )
        yield


def archivers_seen_running(config: TieredStoreConfig, metadata: MetadataStore) -> list[str]:
    """The archivers that look alive on this metadata, found without taking their lock (a read-only
    command must not keep one from starting): live heartbeats, and with SQLite the lock file's last
    holder when that process still exists."""
    seen = metadata.live_archivers()
    lock = SingleArchiverLock.for_url(config.effective_metadata_url)
    if lock is None:
        return seen
    try:
        pid = int(lock.path.read_text(encoding="ascii").strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return seen  # no lock file, or its holder is gone (PermissionError: another user's, rare: ignored)
    return [*seen, f"pid {pid} on the SQLite lock"]


# ---- archived queues as recorded -------------------------------------------------------------------


def checked_topic(topic: str) -> str:
    """The topic if RocketMQ's rule allows it (this also refuses path tricks like ``../x``)."""
    return validate_topic(topic)


def checked_queue_id(queue_id: int) -> int:
    if queue_id < 0:
        raise ValidationError(f"queue id {queue_id} must not be negative")
    return queue_id


def segment_rows(
    metadata: MetadataStore, path: str, statuses: Iterable[SegmentStatus] = LIVE_STATUSES
) -> dict[FileType, list[SegmentRecord]]:
    return {
        file_type: metadata.list_segments(path, file_type.value, statuses=statuses)
        for file_type in (FileType.COMMIT_LOG, FileType.CONSUME_QUEUE)
    }


def archived_queue(
    flat: FlatFileStore, position: QueuePosition, rows: dict[FileType, list[SegmentRecord]]
) -> FlatMessageFile:
    """A queue's cold files exactly as metadata records them: read-only, nothing corrected or repaired."""
    return flat.read_only_file(position, rows.get(FileType.COMMIT_LOG, []), rows.get(FileType.CONSUME_QUEUE, []))


async def load_archived_queue(node: ReadNode, topic: str, queue_id: int) -> FlatMessageFile:
    """One queue's cold files as recorded; NotFoundError when the metadata has no such queue."""
    position = await asyncio.to_thread(node.metadata.get_queue, topic, queue_id)
    rows = await asyncio.to_thread(segment_rows, node.metadata, node.flat.queue_path(topic, queue_id))
    return archived_queue(node.flat, position, rows)


def archived_range(flat_file: FlatMessageFile) -> tuple[int, int]:
    """[min, archived) queue offsets that are readable from cold storage as recorded."""
    archived = min(flat_file.position.max_offset, flat_file.archived_offset)
    return min(flat_file.min_offset, archived), archived


def lost_range_at(flat_file: FlatMessageFile, queue_offset: int) -> tuple[int, int] | None:
    """The [start, end) offsets recorded as lost (never archived) that hold ``queue_offset``, if any.

    A reader jumps to ``end``: the first archived offset after the hole.
    """
    for start, end in flat_file.lost_ranges:
        if start <= queue_offset < end:
            return start, end
    return None


async def read_archived(flat_file: FlatMessageFile, queue_offset: int, count: int) -> list[bytes]:
    """Up to ``count`` consecutive archived records from ``queue_offset`` (never past the archived offset).

    A read stops where offsets recorded as lost begin; one starting inside them is NotFoundError
    (``lost_range_at`` says where the hole ends).
    """
    low, high = archived_range(flat_file)
    if queue_offset < low:
        raise NotFoundError(
            f"offset {queue_offset} of {flat_file.topic}/{flat_file.queue_id} is below the cold min offset {low}"
        )
    lost = lost_range_at(flat_file, queue_offset)
    if lost is not None:
        raise NotFoundError(
            f"offsets [{lost[0]}, {lost[1]}) of {flat_file.topic}/{flat_file.queue_id} were lost before they were "
            f"archived; the next archived offset is {lost[1]}"
        )
    count = min(count, high - queue_offset)
    if count <= 0:
        return []
    return await flat_file.read_messages(queue_offset, count)


# ---- time -----------------------------------------------------------------------------------------

_RELATIVE = re.compile(r"^-?(\d+(?:\.\d+)?)([smhd])(?:\s*ago)?$")
_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_time(text: str, *, now: int | None = None) -> int:
    """Epoch milliseconds from ``1700000000000``, ISO-8601 (``2024-05-01T12:00:00Z``; naive is UTC),
    ``now``, or a time before now: ``15m``, ``2h``, ``1d`` (also written ``-15m`` or ``15m ago``)."""
    value = text.strip()
    current = now_ms() if now is None else now
    if value == "now":
        return current
    if value.isdigit():
        return int(value)
    relative = _RELATIVE.match(value)
    if relative:
        return current - int(float(relative.group(1)) * _UNIT_MS[relative.group(2)])
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00") if value.endswith("Z") else value)
    except ValueError as exc:
        raise ValidationError(
            f"{text!r} is not a time: use epoch milliseconds, ISO-8601 (2024-05-01T12:00:00Z), now, or 15m/2h/1d (ago)"
        ) from exc
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return int(parsed.timestamp() * 1000)


_DURATION = re.compile(r"^(\d+)([smhd]?)$")


def parse_duration(text: str) -> int:
    """Seconds from ``30s``, ``15m``, ``72h`` or ``7d``; a bare number is hours. ValidationError below 1 s."""
    match = _DURATION.match(text.strip().lower())
    seconds = int(match.group(1)) * _UNIT_MS[match.group(2) or "h"] // 1000 if match else 0
    if seconds < 1:
        raise ValidationError(
            f"{text!r} is not a duration: use a positive whole number of s, m, h or d (30s, 15m, 72h, 7d)"
        )
    return seconds


def iso(timestamp_ms: int | None) -> str | None:
    """A millisecond timestamp as ISO-8601 UTC for people; None stays None."""
    if timestamp_ms is None:
        return None
    moment = dt.datetime.fromtimestamp(timestamp_ms / 1000, tz=dt.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


# ---- messages -------------------------------------------------------------------------------------


def body_fields(body: bytes) -> dict[str, str]:
    """``body`` as text when it is UTF-8, else base64, with ``body_encoding`` saying which."""
    try:
        return {"body": body.decode("utf-8"), "body_encoding": "utf-8"}
    except UnicodeDecodeError:
        return {"body": base64.b64encode(body).decode("ascii"), "body_encoding": "base64"}


def message_fields(record: MessageRecord, *, tier: Tier, size: int) -> dict[str, Any]:
    """The stable JSON shape of one message (documented in README, "JSON output")."""
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


def ensure_directory(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path
