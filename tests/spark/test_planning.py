"""Planning reads as few objects as it can, and what it reads never changes the plan."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.spark.helpers import Archive, store_timestamp
from tieredstore.formats.naming import FileType
from tieredstore.providers.base import FileSegment
from tieredstore.providers.chunks import Chunk, ChunkedSegment
from tieredstore.spark import ScanOptions, layout, plan_partitions
from tieredstore.spark.filters import ScanFilter
from tieredstore.spark.planning import PartitionPlan

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


@pytest.mark.parametrize("metadata", [True, False], ids=["metadata", "listing"])
@pytest.mark.parametrize("name", list(FILTERS))
def test_reading_first_chunks_by_name_keeps_every_plan(
    archive: Archive, name: str, metadata: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    extra = {"max_partition_bytes": "3000"} if name == "small partitions" else {}
    planned = _plans(archive, FILTERS[name], metadata=metadata, **extra)
    assert planned, "every filter here matches some records"

    async def nothing_by_name(self: FileSegment, position: int, max_length: int) -> bytes:
        return b""

    # Every unit then comes through a plain ranged read, as before segments' first chunks were read by name.
    monkeypatch.setattr(FileSegment, "read_from", nothing_by_name)
    assert planned == _plans(archive, FILTERS[name], metadata=metadata, **extra)


def test_a_whole_queue_is_planned_listing_only_its_last_consume_queue_segment(
    s3_archive: Archive, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each S3 listing is a request on the driver before the job starts; the first unit needs none."""
    listed: list[str] = []
    list_chunks = ChunkedSegment._list_chunks

    async def counted(self: ChunkedSegment) -> list[Chunk]:
        if self.file_type is FileType.CONSUME_QUEUE:
            listed.append(self.key)
        return await list_chunks(self)

    monkeypatch.setattr(ChunkedSegment, "_list_chunks", counted)
    planned = _plans(s3_archive, ScanFilter())
    queues = {plan.layout.path for plan in planned}
    assert len(queues) == 6
    # orders/0 alone has 12 consume-queue segments; the first and the last unit are read, the first by name.
    listings = Counter(path for path in queues for key in listed if f"{path}/" in key)
    assert len(listed) == len(queues)
    assert listings == dict.fromkeys(queues, 1)


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
