"""The composition root: turn a TieredStoreConfig into the opened parts of one tieredstore node.

Every entry point (``tieredstore run``, the CLI, TieredMessageStore, Spark planning) builds its parts
here, so the mapping from config sections to constructor arguments exists once.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal, overload

import structlog

from tieredstore.config import ArchiverSettings, TieredStoreConfig
from tieredstore.errors import ConditionalWritesUnsupportedError, ConfigError, StorageUnavailableError
from tieredstore.flat.message_file import FlatFileSettings
from tieredstore.flat.store import FlatFileStore
from tieredstore.formats.naming import index_path
from tieredstore.index import IndexService
from tieredstore.index.catalogue import MetadataIndexCatalogue
from tieredstore.index.namespaces import KeyIndex, NamespaceClaim, claim_namespace
from tieredstore.index.service import namespace_path
from tieredstore.keys import cold_codecs, require_keys
from tieredstore.local.config import LocalStoreConfig
from tieredstore.local.follower import HotStoreFollower
from tieredstore.local.hot_reader import HotReader
from tieredstore.local.store import LocalMessageStore
from tieredstore.local.store_dir import refuse_non_directory
from tieredstore.local.store_lock import writer_lock_held
from tieredstore.metadata import MetadataStore
from tieredstore.metrics import Metrics
from tieredstore.providers.base import Provider
from tieredstore.providers.registry import open_provider, url_scheme
from tieredstore.providers.throttle import ThrottledProvider, UploadBudget
from tieredstore.providers.watchdog import WatchdogProvider

log = structlog.get_logger(__name__)

HotMode = Literal["auto", "writer", "follower"]


def local_store_config(config: TieredStoreConfig) -> LocalStoreConfig:
    hot = config.hot
    return LocalStoreConfig(
        commit_log_file_size=hot.commit_log_file_size,
        consume_queue_units_per_file=hot.consume_queue_units_per_file,
        max_message_size=hot.max_message_size,
        max_queues_per_topic=hot.max_queues_per_topic,
        flush_mode=hot.flush_mode,
        flush_interval=hot.flush_interval,
        hot_retention_hours=hot.hot_retention_hours,
        hot_disk_high_watermark=hot.hot_disk_high_watermark,
        index_slot_count=hot.index_slot_count,
        index_max_items=hot.index_max_items,
    )


def flat_file_settings(config: TieredStoreConfig) -> FlatFileSettings:
    segments = config.segments
    return FlatFileSettings(
        commit_log_max_size=segments.commit_log_max_size,
        consume_queue_max_size=segments.consume_queue_max_size,
        commit_log_rolling_interval=segments.commit_log_rolling_interval,
    )


def provider_options(config: TieredStoreConfig) -> dict[str, Any]:
    """Constructor options for the cold URL's provider: S3 settings for s3://, none otherwise."""
    return config.s3_options() if url_scheme(config.effective_cold_url) == "s3" else {}


def open_cold_provider(config: TieredStoreConfig) -> Provider:
    """The cold tier's provider, framing new segments as ``[cold]`` and ``[encryption]`` say and reading
    framed ones with the configured keyring."""
    provider = open_provider(config.effective_cold_url, **provider_options(config))
    provider.codecs = cold_codecs(config)
    return provider


def archiving_provider(provider: Provider, settings: ArchiverSettings, metrics: Metrics) -> Provider:
    """``provider`` as the archiver writes through it: each storage call bounded by ``commit_timeout``, and
    commits throttled to ``max_upload_bytes_per_second`` when it is set.

    The throttle is outside the watchdog, so a commit's wait for its upload budget never counts as a hang.
    """
    guarded: Provider = WatchdogProvider(provider, settings.commit_timeout)
    if settings.max_upload_bytes_per_second is None:
        return guarded
    budget = UploadBudget(settings.max_upload_bytes_per_second, on_wait=metrics.upload_throttled.inc)
    return ThrottledProvider(guarded, budget)


@overload
def open_hot_store(
    config: TieredStoreConfig, *, read_only: bool = False, mode: Literal["writer"] = "writer"
) -> LocalMessageStore: ...


@overload
def open_hot_store(config: TieredStoreConfig, *, read_only: bool = False, mode: HotMode) -> HotReader: ...


def open_hot_store(config: TieredStoreConfig, *, read_only: bool = False, mode: HotMode = "writer") -> HotReader:
    """The hot store as its writer, or (``follower``) following a writer in another process.

    ``auto`` follows when another process holds the directory's writer lock and writes otherwise
    (the embedded single-process setup). A follower is a HotReader only: it has no puts, and
    ``hot_writer`` refuses it to a caller that would write.
    """
    if mode not in ("auto", "writer", "follower"):
        raise ConfigError(f"hot mode must be auto, writer or follower, not {mode!r}")
    refuse_non_directory(config.hot_dir)
    local_config = local_store_config(config)
    if mode == "follower" or (mode == "auto" and writer_lock_held(config.hot_dir)):
        return HotStoreFollower(config.hot_dir, config=local_config)
    try:
        return LocalMessageStore(config.hot_dir, config=local_config, read_only=read_only)
    except ConfigError:
        if mode == "auto" and not read_only and writer_lock_held(config.hot_dir):
            # Another process took the lock between the look and the open.
            return HotStoreFollower(config.hot_dir, config=local_config)
        raise


async def check_conditional_writes(provider: Provider, metrics: Metrics) -> None:
    """The provider's check that storage refuses a second conditional create, counted when it asked storage.

    Storage unreachable now is not a reason to stop: the provider checks before its first write instead,
    and the archiver retries its commits until storage is back, as it does for any outage.
    """
    try:
        probed = await provider.check_conditional_writes()
    except ConditionalWritesUnsupportedError:
        metrics.conditional_write_probes.labels(result="ignored").inc()
        raise
    except StorageUnavailableError as error:
        log.warning("cold storage unreachable: conditional writes are checked before the first write", error=str(error))
        return
    if probed:
        metrics.conditional_write_probes.labels(result="honoured").inc()


@dataclass
class Runtime:
    """The opened parts of one node. ``hot`` is None when the caller asked for the cold side only."""

    config: TieredStoreConfig
    metadata: MetadataStore
    # The cold provider as opened; a cold owner's flat files and key index write through archiving_provider.
    provider: Provider
    flat: FlatFileStore
    # The key index this process writes (or, for a reader, the root namespace read-only) ...
    index: IndexService
    # ... and the whole broker's key index, every namespace: what queries and retention use.
    keys: KeyIndex
    metrics: Metrics
    hot: HotReader | None
    # False for a reader beside the archiver: cold queues are read through read-only views and the
    # key index is only queried, because recovery and index maintenance write what the archiver owns.
    cold_owner: bool = True


@asynccontextmanager
async def open_runtime(
    config: TieredStoreConfig,
    *,
    hot: bool = True,
    create_metadata: bool = True,
    recover: bool = True,
    metrics: Metrics | None = None,
    hot_mode: HotMode = "writer",
    cold_owner: bool = True,
    shared_index: bool = False,
) -> AsyncIterator[Runtime]:
    """Open metadata, the cold provider, the flat file store, the key index and (``hot``) the hot store.

    ``hot_mode`` is ``open_hot_store``'s ``mode``. ``recover`` loads and corrects every queue the
    metadata knows before yielding. ``cold_owner=False`` opens the cold side for reading only (no
    recovery, a read-only key index), which is what every process but the archiver must do.
    ``shared_index`` (archivers that share queues by lease) claims a key-index namespace of this
    process's own instead of writing the broker's root one (``tieredstore.index.namespaces``).
    A cold owner beside a hot store (an archiver) first checks that the keyring holds every key that wraps
    a live segment or uploaded index file (``tieredstore.keys.require_keys``, ConfigError otherwise).
    A cold owner also has the provider check that storage refuses a second conditional create
    (ConditionalWritesUnsupportedError before anything is written); readers do not.
    Everything is closed in reverse order on exit, also when opening
    a later part fails.
    """
    metrics = metrics or Metrics()
    async with AsyncExitStack() as stack:
        metadata = await asyncio.to_thread(MetadataStore.open, config.effective_metadata_url, create=create_metadata)
        stack.callback(metadata.close)
        provider = open_cold_provider(config)
        stack.push_async_callback(provider.close)
        await provider.prepare()
        if cold_owner and hot:
            # An archiver refuses to start rather than fail on the first segment its keyring cannot open.
            await asyncio.to_thread(require_keys, provider.codecs.keyring, metadata)
        if cold_owner:
            await check_conditional_writes(provider, metrics)
        # What the archiver writes (flat files, key index) goes through its watchdog and upload budget.
        writer = archiving_provider(provider, config.archiver, metrics) if cold_owner else provider
        hot_store: HotReader | None = None
        if hot:
            hot_store = await asyncio.to_thread(functools.partial(open_hot_store, config, mode=hot_mode))
            stack.callback(hot_store.close)
        flat = FlatFileStore(
            writer,
            metadata,
            cluster=config.cluster,
            broker=config.broker,
            settings=flat_file_settings(config),
        )
        if recover and cold_owner:
            await flat.recover()
        index_base = config.data_dir / "index"
        broker_index_path = index_path(config.cluster, config.broker)

        def open_namespace(namespace: str, read_only: bool) -> IndexService:
            return IndexService(
                index_base / namespace if namespace else index_base,
                writer,
                cluster=config.cluster,
                broker=config.broker,
                catalogue=MetadataIndexCatalogue(metadata, namespace_path(broker_index_path, namespace)),
                settings=config.index,
                read_only=read_only,
                namespace=namespace,
            )

        claim: NamespaceClaim | None = None
        if shared_index and cold_owner:
            claim = await asyncio.to_thread(claim_namespace, index_base)
            stack.callback(claim.release)
        index = open_namespace(claim.name if claim is not None else "", not cold_owner)
        await index.start()
        stack.push_async_callback(index.close)
        keys = KeyIndex(
            index,
            open_namespace,
            MetadataIndexCatalogue(metadata, broker_index_path).namespaces,
            base_directory=index_base,
            claim=claim,
        )
        stack.push_async_callback(keys.close)
        yield Runtime(
            config=config,
            metadata=metadata,
            provider=provider,
            flat=flat,
            index=index,
            keys=keys,
            metrics=metrics,
            hot=hot_store,
            cold_owner=cold_owner,
        )
