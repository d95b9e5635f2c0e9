"""Cold retention inside the running archiver: at default segment sizes, a queue's data is gone no later than its
topic's retention plus the rolling interval after it was stored, through the maintenance pass, whatever the traffic."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from tests.fixtures.backends import ProviderBackend
from tests.read.helpers import BASE_TIMESTAMP, HOUR_MS, config_for_backend, make_record
from tieredstore.config import SegmentSettings, TieredStoreConfig, load_config
from tieredstore.dispatcher import Dispatcher
from tieredstore.formats.consume_queue import UNIT_SIZE
from tieredstore.formats.naming import FileType
from tieredstore.metadata import SegmentStatus, upgrade
from tieredstore.runtime import Runtime, open_runtime

TOPIC = "Quiet"
RETENTION_HOURS = 24
# The default [segments] commit_log_rolling_interval.
ROLLING_HOURS = 24


class Clock:
    """The archiver's and the cold files' clock, moved by the test an hour at a time."""

    def __init__(self) -> None:
        self.now = BASE_TIMESTAMP

    def __call__(self) -> int:
        return self.now


@asynccontextmanager
async def _archiver(config: TieredStoreConfig, clock: Clock) -> AsyncIterator[tuple[Runtime, Dispatcher]]:
    async with open_runtime(config, recover=False) as runtime:
        runtime.flat.clock = clock  # before any queue is opened: every cold file rolls by this clock
        await asyncio.to_thread(runtime.metadata.get_or_create_topic, TOPIC, reserve_hours=RETENTION_HOURS)
        dispatcher = Dispatcher.from_runtime(runtime, clock_ms=clock)
        await dispatcher.start()
        try:
            yield runtime, dispatcher
        finally:
            await dispatcher.shutdown()


async def _store_one(runtime: Runtime, dispatcher: Dispatcher, offset: int, clock: Clock) -> None:
    """One message stored now (its store timestamp the clock's), archived at once."""
    assert runtime.hot is not None
    record = make_record(TOPIC, 0, offset, store_timestamp=clock.now)
    await asyncio.to_thread(runtime.hot.restore_messages, TOPIC, 0, [record])
    await dispatcher.scan(force=True)


def _sample(runtime: Runtime, name: str, **labels: str) -> float:
    return runtime.metrics.registry.get_sample_value(name, labels) or 0.0


@pytest.mark.parametrize("provider_factory", ["posix", "s3"], indirect=True)
async def test_a_queue_with_one_message_an_hour_expires_within_retention_plus_rolling_interval_at_default_sizes(
    tmp_path: Path, provider_factory: ProviderBackend, metadata_url: str
) -> None:
    upgrade(metadata_url)
    config = config_for_backend(tmp_path, provider_factory, metadata_url=metadata_url)
    assert config.segments == SegmentSettings()  # 1 GiB commit-log and 100 MiB consume-queue segments
    clock = Clock()
    bound_hours = RETENTION_HOURS + ROLLING_HOURS
    stored_at: dict[int, int] = {}
    async with _archiver(config, clock) as (runtime, dispatcher):
        with capture_logs() as logs:
            # One message an hour for 30 hours, then none: the queue goes quiet.
            for hour in range(30 + bound_hours + 2):
                clock.now = BASE_TIMESTAMP + hour * HOUR_MS
                if hour < 30:
                    await _store_one(runtime, dispatcher, hour, clock)
                    stored_at[hour] = clock.now
                await dispatcher.maintain()
                flat = runtime.flat.get(TOPIC, 0)
                # Every message stored longer than retention + rolling interval ago is gone from cold storage.
                gone = [offset for offset, at in stored_at.items() if clock.now - at >= bound_hours * HOUR_MS]
                assert flat.min_offset >= (max(gone) + 1 if gone else 0), f"hour {hour}: min {flat.min_offset}"
                # ... and nothing younger than the retention is.
                kept = [offset for offset, at in stored_at.items() if clock.now - at < RETENTION_HOURS * HOUR_MS]
                assert not kept or flat.min_offset <= min(kept)
                assert runtime.metadata.get_queue(TOPIC, 0).min_offset == flat.min_offset
        flat = runtime.flat.get(TOPIC, 0)
        assert (flat.min_offset, flat.archived_offset) == (30, 30)  # all of it expired, the position kept

        # What went is gone from the provider first, then recorded DELETED; each deletion was logged.
        deleted = {
            kind: runtime.metadata.list_segments(flat.path, kind, statuses=[SegmentStatus.DELETED])
            for kind in (FileType.COMMIT_LOG, FileType.CONSUME_QUEUE)
        }
        assert all(len(rows) == 2 for rows in deleted.values())  # hours 0-23, then 24-29 rolled by the pass
        for kind, rows in deleted.items():
            for row in rows:
                assert not await runtime.provider.segment(kind, flat.path, row.base_offset).exists()
        assert [row.base_offset for row in deleted[FileType.CONSUME_QUEUE]] == [0, 24 * UNIT_SIZE]
        logged = [entry for entry in logs if entry["event"] == "cold segment deleted by retention"]
        assert sorted((e["file_type"], e["base_offset"]) for e in logged) == sorted(
            (kind.value, row.base_offset) for kind, rows in deleted.items() for row in rows
        )
        assert {(e["topic"], e["queue_id"]) for e in logged} == {(TOPIC, 0)}

        # The metrics count them, and their bytes.
        for kind in (FileType.COMMIT_LOG, FileType.CONSUME_QUEUE):
            count = _sample(runtime, "tieredstore_retention_deleted_segments_total", topic=TOPIC, file_type=kind.value)
            assert count == 2
        assert _sample(runtime, "tieredstore_retention_deleted_bytes_total", topic=TOPIC) == sum(
            row.size for rows in deleted.values() for row in rows
        )

        # The quiet queue's open segments are empty and stay open: passes do not seal them.
        for _ in range(3):
            clock.now += ROLLING_HOURS * HOUR_MS
            await dispatcher.maintain()
        for kind in (FileType.COMMIT_LOG, FileType.CONSUME_QUEUE):
            [open_row] = runtime.metadata.list_segments(flat.path, kind, statuses=[SegmentStatus.NEW])
            assert open_row.size == 0 and not runtime.metadata.list_segments(
                flat.path, kind, statuses=[SegmentStatus.SEALED]
            )
        # The next message goes to the open segment the pass started, at the queue's position.
        await _store_one(runtime, dispatcher, 30, clock)
        flat = runtime.flat.get(TOPIC, 0)
        assert [s.base_offset for s in flat.consume_queue.segments] == [30 * UNIT_SIZE]
        assert (flat.min_offset, flat.archived_offset) == (30, 31)
        assert len(await flat.read_messages(30, 10)) == 1


def test_a_config_file_setting_the_removed_rolling_min_size_still_loads_and_says_it_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "tieredstore.toml"
    path.write_text("[segments]\ncommit_log_rolling_min_size = 16777216\ncommit_log_rolling_interval = 3600\n")
    with capture_logs() as logs:
        config = load_config(path)
    assert config.segments.commit_log_rolling_interval == 3600
    assert not hasattr(config.segments, "commit_log_rolling_min_size")
    [warning] = [entry for entry in logs if entry["log_level"] == "warning"]
    assert "commit_log_rolling_min_size is ignored" in warning["event"]
