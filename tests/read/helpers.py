"""Building blocks for the read-path tests: configs, a read-counting provider wrapper, archiving by hand."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytest

import tieredstore.runtime as runtime_module
from tieredstore.config import TieredStoreConfig
from tieredstore.flat import FlatMessageFile
from tieredstore.flat.message_file import RecordRun
from tieredstore.formats.message import MessageRecord, decode, tag_hash
from tieredstore.formats.naming import FileType
from tieredstore.index import IndexEntry
from tieredstore.providers.base import Provider
from tieredstore.providers.testing import FaultPlan, FaultyProvider, FaultySegment
from tieredstore.runtime import Runtime
from tieredstore.store import real_keys

BASE_TIMESTAMP = 1_786_000_000_000
HOUR_MS = 3_600_000


@dataclass
class ReadLog:
    """Every provider read, by file type, a switch that makes reads fail (a cold outage), and a gate.

    While ``gate`` is an unset event, every read waits for it (a slow store, to catch reads in flight).
    ``spared`` reads are let through first (a window's read passes, the prefetch its call starts does not).
    """

    reads: list[tuple[FileType, str, int, int]] = field(default_factory=list)
    failing: bool = False
    gate: asyncio.Event | None = None
    spared: int = 0

    def count(self, file_type: FileType | None = None) -> int:
        return sum(1 for read in self.reads if file_type is None or read[0] is file_type)

    def clear(self) -> None:
        self.reads.clear()


class CountingSegment(FaultySegment):
    log: ReadLog

    async def _observe(self, position: int, length: int) -> None:
        from tieredstore.errors import StorageUnavailableError

        if self.log.spared > 0:
            self.log.spared -= 1
        else:
            if self.log.gate is not None:
                await self.log.gate.wait()
            if self.log.failing:
                raise StorageUnavailableError(f"{self.key}: injected read outage")
        self.log.reads.append((self.file_type, self.key, position, length))

    async def _read(self, position: int, length: int) -> bytes:
        await self._observe(position, length)
        return await super()._read(position, length)

    async def _read_from(self, position: int, length: int) -> bytes:
        await self._observe(position, length)
        return await super()._read_from(position, length)


class CountingProvider(FaultyProvider):
    """Wraps any provider; records each ranged read that reaches storage."""

    scheme: ClassVar[str] = "counting"

    def __init__(self, inner: Provider, log: ReadLog) -> None:
        super().__init__(inner, FaultPlan())
        self.log = log

    def segment(
        self, file_type: FileType, path: str, base_offset: int, *, commit_position: int = 0, max_size: int | None = None
    ) -> CountingSegment:
        inner = self.inner.segment(file_type, path, base_offset, commit_position=commit_position, max_size=max_size)
        counted = CountingSegment(inner, self.plan)
        counted.log = self.log
        return counted


@contextmanager
def counting_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[ReadLog]:
    """Every runtime opened inside reads through a CountingProvider sharing one ReadLog."""
    log = ReadLog()
    original = runtime_module.open_cold_provider
    monkeypatch.setattr(runtime_module, "open_cold_provider", lambda config: CountingProvider(original(config), log))
    yield log
    monkeypatch.setattr(runtime_module, "open_cold_provider", original)


def make_config(
    tmp_path: Path,
    *,
    cold_url: str | None = None,
    s3_options: dict[str, Any] | None = None,
    metadata_url: str | None = None,
    read: dict[str, Any] | None = None,
    index: dict[str, Any] | None = None,
    hot: dict[str, Any] | None = None,
    segments: dict[str, Any] | None = None,
) -> TieredStoreConfig:
    values: dict[str, Any] = {
        "data_dir": tmp_path / "data",
        "cold_url": cold_url,
        "metadata_url": metadata_url,
        "read": read or {},
        "index": {"index_max_items": 1000, "index_slot_count": 64, **(index or {})},
        "hot": {"commit_log_file_size": 1 << 20, "max_message_size": 4096, **(hot or {})},
        "segments": segments or {},
    }
    if s3_options:
        values["s3"] = {k: v for k, v in s3_options.items() if k != "max_attempts"}
    return TieredStoreConfig.model_validate({k: v for k, v in values.items() if v is not None})


def config_for_backend(tmp_path: Path, backend: Any, **kwargs: Any) -> TieredStoreConfig:
    """A config whose cold URL is the provider_factory backend's (memory, posix or s3)."""
    return make_config(tmp_path, cold_url=backend.url, s3_options=backend.options or None, **kwargs)


def make_record(
    topic: str,
    queue_id: int,
    queue_offset: int,
    *,
    store_timestamp: int | None = None,
    body: bytes | None = None,
    keys: tuple[str, ...] = (),
    unique_key: str | None = None,
    tags: str | None = None,
) -> bytes:
    properties: dict[str, str] = {}
    if keys:
        properties["KEYS"] = " ".join(keys)
    if unique_key:
        properties["UNIQ_KEY"] = unique_key
    if tags:
        properties["TAGS"] = tags
    return MessageRecord(
        topic=topic,
        queue_id=queue_id,
        body=body if body is not None else f"m{queue_offset}".encode(),
        properties=properties,
        queue_offset=queue_offset,
        born_timestamp=BASE_TIMESTAMP,
        store_timestamp=BASE_TIMESTAMP + queue_offset if store_timestamp is None else store_timestamp,
    ).encode()


async def append_records(
    runtime: Runtime, topic: str, queue_id: int, records: list[bytes], *, commit_every: int = 4096, index: bool = True
) -> FlatMessageFile:
    """Archive encoded records straight into cold storage (as the dispatcher would), then index their keys."""
    flat_file = await runtime.flat.get_or_create(topic, queue_id)
    topic_id = (await asyncio.to_thread(runtime.metadata.get_or_create_topic, topic)).id
    entries = []
    for number, raw in enumerate(records, start=1):
        record = decode(raw)
        await flat_file.append_records(
            RecordRun.of([(raw, record.queue_offset, record.store_timestamp, tag_hash(record.tags))])
        )
        keys = [*record.keys, *([record.unique_key] if record.unique_key else [])]
        if keys:
            entries.append(
                IndexEntry(
                    topic, topic_id, queue_id, record.queue_offset, len(raw), record.store_timestamp, tuple(keys)
                )
            )
        if number % commit_every == 0:
            await flat_file.commit()
    await flat_file.commit()
    if index and entries:
        await runtime.index.put(entries)
    return flat_file


async def archive_hot(runtime: Runtime, topic: str, queue_id: int, end: int | None = None) -> FlatMessageFile:
    """Move the hot store's messages of one queue (up to ``end``) into cold storage, then index them."""
    hot = runtime.hot
    assert hot is not None
    flat_file = await runtime.flat.get_or_create(topic, queue_id)
    start = hot.min_offset(topic, queue_id) if flat_file.consume_queue.is_empty else flat_file.append_offset
    stop = hot.max_offset(topic, queue_id) if end is None else end
    records = []
    while start < stop:
        batch = hot.read_messages(topic, queue_id, start, min(4096, stop - start), 64 << 20)
        records.extend(message.raw for message in batch)
        start = batch[-1].queue_offset + 1
    return await append_records(runtime, topic, queue_id, records)


def keys_of(message: Any) -> list[str]:
    return real_keys(message)
