"""Cold retention on the maintenance pass of archivers that share queues by lease: each expires only the queues it
holds, and every key-index file of every namespace is deleted once, by one archiver."""

from __future__ import annotations

import time
from pathlib import Path

from tests.scaleout.test_index_namespaces import QUEUES, TOPIC, _archiver, _produce, _two_nodes
from tieredstore.metadata import SegmentStatus
from tieredstore.runtime import Runtime

_STEADY = {"lease_duration": 180.0, "renew_interval": 60.0}


def _later() -> int:
    """A clock far enough ahead that every message and index file is older than the default 72 h retention."""
    return time.time_ns() // 1_000_000 + 1000 * 3_600_000


def _deleted(runtime: Runtime) -> float:
    registry = runtime.metrics.registry
    return sum(
        registry.get_sample_value("tieredstore_retention_deleted_segments_total", {"topic": TOPIC, "file_type": kind})
        or 0.0
        for kind in ("COMMIT_LOG", "CONSUME_QUEUE")
    )


def _index_files_deleted(runtime: Runtime) -> float:
    return runtime.metrics.registry.get_sample_value("tieredstore_retention_deleted_index_files_total") or 0.0


async def test_each_archiver_expires_the_queues_it_holds_and_each_index_file_goes_once(
    tmp_path: Path, metadata_url: str
) -> None:
    async with _two_nodes(tmp_path, metadata_url) as (producer, a, b):
        # A archives the first messages; its index file is uploaded.
        async with _archiver(a, "a") as dispatcher:
            await dispatcher.run_once()
        await a.index.seal_current()
        await a.keys.maintain()
        # B takes every queue over: one index file uploaded, then one it is still filling.
        _produce(producer, 20, 20)
        # Leases that need no renewal during the test: a background round (every second with the defaults here)
        # would hand B's surplus to A at a moment the machine's load decides, and a queue between the two is
        # expired by neither.
        async with _archiver(b, "b", clock_ms=_later, **_STEADY) as b_dispatcher:
            await b_dispatcher.run_once()
            await b.index.seal_current()
            await b.keys.maintain()
            _produce(producer, 40, 5)
            await b_dispatcher.run_once()
            catalogue = {row.name for row in b.metadata.list_index_files()}
            a_files = {name for name in catalogue if f"/{a.index.namespace}/" in name}
            b_files = catalogue - a_files
            assert len(a_files) == 1 and len(b_files) == 2
            # A runs again beside B, which holds every queue and keeps them (no lease round runs meanwhile).
            async with _archiver(a, "a", clock_ms=_later, **_STEADY) as a_dispatcher:
                await a_dispatcher.scan()
                await a_dispatcher.maintain()
                await b_dispatcher.maintain()
                # A sorts first among the live archivers: it deleted every uploaded file of every
                # namespace (its own and B's); B only the file it is still filling, which only B has.
                assert _index_files_deleted(a) == 2 and _index_files_deleted(b) == 1
                assert b.metadata.list_index_files() == []
                assert b.index.files() == []  # B no longer answers from its uploaded file A deleted
                # Every queue expired (rolled, then its sealed segments deleted) by the archiver holding it,
                # and each segment once.
                for queue_id in range(QUEUES):
                    position = b.metadata.get_queue(TOPIC, queue_id)
                    assert position.min_offset == position.max_offset == 45
                deleted_rows = sum(
                    len(rows) for rows in b.metadata.list_all_segments(statuses=[SegmentStatus.DELETED]).values()
                )
                assert deleted_rows == _deleted(a) + _deleted(b) >= 2 * QUEUES
