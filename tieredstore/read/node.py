"""A node's read side opened beside its archiver: metadata, the cold provider and the hot store read-only.

A reader may run beside the archiver of the same node, so nothing here repairs anything: metadata is
opened without creating a database outside an existing data directory, and the hot store read-only
(no lock taken).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass

from tieredstore.config import TieredStoreConfig
from tieredstore.errors import NotFoundError
from tieredstore.flat.store import FlatFileStore
from tieredstore.local.hot_reader import HotReader
from tieredstore.local.store import LocalMessageStore
from tieredstore.local.store_dir import hot_store_at
from tieredstore.metadata import MetadataStore
from tieredstore.metadata.engine import parse_url, sqlite_path
from tieredstore.providers.base import Provider
from tieredstore.runtime import flat_file_settings, local_store_config, open_cold_provider


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
