"""Helpers for archiver tests: the parts of one archiver, a per-queue fault wrapper and hot-copy references."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tests.local.conftest import mapped_rss
from tieredstore.config import ArchiverSettings, IndexSettings
from tieredstore.dispatcher import Dispatcher
from tieredstore.flat import FlatFileStore, check_queue_invariant
from tieredstore.index import IndexService
from tieredstore.local import LocalMessageStore, LocalStoreConfig
from tieredstore.local.batch import HotBatch
from tieredstore.metadata import MetadataStore
from tieredstore.metrics import Metrics
from tieredstore.providers.base import FileSegment, Provider
from tieredstore.providers.memory import MemoryProvider
from tieredstore.providers.testing import FaultPlan, FaultyProvider, FaultySegment


@dataclass
class Archive:
    """A hot store, metadata, a cold provider, the flat file store over them and a key index."""

    root: Path
    hot: LocalMessageStore
    metadata: MetadataStore
    provider: Provider
    metrics: Metrics = field(default_factory=Metrics)
    flat: FlatFileStore = field(init=False)
    index: IndexService = field(init=False)

    async def open(self) -> None:
        self.flat = FlatFileStore(self.provider, self.metadata, cluster="TestCluster", broker="broker-a")
        self.index = IndexService(
            self.root / "index",
            self.provider,
            cluster="TestCluster",
            broker="broker-a",
            settings=IndexSettings(index_max_items=10_000, index_slot_count=1024),
        )
        await self.index.start()

    async def close(self) -> None:
        await self.index.close()
        await self.provider.close()
        self.hot.close()
        self.metadata.close()

    def dispatcher(self, **settings: Any) -> Dispatcher:
        return Dispatcher(
            self.hot,
            self.flat,
            metadata=self.metadata,
            index=self.index,
            settings=ArchiverSettings(**settings),
            metrics=self.metrics,
        )

    def put(self, topic: str, queue_id: int, count: int, *, size: int = 100, keyed: bool = False) -> None:
        for n in range(count):
            body = bytes([n % 251]) * size
            keys = [f"{topic}-{queue_id}-{n}"] if keyed else []
            self.hot.put_message(topic, queue_id, body, keys=keys, tags=f"tag{n % 3}")

    async def check(self, topic: str, queue_id: int) -> list[str]:
        """Archive-invariant problems of one queue against the hot copy (empty when all is well)."""
        flat_file = self.flat.get(topic, queue_id)
        reference = {
            m.queue_offset: m.raw
            for m in await asyncio.to_thread(
                self.hot.read_messages, topic, queue_id, flat_file.min_offset, 1 << 20, 1 << 40
            )
        }
        return [str(p) for p in await check_queue_invariant(flat_file, reference=reference)]

    def archived(self, topic: str, queue_id: int) -> int:
        return self.metadata.get_queue(topic, queue_id).max_offset


@contextlib.asynccontextmanager
async def open_archive(root: Path, hot_config: LocalStoreConfig) -> AsyncIterator[Archive]:
    """A fresh archive under ``root`` on a memory provider, closed and wiped on exit."""
    name = f"archiver-{uuid.uuid4().hex}"
    hot = LocalMessageStore(root / "hot", config=hot_config)
    metadata = MetadataStore.open(f"sqlite:///{root / 'metadata.db'}")
    parts = Archive(root, hot, metadata, MemoryProvider(f"memory://{name}"))
    await parts.open()
    try:
        yield parts
    finally:
        await parts.close()
        MemoryProvider.wipe(name)


class PathFaultProvider(FaultyProvider):
    """Faults for the segments under some logical paths only (one queue's storage failing, the rest fine)."""

    scheme: ClassVar[str] = "faulty-path"

    def __init__(self, inner: Provider, plans: dict[str, FaultPlan], default: FaultPlan | None = None) -> None:
        super().__init__(inner, default or FaultPlan())
        self.plans = plans

    def wrap(self, segment: FileSegment) -> FaultySegment:
        path = segment.segment_id.path
        plan = next((p for prefix, p in self.plans.items() if f"/{prefix}/" in f"/{path}/"), self.plan)
        return FaultySegment(segment, plan)


def measure_reads(archive: Archive, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The hot commit log's resident bytes after each batch read, from now on (appended as they come)."""
    commit_log = archive.root / "hot" / "commitlog"
    after_reads: list[int] = []
    read_batch = archive.hot.read_batch

    def measured_read_batch(*args: Any, **kwargs: Any) -> HotBatch:
        batch = read_batch(*args, **kwargs)
        after_reads.append(mapped_rss(commit_log))
        return batch

    monkeypatch.setattr(archive.hot, "read_batch", measured_read_batch)
    return after_reads
