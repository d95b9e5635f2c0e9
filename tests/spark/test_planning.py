"""Planning reads as few objects as it can, and what it reads never changes the plan."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter

import pytest

from tests.spark.helpers import BROKER, CLUSTER, Archive, store_timestamp
from tieredstore.formats.consume_queue import UNIT_SIZE
from tieredstore.formats.naming import FileType
from tieredstore.metadata import MetadataStore
from tieredstore.providers.base import FileSegment
from tieredstore.providers.chunks import ObjectInfo
from tieredstore.providers.registry import open_provider
from tieredstore.providers.s3 import S3ObjectStore
from tieredstore.scan import ScanOptions, layout, plan_partitions, planning, read_partition
from tieredstore.scan.filters import ScanFilter
from tieredstore.scan.planning import PartitionPlan

pytestmark = pytest.mark.spark

# Segments hold 20 units (helpers.SETTINGS), so 20 and 40 start a consume-queue segment and 25 does not.
FILTERS = {
    "everything": ScanFilter(),
    "from a segment start": ScanFilter(queue_offset_start=40),
    "from inside a segment": ScanFilter(queue_offset_start=25, queue_offset_end=117),
    "time range": ScanFilter(
        timestamp_start_us=store_timestamp(0, 31) * 1000, timestamp_end_us=store_timestamp(0, 150) * 1000
    ),
    "small partitions": ScanFilter(queue_offset_start=20),
}


def _plans(archive: Archive, scan_filter: ScanFilter, *, metadata: bool = True, **options: str) -> list[PartitionPlan]:
    scan_options = ScanOptions.parse(
        {"path": "orders,holes,abandoned,big", **archive.options(metadata=metadata, **options)}
    )
    return plan_partitions(scan_options, scan_filter)


def _filtered_plans(archive: Archive, name: str, metadata: bool) -> list[PartitionPlan]:
    """The plans of ``FILTERS[name]``, with small partitions for the filter of that name."""
    extra = {"max_partition_bytes": "3000"} if name == "small partitions" else {}
    return _plans(archive, FILTERS[name], metadata=metadata, **extra)


async def _nothing_by_name(self: FileSegment, position: int, max_length: int) -> bytes:
    return b""


async def _range_from_units(view: layout.ArchiveView, low: int, last: int) -> tuple[int, int, bool]:
    first, final = await asyncio.gather(view.unit(low), view.unit(last))
    return first.commitlog_offset, final.commitlog_offset + final.size, False


# Planning as it read before each saving: the plans must be the same.
READ_AS_BEFORE = {
    # Every unit comes through a plain ranged read, as before segments' first chunks were read by name.
    "first chunks listed": (FileSegment, "read_from", _nothing_by_name),
    # Both ends of every queue range come from consume-queue units, as before the segment rows were used.
    "ranges from units": (planning, "_commit_log_range", _range_from_units),
}


@pytest.mark.parametrize("before", list(READ_AS_BEFORE))
@pytest.mark.parametrize("metadata", [True, False], ids=["metadata", "listing"])
@pytest.mark.parametrize("name", list(FILTERS))
def test_reading_less_keeps_every_plan(
    archive: Archive, name: str, metadata: bool, before: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    planned = _filtered_plans(archive, name, metadata)
    assert planned, "every filter here matches some records"
    monkeypatch.setattr(*READ_AS_BEFORE[before])
    assert planned == _filtered_plans(archive, name, metadata)


def test_a_whole_queue_is_planned_without_listing_or_reading_its_consume_queue(
    s3_archive: Archive, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each S3 request is on the driver before the job starts; a whole queue's range is in its segment rows."""
    listed: list[str] = []
    consume_queue_reads: list[str] = []
    list_files = S3ObjectStore.list_files
    read_from = FileSegment.read_from

    async def counted(self: S3ObjectStore, folder: str) -> list[ObjectInfo]:
        listed.append(folder)
        return await list_files(self, folder)

    async def recorded(self: FileSegment, position: int, max_length: int) -> bytes:
        if self.file_type is FileType.CONSUME_QUEUE:
            consume_queue_reads.append(self.key)
        return await read_from(self, position, max_length)

    monkeypatch.setattr(S3ObjectStore, "list_files", counted)
    monkeypatch.setattr(FileSegment, "read_from", recorded)
    planned = _plans(s3_archive, ScanFilter())
    queues = {plan.layout.path for plan in planned}
    assert len(queues) == 6
    # orders/0 alone has 12 consume-queue segments: none is read, and the head of each later commit-log
    # segment is read by its first chunk's name.
    assert listed == []
    assert consume_queue_reads == []


def _retained(queue: layout.QueueLayout, dropped_segments: int) -> layout.QueueLayout:
    """``queue`` as retention leaves it when it removed the first consume-queue segments but not the commit-log
    segment their records are in, with both files' first segments recorded at one store time (records
    stored in one millisecond): a start guessed from the rows is then wrong."""
    consume_queue = queue.consume_queue[dropped_segments:]
    first = dataclasses.replace(consume_queue[0], begin_timestamp=queue.commit_log[0].begin_timestamp)
    return dataclasses.replace(
        queue, min_offset=first.base_offset // UNIT_SIZE, consume_queue=(first, *consume_queue[1:])
    )


@pytest.mark.parametrize("budget", ["3000", str(128 << 20)], ids=["split", "whole"])
def test_a_start_guessed_wrong_costs_reads_not_rows(posix_archive: Archive, budget: str) -> None:
    """The reader finds another record where the guess points and reads the consume queue; a piece to
    split is searched from where its first record really starts."""
    options = ScanOptions.parse({"path": "orders", **posix_archive.options(max_partition_bytes=budget)})
    metadata = MetadataStore.open(posix_archive.metadata_url)
    try:
        (orders,) = layout.layouts_from_metadata(
            metadata, ["orders"], cluster=CLUSTER, broker=BROKER, queue_allowed=lambda queue_id: queue_id == 0
        )
    finally:
        metadata.close()
    queue = _retained(orders, dropped_segments=2)
    assert queue.min_offset == 40 and len(queue.commit_log) > 1

    async def plan() -> list[PartitionPlan]:
        async with open_provider(options.cold_url) as provider:
            return await planning.plan_queue(provider, queue, ScanFilter(), options.max_partition_bytes)

    planned = asyncio.run(plan())
    expected = [row for row in posix_archive.expected("orders") if row["queue_id"] == 0 and row["queue_offset"] >= 40]
    split = len(planned) > len(queue.commit_log)
    assert split == (budget == "3000")
    # Guessed at the commit log's start; read from the consume queue before a split.
    assert planned[0].queue_start == 40
    assert planned[0].commitlog_start == (expected[0]["commitlog_offset"] if split else 0)
    rows = [row for p in planned for batch in read_partition(p, options) for row in batch.to_pylist()]
    assert [(row["queue_offset"], row["body"]) for row in rows] == [(r["queue_offset"], r["body"]) for r in expected]


def test_split_points_searched_together_read_each_unit_once(
    posix_archive: Archive, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The searches for one piece's split points start at the same probes; each probe is one read."""
    reads: list[tuple[str, int]] = []
    read = FileSegment.read

    async def recorded(self: FileSegment, position: int, length: int) -> bytes:
        if self.file_type is FileType.CONSUME_QUEUE:
            reads.append((self.key, position))
        return await read(self, position, length)

    monkeypatch.setattr(FileSegment, "read", recorded)
    planned = _plans(posix_archive, ScanFilter(), max_partition_bytes="3000")
    assert len(planned) > 40, "small partitions: several split points per commit-log segment"
    assert reads
    assert [key for key, count in Counter(reads).items() if count > 1] == []


@pytest.mark.parametrize("budget", ["700", "3000", "20000"])
def test_split_points_guessed_by_position_are_those_found_by_halving(
    posix_archive: Archive, budget: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records of varied sizes, a record larger than the budget and a consume-queue hole: same plans."""
    scan_filter = ScanFilter(queue_offset_start=3)
    guessed = _plans(posix_archive, scan_filter, max_partition_bytes=budget)
    monkeypatch.setattr(layout._PositionSearch, "probe", lambda self, first, last: (first + last) // 2)
    assert guessed == _plans(posix_archive, scan_filter, max_partition_bytes=budget)
    assert len(guessed) > len({plan.layout.path for plan in guessed})
