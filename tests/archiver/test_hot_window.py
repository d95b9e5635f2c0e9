"""The archiver's shared hot window: the hot commit log its batch reads leave mapped for the other queues.

Queues written together have their records interleaved in the hot commit log, so the archiver keeps the
pages one queue's batch mapped for the next queues' batches; its memory must still not grow with the
hot store it archives, nor with how far one queue lags behind the others.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.archiver.helpers import Archive, PathFaultProvider, measure_reads
from tests.local.conftest import mapped_rss
from tieredstore.archiver import hot_pages as hot_pages_module
from tieredstore.flat import FlatFileStore
from tieredstore.local import LocalMessageStore
from tieredstore.local import batch as batch_module
from tieredstore.providers.testing import FaultPlan

WINDOW = 2 << 20
STEP = 512 << 10
# What a fault maps around the last record read, per file mapped.
AROUND = 256 << 10


def fill(archive: Archive, topics: dict[str, int], rounds: int) -> None:
    """``rounds`` 4000-byte messages per queue, the queues of ``topics`` interleaved record by record;
    then the store reopened, so that nothing of it is mapped before the archiver reads it."""
    for n in range(rounds):
        for topic, queues in topics.items():
            for queue_id in range(queues):
                archive.hot.put_message(topic, queue_id, bytes([n % 251]) * 4000)
    archive.hot.close()
    archive.hot = LocalMessageStore(archive.root / "hot", config=archive.hot.config)


@pytest.fixture(autouse=True)
def small_window(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hot_pages_module, "HOT_WINDOW_BYTES", WINDOW)
    monkeypatch.setattr(batch_module, "UNMAP_STEP", STEP)


async def test_archiving_a_hot_store_many_windows_long_keeps_only_the_window_mapped(
    archive: Archive, monkeypatch: pytest.MonkeyPatch
) -> None:
    """8 queues interleaved over 19 MiB of commit log, each batch spread over 2 MiB of it: the pages the
    archiver holds mapped stay within the window (and the step each read is unmapping), never the log."""
    fill(archive, {"Wide": 8}, rounds=600)
    after_reads = measure_reads(archive, monkeypatch)
    dispatcher = archive.dispatcher(group_commit_count=64, group_commit_timeout=0, max_pending_commits=2)
    result = await asyncio.wait_for(dispatcher.run_once(), timeout=60)
    assert result.failed == {}
    assert [archive.archived("Wide", queue_id) for queue_id in range(8)] == [600] * 8
    assert len(after_reads) >= 8 * 600 // 64
    # The window is used (the next queues' records stay mapped), and bounded: the window, the step each
    # of the two reads may hold, what faults map around them.
    assert WINDOW // 2 <= max(after_reads) <= WINDOW + 2 * STEP + 4 * AROUND
    # Everything read is released once every queue is done with it.
    assert mapped_rss(archive.root / "hot" / "commitlog") <= 1 << 20
    for queue_id in range(8):
        assert await archive.check("Wide", queue_id) == []


async def test_a_queue_stuck_behind_does_not_keep_the_hot_log_mapped(
    archive: Archive, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A queue whose commits keep failing stays at its first batch while the others archive 19 MiB past
    it: the pages between are released all the same (the stuck queue maps them again when it reads)."""
    stuck = FaultPlan(fail_before_landing=10**9)
    archive.flat = FlatFileStore(
        PathFaultProvider(archive.provider, {"Stuck": stuck}), archive.metadata, cluster="T", broker="b"
    )
    fill(archive, {"Stuck": 1, "Moving": 4}, rounds=960)
    after_reads = measure_reads(archive, monkeypatch)
    dispatcher = archive.dispatcher(
        group_commit_count=64,
        group_commit_timeout=0,
        max_pending_commits=2,
        retry_initial_backoff=0.01,
        retry_max_backoff=0.02,
    )
    result = await asyncio.wait_for(dispatcher.run_once(max_attempts=20), timeout=60)
    assert set(result.failed) == {("Stuck", 0)}
    assert [archive.archived("Moving", queue_id) for queue_id in range(4)] == [960] * 4
    assert archive.archived("Stuck", 0) == 0
    assert max(after_reads) <= WINDOW + 2 * STEP + 4 * AROUND
    # The window behind the furthest read, and what faults mapped around the records the stuck queue's
    # hot view and the last reads touched.
    assert mapped_rss(archive.root / "hot" / "commitlog") <= WINDOW + 4 * AROUND

    stuck.fail_before_landing = 0  # its storage is back: it reads past the released pages as before
    result = await asyncio.wait_for(dispatcher.run_once(max_attempts=40), timeout=60)
    assert result.failed == {}
    assert archive.archived("Stuck", 0) == 960
    assert await archive.check("Stuck", 0) == []
