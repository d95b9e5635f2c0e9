"""The dispatcher: flush triggers, batch bounds, concurrency, failures, lost ranges, start offsets, key index."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import structlog

from tests.archiver.helpers import Archive, PathFaultProvider, measure_reads
from tests.local.conftest import mapped_rss
from tieredstore.archiver import hot_pages as hot_pages_module
from tieredstore.errors import CorruptRecordError, StorageError
from tieredstore.fetcher import GetMessageStatus, MessageFetcher
from tieredstore.flat import FlatFileStore, check_queue_invariant
from tieredstore.formats.message import decode
from tieredstore.local import LocalMessageStore, LocalStoreConfig
from tieredstore.local import batch as batch_module
from tieredstore.local import follower as follower_module
from tieredstore.local.batch import HotBatch
from tieredstore.local.follower import HotStoreFollower
from tieredstore.providers.testing import FaultPlan, FaultyProvider

ALWAYS = 10**9


async def test_count_trigger_flushes_full_batches_and_goes_again_at_once(archive: Archive) -> None:
    dispatcher = archive.dispatcher(group_commit_count=10, group_commit_timeout=3600)
    archive.put("Orders", 0, 9)
    assert await dispatcher.scan() == 0
    archive.put("Orders", 0, 16)
    # 25 pending: one scan commits two full batches back to back and leaves the 5 below the threshold.
    assert await dispatcher.scan() == 20
    assert archive.archived("Orders", 0) == 20
    assert dispatcher.stats.commits == 2
    assert await dispatcher.scan(force=True) == 5
    assert archive.archived("Orders", 0) == 25
    assert await archive.check("Orders", 0) == []


async def test_timeout_trigger_waits_for_the_oldest_pending_message(archive: Archive) -> None:
    now = [time.time_ns() // 1_000_000]
    dispatcher = archive.dispatcher(group_commit_count=4096, group_commit_timeout=30)
    dispatcher.clock_ms = lambda: now[0]
    archive.put("Orders", 1, 3)
    assert await dispatcher.scan() == 0
    now[0] += 29_000
    assert await dispatcher.scan() == 0
    now[0] += 2_000
    assert await dispatcher.scan() == 3
    assert archive.archived("Orders", 1) == 3


async def test_a_message_larger_than_the_batch_size_is_archived_alone(archive: Archive) -> None:
    dispatcher = archive.dispatcher(group_commit_size=4096, group_commit_count=100, group_commit_timeout=0)
    archive.put("Big", 0, 2, size=100)
    archive.put("Big", 0, 1, size=200_000)
    archive.put("Big", 0, 2, size=100)
    result = await asyncio.wait_for(dispatcher.run_once(), timeout=10)
    assert result.failed == {}
    assert archive.archived("Big", 0) == 5
    # two small ones, the big one by itself, then the last two
    assert dispatcher.stats.commits == 3
    assert await archive.check("Big", 0) == []


async def test_the_archiver_leaves_no_hot_page_mapped_that_it_has_archived(archive: Archive) -> None:
    """The archiver reads each hot record once, through a mapping; what every queue has read is unmapped
    again, so its RSS does not keep the hot store it archived (here the writer's own puts mapped it)."""
    for n in range(800):  # 4 queues interleaved: every commit-log page holds records of each
        for queue_id in range(4):
            archive.hot.put_message("Paged", queue_id, bytes([n % 251]) * 4000)
    archive.hot.flush()  # a writer releases flushed pages only
    commit_log = archive.root / "hot" / "commitlog"
    assert mapped_rss(commit_log) >= 12 << 20
    dispatcher = archive.dispatcher(group_commit_count=64, group_commit_timeout=0)
    result = await asyncio.wait_for(dispatcher.run_once(), timeout=30)
    assert result.failed == {}
    assert [archive.archived("Paged", queue_id) for queue_id in range(4)] == [800] * 4
    assert mapped_rss(commit_log) <= 1 << 20
    for queue_id in range(4):  # unmapped is not gone: the hot copies still check out against the archive
        assert await archive.check("Paged", queue_id) == []


async def test_a_batch_read_unmaps_the_hot_pages_it_spans_as_it_copies_them(
    archive: Archive, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch of one queue among four spans the whole 12.8 MiB of commit log: the archiver's read leaves
    at most its shared window of it mapped (here made small), so its memory does not grow with the span
    of the queues it reads."""
    monkeypatch.setattr(hot_pages_module, "HOT_WINDOW_BYTES", 256 << 10)
    monkeypatch.setattr(batch_module, "UNMAP_STEP", 256 << 10)
    for n in range(800):
        for queue_id in range(4):
            archive.hot.put_message("Paged", queue_id, bytes([n % 251]) * 4000)
    archive.hot.close()  # reopened: nothing of the commit log is mapped yet (the puts mapped all of it)
    archive.hot = LocalMessageStore(archive.root / "hot", config=archive.hot.config)
    commit_log = archive.root / "hot" / "commitlog"
    assert mapped_rss(commit_log) <= 64 << 10
    after_reads = measure_reads(archive, monkeypatch)
    dispatcher = archive.dispatcher(group_commit_count=800, group_commit_timeout=0)
    result = await asyncio.wait_for(dispatcher.run_once(), timeout=30)
    assert result.failed == {}
    assert [archive.archived("Paged", queue_id) for queue_id in range(4)] == [800] * 4
    assert len(after_reads) >= 4
    assert max(after_reads) <= 1 << 20
    assert mapped_rss(commit_log) <= 1 << 20
    for queue_id in range(4):
        assert await archive.check("Paged", queue_id) == []


async def test_a_following_archiver_maps_only_a_window_of_the_hot_store_while_it_archives(
    archive: Archive, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Beside a producer (a follower), the archiver's mapped hot pages stay a window behind its reads
    instead of growing with the hot store: its peak RSS does not depend on how much it archives."""
    monkeypatch.setattr(hot_pages_module, "PAGE_RELEASE_BYTES", 256 << 10)
    monkeypatch.setattr(follower_module, "GROW_RELEASE_BYTES", 256 << 10)
    archive.put("Paged", 0, 3000, size=4000)
    archive.hot.close()
    commit_log = archive.root / "hot" / "commitlog"
    archive.hot = HotStoreFollower(archive.root / "hot", config=archive.hot.config)
    peak = 0
    read_batch = archive.hot.read_batch

    def measured_read_batch(*args: Any, **kwargs: Any) -> HotBatch:
        nonlocal peak
        batch = read_batch(*args, **kwargs)
        peak = max(peak, mapped_rss(commit_log))
        return batch

    monkeypatch.setattr(archive.hot, "read_batch", measured_read_batch)
    dispatcher = archive.dispatcher(group_commit_count=64, group_commit_timeout=0)
    result = await asyncio.wait_for(dispatcher.run_once(), timeout=30)
    assert result.failed == {}
    assert archive.archived("Paged", 0) == 3000
    assert sum(path.stat().st_size for path in commit_log.iterdir()) >= 12 << 20
    assert 0 < peak <= 2 << 20
    assert await archive.check("Paged", 0) == []


async def test_concurrency_across_queues_is_bounded(archive: Archive) -> None:
    plan = FaultPlan(commit_delay=0.02)
    archive.flat = FlatFileStore(FaultyProvider(archive.provider, plan), archive.metadata, cluster="T", broker="b")
    for queue_id in range(8):
        archive.put("Wide", queue_id, 30)
    dispatcher = archive.dispatcher(group_commit_count=10, max_pending_commits=3, group_commit_timeout=0)
    await dispatcher.run_once()
    assert plan.max_commits_in_flight == 3, "the storage saw as many commits at once as allowed, never more"
    for queue_id in range(8):
        assert archive.flat.get("Wide", queue_id).archived_offset == 30


async def test_a_queue_whose_storage_keeps_failing_does_not_block_the_others(archive: Archive) -> None:
    broken = FaultPlan(fail_before_landing=ALWAYS)
    provider = PathFaultProvider(archive.provider, {"Broken": broken})
    archive.flat = FlatFileStore(provider, archive.metadata, cluster="T", broker="b")
    dispatcher = archive.dispatcher(
        group_commit_count=5, group_commit_timeout=0, retry_initial_backoff=0.01, retry_max_backoff=0.05
    )
    archive.put("Broken", 0, 12)
    archive.put("Healthy", 0, 12)
    archive.put("Healthy", 1, 12)
    result = await asyncio.wait_for(dispatcher.run_once(max_attempts=3), timeout=10)
    assert set(result.failed) == {("Broken", 0)}
    assert "injected failure" in result.failed[("Broken", 0)]
    assert archive.archived("Healthy", 0) == 12 and archive.archived("Healthy", 1) == 12
    assert archive.archived("Broken", 0) == 0
    failures = archive.metrics.registry.get_sample_value("tieredstore_commit_failures_total", {"topic": "Broken"})
    assert failures is not None and failures >= 3
    assert archive.metrics.registry.get_sample_value("tieredstore_cold_storage_up") == 0

    broken.fail_before_landing = 0  # storage comes back: the kept buffer is committed, nothing twice
    await asyncio.sleep(0.1)
    result = await asyncio.wait_for(dispatcher.run_once(), timeout=10)
    assert result.failed == {}
    assert archive.archived("Broken", 0) == 12
    assert await archive.check("Broken", 0) == []


async def test_a_lost_reply_is_not_archived_twice(archive: Archive) -> None:
    plan = FaultPlan(fail_after_landing=3)
    archive.flat = FlatFileStore(FaultyProvider(archive.provider, plan), archive.metadata, cluster="T", broker="b")
    dispatcher = archive.dispatcher(group_commit_count=4, group_commit_timeout=0, retry_initial_backoff=0.01)
    archive.put("Orders", 0, 10)
    result = await asyncio.wait_for(dispatcher.run_once(), timeout=10)
    assert result.failed == {}
    assert archive.archived("Orders", 0) == 10
    assert await archive.check("Orders", 0) == []


async def test_a_range_the_hot_store_dropped_is_reported_and_skipped(archive: Archive) -> None:
    # The queue was registered at offset 0, then the hot store lost its first files before any archive.
    archive.put("Lossy", 0, 60, size=40_000)  # ~25 records per 1 MiB hot file
    archive.put("Other", 0, 5)
    archive.metadata.get_or_create_queue("Lossy", 0, start_offset=0)
    archive.hot.delete_expired(lambda topic, queue_id: 1 << 40, now_ms=1 << 60)
    hot_min = archive.hot.min_offset("Lossy", 0)
    assert hot_min > 0
    dispatcher = archive.dispatcher(group_commit_timeout=0)
    result = await asyncio.wait_for(dispatcher.run_once(), timeout=10)
    assert result.failed == {}
    assert archive.archived("Lossy", 0) == 60
    assert archive.flat.get("Lossy", 0).min_offset == hot_min
    lost = archive.metrics.registry.get_sample_value("tieredstore_lost_messages_total", {"topic": "Lossy"})
    assert lost == hot_min
    assert dispatcher.stats.lost_messages == hot_min
    assert await archive.check("Lossy", 0) == []
    assert archive.archived("Other", 0) == 5


async def test_a_range_lost_after_cold_data_is_skipped_and_the_queue_goes_on(archive: Archive) -> None:
    dispatcher = archive.dispatcher(group_commit_timeout=0)
    archive.put("Lossy", 0, 10)
    await dispatcher.run_once()
    assert archive.archived("Lossy", 0) == 10
    early = {m.queue_offset: m.raw for m in archive.hot.read_messages("Lossy", 0, 0, 10)}
    # The hot store then drops files holding messages the archiver never got (it was down, say).
    archive.put("Lossy", 0, 60, size=40_000)
    archive.hot.delete_expired(lambda topic, queue_id: 1 << 40, now_ms=1 << 60)
    hot_min = archive.hot.min_offset("Lossy", 0)
    assert hot_min > 10
    archive.put("Lossy", 0, 3)

    result = await asyncio.wait_for(dispatcher.run_once(), timeout=10)
    assert result.failed == {}
    assert archive.archived("Lossy", 0) == 73
    flat_file = archive.flat.get("Lossy", 0)
    assert flat_file.lost_ranges == [(10, hot_min)]
    lost = archive.metrics.registry.get_sample_value("tieredstore_lost_messages_total", {"topic": "Lossy"})
    assert lost == hot_min - 10 == dispatcher.stats.lost_messages

    def reference() -> dict[int, bytes]:
        later = archive.hot.read_messages("Lossy", 0, hot_min, 1 << 20, 1 << 40)
        return early | {m.queue_offset: m.raw for m in later}

    assert await check_queue_invariant(flat_file, reference=reference()) == []

    # Readers see the gap as OFFSET_FOUND_NULL pointing past it, and the messages after it from cold storage.
    fetcher = MessageFetcher(None, archive.flat)
    into_gap = await fetcher.get_messages("Lossy", 0, 10)
    assert (into_gap.status, into_gap.next_begin_offset) == (GetMessageStatus.OFFSET_FOUND_NULL, hot_min)
    before_gap = await fetcher.get_messages("Lossy", 0, 7, max_count=32)
    assert [m.queue_offset for m in before_gap.messages] == [7, 8, 9] and before_gap.next_begin_offset == 10
    after_gap = await fetcher.get_messages("Lossy", 0, hot_min, max_count=2)
    assert after_gap.status is GetMessageStatus.FOUND
    assert [(m.queue_offset, m.tier) for m in after_gap.messages] == [(hot_min, "cold"), (hot_min + 1, "cold")]
    hot_copy = archive.hot.read_messages("Lossy", 0, hot_min, 1, 1 << 30)[0]
    assert after_gap.messages[0].body == decode(hot_copy.raw).body

    # A restart keeps the gap, and archiving goes on after it.
    restarted = FlatFileStore(archive.provider, archive.metadata, cluster="TestCluster", broker="broker-a")
    archive.flat = restarted
    archive.put("Lossy", 0, 2)
    result = await asyncio.wait_for(archive.dispatcher(group_commit_timeout=0).run_once(), timeout=10)
    assert result.failed == {}
    assert restarted.get("Lossy", 0).lost_ranges == [(10, hot_min)]
    assert archive.archived("Lossy", 0) == 75
    assert await check_queue_invariant(restarted.get("Lossy", 0), reference=reference()) == []


@pytest.mark.parametrize("start_from", ["earliest", "latest", "timestamp"])
async def test_start_from_on_first_sight_of_a_queue(archive: Archive, start_from: str) -> None:
    archive.put("Fresh", 0, 4)
    await asyncio.sleep(0.005)
    boundary = time.time_ns() // 1_000_000
    await asyncio.sleep(0.005)
    archive.put("Fresh", 0, 3)
    setting = str(boundary) if start_from == "timestamp" else start_from
    dispatcher = archive.dispatcher(start_from=setting, group_commit_timeout=0)
    await dispatcher.run_once()
    archive.put("Fresh", 0, 2)
    await dispatcher.run_once()
    flat_file = archive.flat.get("Fresh", 0)
    expected_first = {"earliest": 0, "latest": 7, "timestamp": 4}[start_from]
    assert flat_file.min_offset == expected_first
    assert flat_file.archived_offset == 9
    assert await archive.check("Fresh", 0) == []


async def test_keys_are_indexed_after_the_commit(archive: Archive) -> None:
    dispatcher = archive.dispatcher(group_commit_count=7, group_commit_timeout=0)
    archive.put("Keyed", 2, 20, keyed=True)
    await dispatcher.run_once()
    topic_id = archive.metadata.get_topic("Keyed").id

    async def confirm(_topic_id: int, queue_id: int, queue_offset: int) -> list[str]:
        return archive.hot.get_message("Keyed", queue_id, queue_offset).keys

    hits = await archive.index.query("Keyed", topic_id, "Keyed-2-13", 10, 0, 1 << 62, confirm)
    assert [(h.queue_id, h.queue_offset) for h in hits] == [(2, 13)]
    assert await archive.index.query("Keyed", topic_id, "Keyed-2-99", 10, 0, 1 << 62, confirm) == []


async def test_key_index_metrics_count_items_files_and_failed_uploads(archive: Archive) -> None:
    dispatcher = archive.dispatcher(group_commit_count=7, group_commit_timeout=0)
    archive.put("Keyed", 1, 20, keyed=True)
    archive.put("Plain", 0, 5)
    await dispatcher.run_once()
    registry = archive.metrics.registry
    assert registry.get_sample_value("tieredstore_index_items_total") == 20
    await dispatcher.maintain()
    assert registry.get_sample_value("tieredstore_index_files", {"status": "UNSEALED"}) == 1
    # Cold storage refusing every write: the file is sealed, its upload fails and is counted.
    archive.index.provider = FaultyProvider(archive.provider, FaultPlan(fail_before_landing=ALWAYS))
    await archive.index.seal_current()
    await dispatcher.maintain()
    assert registry.get_sample_value("tieredstore_index_upload_failures_total") == 1
    assert registry.get_sample_value("tieredstore_index_files", {"status": "SEALED"}) == 1
    archive.index.provider = archive.provider  # storage is back: the next pass uploads it
    await dispatcher.maintain()
    assert registry.get_sample_value("tieredstore_index_files", {"status": "UPLOAD"}) == 1
    assert registry.get_sample_value("tieredstore_index_files", {"status": "SEALED"}) == 0
    assert registry.get_sample_value("tieredstore_index_upload_failures_total") == 1


async def test_a_restarted_dispatcher_continues_where_the_archive_ends(archive: Archive) -> None:
    first = archive.dispatcher(group_commit_timeout=0)
    archive.put("Orders", 0, 10)
    await first.run_once()
    archive.put("Orders", 0, 10)
    archive.flat = FlatFileStore(archive.provider, archive.metadata, cluster="TestCluster", broker="broker-a")
    second = archive.dispatcher(group_commit_timeout=0)
    await second.run_once()
    assert second.stats.messages == 10
    assert archive.archived("Orders", 0) == 20
    assert await archive.check("Orders", 0) == []


async def test_lag_gauge_and_dispatched_counters(archive: Archive) -> None:
    dispatcher = archive.dispatcher(group_commit_count=10, group_commit_timeout=3600)
    archive.put("Orders", 3, 15, size=50)
    await dispatcher.scan()
    registry = archive.metrics.registry
    assert registry.get_sample_value("tieredstore_queue_lag_messages", {"topic": "Orders", "queue_id": "3"}) == 5
    assert registry.get_sample_value("tieredstore_dispatched_messages_total", {"topic": "Orders"}) == 10
    dispatched_bytes = registry.get_sample_value("tieredstore_dispatched_bytes_total", {"topic": "Orders"})
    assert dispatched_bytes == sum(m.unit.size for m in archive.hot.read_messages("Orders", 3, 0, 10, 1 << 30))
    assert registry.get_sample_value("tieredstore_commit_seconds_count") == 1


async def test_a_failing_hot_read_backs_off_that_queue_without_blocking_the_others(archive: Archive) -> None:
    """A hot read that fails (say a record the writer is still recovering) must not kill the queue's task:
    the queue retries with backoff, the others go on, and cold storage is not reported down."""
    dispatcher = archive.dispatcher(
        group_commit_count=5, group_commit_timeout=0, retry_initial_backoff=0.01, retry_max_backoff=0.05
    )
    archive.put("Flaky", 0, 12)
    archive.put("Steady", 0, 12)
    read_batch = archive.hot.read_batch
    failures_left = {"Flaky": 2}

    def flaky_read(topic: str, queue_id: int, *args: Any, **kwargs: Any) -> Any:
        if failures_left.get(topic, 0) > 0:
            failures_left[topic] -= 1
            raise CorruptRecordError("hot record changed after it was checked", location=f"{topic}/{queue_id}")
        return read_batch(topic, queue_id, *args, **kwargs)

    archive.hot.read_batch = flaky_read  # type: ignore[method-assign]
    result = await asyncio.wait_for(dispatcher.run_once(max_attempts=5), timeout=10)
    assert result.failed == {}
    assert failures_left["Flaky"] == 0, "the failing read was retried"
    assert archive.archived("Flaky", 0) == 12 and archive.archived("Steady", 0) == 12
    assert await archive.check("Flaky", 0) == []
    assert archive.metrics.registry.get_sample_value("tieredstore_cold_storage_up") != 0


async def test_a_timestamp_the_hot_store_cannot_read_does_not_end_the_scan(archive: Archive) -> None:
    """The scan reads each queue's oldest pending STORETIMESTAMP to time its flush; a record that does not
    check out there (a follower just after the writer restarted) made the whole archiver process exit.
    The queue is made due instead, so that its batch read deals with it like any hot-side failure."""
    dispatcher = archive.dispatcher(group_commit_count=4096, group_commit_timeout=3600)
    archive.put("Orders", 0, 3)
    store_timestamp = archive.hot.store_timestamp
    failures_left = [1]

    def unreadable(topic: str, queue_id: int, queue_offset: int) -> int:
        if failures_left[0]:
            failures_left[0] -= 1
            raise CorruptRecordError("6 bytes are too few for a record's SYSFLAG", offset=0)
        return store_timestamp(topic, queue_id, queue_offset)

    archive.hot.store_timestamp = unreadable  # type: ignore[method-assign]
    # Not due by count (3 of 4096) nor by time (an hour): archived at once only because the timestamp failed.
    assert await dispatcher.scan() == 3
    assert failures_left == [0] and archive.archived("Orders", 0) == 3
    assert await archive.check("Orders", 0) == []


@pytest.mark.parametrize("opening", ["fails", "succeeds"])
async def test_a_queue_lost_while_its_cold_queue_opens_is_let_go(archive: Archive, opening: str) -> None:
    # A lease round can find a queue lost (and unload it) while its cold queue is still opening.
    dispatcher = archive.dispatcher()
    archive.put("Contested", 0, 3)
    await dispatcher.start()
    open_queue = dispatcher._open_queue

    async def open_then_lose(worker: Any) -> None:
        await open_queue(worker)
        dispatcher._unload(worker)
        if opening == "fails":
            raise StorageError("the cold tier went away mid-open")

    dispatcher._open_queue = open_then_lose  # type: ignore[method-assign]
    assert await dispatcher._opened_worker("Contested", 0) is None  # no KeyError escapes the dispatcher
    assert ("Contested", 0) not in dispatcher._queues
    dispatcher._open_queue = open_queue  # type: ignore[method-assign]
    # Leased again later, the queue is opened afresh and archives normally.
    result = await asyncio.wait_for(dispatcher.run_once(), timeout=10)
    assert result.failed == {}
    assert archive.archived("Contested", 0) == 3
    assert await archive.check("Contested", 0) == []


async def test_a_hot_store_behind_the_archive_is_reported_once_and_archiving_goes_on_past_it(
    archive: Archive, tmp_path: Path
) -> None:
    archive.put("Orders", 0, 20)
    await archive.dispatcher(group_commit_timeout=0).run_once()
    assert archive.archived("Orders", 0) == 20
    # The node's disk is replaced: an empty hot store, into which producers write from offset 0 again.
    archive.hot.close()
    archive.hot = LocalMessageStore(tmp_path / "new-hot", config=LocalStoreConfig(commit_log_file_size=8 << 20))
    archive.put("Orders", 0, 5)
    dispatcher = archive.dispatcher(group_commit_timeout=0)

    def behind_reports() -> float:
        value = archive.metrics.registry.get_sample_value("tieredstore_hot_behind_archive_total", {"topic": "Orders"})
        return value or 0.0

    with structlog.testing.capture_logs() as logs:
        assert (await dispatcher.run_once()).failed == {}
        await dispatcher.run_once()
    errors = [entry for entry in logs if entry["log_level"] == "error"]
    assert len(errors) == 1, "said once, not on every scan"
    assert "restore" in errors[0]["event"]
    assert (errors[0]["topic"], errors[0]["queue_id"], errors[0]["hot_max"], errors[0]["archived"]) == (
        "Orders",
        0,
        5,
        20,
    )
    assert behind_reports() == 1
    assert archive.archived("Orders", 0) == 20, "nothing archived at offsets the archive already holds"

    archive.put("Orders", 0, 20)  # offsets 5..24: the archive goes on from 20
    with structlog.testing.capture_logs() as logs:
        await dispatcher.run_once()
    assert archive.archived("Orders", 0) == 25
    assert [entry["log_level"] for entry in logs if "hot store reached" in entry["event"]] == ["warning"]
    archived = await archive.flat.get("Orders", 0).read_messages(20, 5)
    hot = archive.hot.read_messages("Orders", 0, 20, 5, 1 << 20)
    assert [decode(raw).body for raw in archived] == [decode(m.raw).body for m in hot]
    assert behind_reports() == 1
