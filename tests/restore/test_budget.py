"""A restore through the library holds at most ``max_bytes_in_flight`` record bytes read and not yet written."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from tests.cli.conftest import SMALL_FILES
from tests.cli.helpers import Node
from tests.cli.test_restore import TOPIC
from tests.cli.test_restore_parallel import COUNTS, assert_restored, produce_queues
from tieredstore.config import load_config
from tieredstore.local.store import JoinedRecords
from tieredstore.read.node import open_read_node
from tieredstore.restore import HotStoreSink, RestoreRequest, restore_archive
from tieredstore.restore import reading as restore_reading


def restore_counting(posix: Node, monkeypatch: pytest.MonkeyPatch, request: RestoreRequest) -> tuple[int, int]:
    """Restore through the API into ``target``; (most record bytes read and not yet written, the summary's peak)."""
    for name, value in SMALL_FILES.items():
        monkeypatch.setenv(name, value)
    config = load_config(data_dir=posix.data_dir)
    counted = {"read": 0, "written": 0, "most": 0}

    def counting(read: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        """``read`` (what makes each batch of the restore), counting the record bytes of each batch it returns."""

        async def counted_read(*args: Any) -> Any:
            batch = await read(*args)
            if batch is not None:
                counted["read"] += len(batch.records.data)
                counted["most"] = max(counted["most"], counted["read"] - counted["written"])
            await asyncio.sleep(0)  # let the other queues' readers run while the writer works
            return batch

        return counted_read

    class CountingSink(HotStoreSink):
        def write(self, topic: str, queue_id: int, batch: JoinedRecords) -> None:
            super().write(topic, queue_id, batch)
            counted["written"] += len(batch.data)

    monkeypatch.setattr(restore_reading, "_batch_of", counting(restore_reading._batch_of))

    async def go() -> int:
        async with open_read_node(config) as node:
            sink = CountingSink(posix.data_dir / "target", node)
            try:
                summary = await restore_archive(node, request, sink)
            finally:
                sink.close()
            assert summary.messages == sum(COUNTS.values())
            return summary.peak_bytes_in_flight

    peak = asyncio.run(go())
    assert counted["written"] == counted["read"]
    return counted["most"], peak


def test_bytes_in_flight_never_exceed_the_cap(posix: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    originals = produce_queues(posix)
    cap = 3000
    request = RestoreRequest(TOPIC, batch_messages=8, parallel=4, read_ahead=8, max_bytes_in_flight=cap)
    most, peak = restore_counting(posix, monkeypatch, request)
    # More than one batch was read ahead of the writes, and never more than the cap.
    batch_bytes = max(len(r) for q in originals.values() for r in q.values()) * 8
    assert batch_bytes < most <= cap
    assert batch_bytes < peak <= cap
    assert_restored(posix.data_dir / "target", originals)


def test_a_batch_larger_than_the_cap_still_goes_alone(posix: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    originals = produce_queues(posix)
    request = RestoreRequest(TOPIC, batch_messages=8, parallel=4, max_bytes_in_flight=100)
    most, peak = restore_counting(posix, monkeypatch, request)
    assert 100 < most <= max(len(r) for q in originals.values() for r in q.values()) * 8
    assert peak == 100
    assert_restored(posix.data_dir / "target", originals)
