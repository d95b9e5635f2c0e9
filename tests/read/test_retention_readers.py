"""Readers beside an archiver whose maintenance pass just removed expired segments: an offset that is gone is
OFFSET_TOO_SMALL with the new minimum (the CLI's ``read``: exit 3), never a storage error, for a reader that had the
queue open (its view and read-ahead cache predate the deletion) and for a fresh one."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from tests.cli.helpers import Node
from tests.fixtures.backends import ProviderBackend
from tests.read.conftest import over_backends
from tests.read.helpers import BASE_TIMESTAMP, HOUR_MS, config_for_backend, make_record
from tieredstore.config import TieredStoreConfig
from tieredstore.dispatcher import Dispatcher
from tieredstore.errors import NotFoundError
from tieredstore.fetcher import GetMessageStatus, MessageFetcher
from tieredstore.read.node import open_read_node
from tieredstore.read.queue_reader import QueueReader
from tieredstore.runtime import Runtime, open_runtime
from tieredstore.store import AsyncTieredMessageStore

TOPIC = "Hourly"
# One message an hour for two days: the default rolling interval (24 h) cuts both files at offset 24.
MESSAGES = 48
FIRST_KEPT = 24


@asynccontextmanager
async def _archiver(config: TieredStoreConfig) -> AsyncIterator[tuple[Runtime, Dispatcher, list[int]]]:
    """An archiver whose clock the test moves: it has archived MESSAGES messages, one stored each hour."""
    now = [BASE_TIMESTAMP]
    async with open_runtime(config, recover=False) as runtime:
        runtime.flat.clock = lambda: now[0]
        await asyncio.to_thread(runtime.metadata.get_or_create_topic, TOPIC, reserve_hours=24)
        dispatcher = Dispatcher.from_runtime(runtime, clock_ms=lambda: now[0])
        await dispatcher.start()
        assert runtime.hot is not None
        for offset in range(MESSAGES):
            now[0] = BASE_TIMESTAMP + offset * HOUR_MS
            record = make_record(TOPIC, 0, offset, store_timestamp=now[0], body=bytes([offset]) * 64)
            await asyncio.to_thread(runtime.hot.restore_messages, TOPIC, 0, [record])
            await dispatcher.scan(force=True)
        try:
            yield runtime, dispatcher, now
        finally:
            await dispatcher.shutdown()


async def _expire_first_day(runtime: Runtime, dispatcher: Dispatcher, now: list[int]) -> None:
    """A maintenance pass once the first day's messages (offsets 0-23) are older than the topic's 24 h."""
    now[0] = BASE_TIMESTAMP + (FIRST_KEPT + 24) * HOUR_MS
    await dispatcher.maintain()
    assert runtime.flat.get(TOPIC, 0).min_offset == FIRST_KEPT


@over_backends
async def test_a_reader_that_had_the_queue_open_gets_offset_too_small_with_the_new_minimum(
    tmp_path: Path, provider_factory: ProviderBackend, migrated_metadata_url: str
) -> None:
    config = config_for_backend(tmp_path, provider_factory, metadata_url=migrated_metadata_url)
    async with (
        _archiver(config) as (runtime, dispatcher, now),
        AsyncTieredMessageStore.open(config, hot=False) as reader,
    ):
        # The reader has read the first day (its view names segment 0, its cache holds the window) ...
        first = await reader.get_messages(TOPIC, 0, 0, 8)
        assert [m.queue_offset for m in first.messages] == list(range(8))
        # ... and a part of it it has not read yet is still only named by its view.
        await _expire_first_day(runtime, dispatcher, now)
        for offset in (0, 8, 20):
            result = await reader.get_messages(TOPIC, 0, offset, 8)
            assert (result.status, result.next_begin_offset, result.min_offset) == (
                GetMessageStatus.OFFSET_TOO_SMALL,
                FIRST_KEPT,
                FIRST_KEPT,
            ), offset
        assert await reader.get_min_offset(TOPIC, 0) == FIRST_KEPT
        kept = await reader.get_messages(TOPIC, 0, FIRST_KEPT, 32)
        assert [m.queue_offset for m in kept.messages] == list(range(FIRST_KEPT, MESSAGES))


@over_backends
async def test_a_fresh_reader_gets_offset_too_small_with_the_new_minimum(
    tmp_path: Path, provider_factory: ProviderBackend, migrated_metadata_url: str
) -> None:
    config = config_for_backend(tmp_path, provider_factory, metadata_url=migrated_metadata_url)
    async with _archiver(config) as (runtime, dispatcher, now):
        await _expire_first_day(runtime, dispatcher, now)
        async with AsyncTieredMessageStore.open(config, hot=False) as reader:
            result = await reader.get_messages(TOPIC, 0, 3, 8)
            assert (result.status, result.next_begin_offset, result.min_offset) == (
                GetMessageStatus.OFFSET_TOO_SMALL,
                FIRST_KEPT,
                FIRST_KEPT,
            )


@pytest.mark.parametrize("provider_factory", ["posix", "s3"], indirect=True)
async def test_the_cli_read_below_the_new_minimum_exits_3_naming_it_also_with_a_view_loaded_before(
    tmp_path: Path, provider_factory: ProviderBackend, migrated_metadata_url: str
) -> None:
    config = config_for_backend(tmp_path, provider_factory, metadata_url=migrated_metadata_url)
    async with _archiver(config) as (runtime, dispatcher, now):
        async with open_read_node(config) as node:
            reader = await QueueReader.open(node, TOPIC, 0, "cold")
            await _expire_first_day(runtime, dispatcher, now)
            with pytest.raises(NotFoundError, match=f"below the min offset {FIRST_KEPT} "):
                await reader.read(2, 4, "cold")
        cli = Node("node", config.data_dir, config.cold_url, migrated_metadata_url, env=_s3_env(provider_factory))
        # The CLI runs its own event loop: in a thread, as in a process of its own.
        gone = await asyncio.to_thread(cli, "read", TOPIC, "0", "--offset", "2", "--tier", "cold")
        assert gone.exit_code == 3, gone.stderr
        assert f"min offset {FIRST_KEPT}" in gone.stderr and len(gone.stderr.strip().splitlines()) == 1
        kept = await asyncio.to_thread(cli, "read", TOPIC, "0", "--offset", str(FIRST_KEPT), "--tier", "cold")
        assert kept.exit_code == 0, kept.stderr


def _s3_env(backend: ProviderBackend) -> dict[str, str]:
    """The environment that points the CLI at the backend's S3 server (nothing for the others)."""
    options = backend.options
    names = {
        "endpoint_url": "TIEREDSTORE_S3__ENDPOINT_URL",
        "region": "TIEREDSTORE_S3__REGION",
        "access_key_id": "TIEREDSTORE_S3__ACCESS_KEY_ID",
        "secret_access_key": "TIEREDSTORE_S3__SECRET_ACCESS_KEY",
        "addressing_style": "TIEREDSTORE_S3__ADDRESSING_STYLE",
    }
    return {names[key]: str(value) for key, value in options.items() if key in names}


# POSIX only: on S3 a window ends with the object (one commit's chunk) holding its first record, and each of
# these messages was committed alone, so every call there takes the full path, which sees the new minimum.
@pytest.mark.parametrize("provider_factory", ["posix"], indirect=True)
async def test_a_reader_going_on_inside_its_cached_window_sees_the_new_minimum_within_read_ahead_ttl(
    tmp_path: Path, provider_factory: ProviderBackend, migrated_metadata_url: str
) -> None:
    config = config_for_backend(tmp_path, provider_factory, metadata_url=migrated_metadata_url)
    ttl = config.read.read_ahead_ttl
    now = [0.0]
    async with (
        _archiver(config) as (runtime, dispatcher, clock),
        open_runtime(config, hot=False, recover=False, cold_owner=False) as cold_side,
    ):
        fetcher = MessageFetcher(
            None, cold_side.flat, settings=config.read, read_only_cold=True, cache_clock=lambda: now[0]
        )
        try:
            first = await fetcher.get_messages(TOPIC, 0, 0, 8)
            assert [m.queue_offset for m in first.messages] == list(range(8))
            await _expire_first_day(runtime, dispatcher, clock)
            # Going on inside the window it holds, it is served from it a while (no metadata query per call) ...
            now[0] = 0.6 * ttl
            assert (await fetcher.get_messages(TOPIC, 0, 8, 8)).status is GetMessageStatus.FOUND
            # ... but no longer than read_ahead_ttl after it last looked, however often it reads the window.
            now[0] = ttl
            result = await fetcher.get_messages(TOPIC, 0, 16, 8)
            assert (result.status, result.next_begin_offset, result.min_offset) == (
                GetMessageStatus.OFFSET_TOO_SMALL,
                FIRST_KEPT,
                FIRST_KEPT,
            )
        finally:
            await fetcher.close()
