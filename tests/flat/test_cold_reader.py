"""The cold reader of a queue: checked windows read by units or following the commit log, trimmed at
object ends, stopping at lost offsets."""

from __future__ import annotations

import numpy as np
import pytest

from tieredstore.errors import NotFoundError, ReadOnlyError
from tieredstore.flat import FlatFileSettings, FlatFileStore, FlatMessageFile
from tieredstore.flat.cold_reader import ColdQueueReader, ColdReadOptions, FollowPoint, LostRange
from tieredstore.flat.listed_view import NO_METADATA, listed_message_file
from tieredstore.flat.listing import listed_segments
from tieredstore.flat.served import check_window, located_window
from tieredstore.formats.arrays import UNIT_DTYPE
from tieredstore.formats.consume_queue import UNIT_SIZE
from tieredstore.formats.message import same_but_physical_offset
from tieredstore.formats.naming import FileType
from tieredstore.metadata import MetadataStore
from tieredstore.providers.memory import MemoryProvider
from tieredstore.read.archived import read_archived

from .helpers import TOPIC, append_range, make_record

SMALL = FlatFileSettings(commit_log_max_size=1000, consume_queue_max_size=5 * UNIT_SIZE)


async def _queue_with_hole(
    memory_provider: MemoryProvider, metadata: MetadataStore
) -> tuple[FlatMessageFile, dict[int, bytes]]:
    """Offsets 0..11 archived, 12..19 lost, 20..29 archived."""
    store = FlatFileStore(memory_provider, metadata, cluster="c", broker="b", settings=SMALL)
    queue = await store.get_or_create(TOPIC, 0)
    hot = await append_range(queue, 0, 12)
    await queue.commit()
    assert await queue.skip_to(20) == 20
    hot |= await append_range(queue, 20, 30)
    await queue.commit()
    return queue, hot


async def test_windows_give_every_archived_record_once_and_follow_without_consume_queue_reads(
    memory_provider: MemoryProvider, metadata: MetadataStore
) -> None:
    queue, hot = await _queue_with_hole(memory_provider, metadata)
    reads: list[FileType] = []
    reader = ColdQueueReader(queue, ColdReadOptions(window_count=100, window_bytes=1 << 20), count_read=reads.append)
    assert (reader.run_end(0), reader.run_end(25), reader.next_archived(13), reader.next_archived(25)) == (
        12,
        30,
        20,
        25,
    )
    read: dict[int, bytes] = {}
    for start in (0, 20):
        offset = start
        while (window := await reader.read(offset)) is not None:
            # never past the object (a 1,000-byte commit-log segment here) holding the first record
            assert len(window) >= 1 and window.ends[-1] <= 1000
            assert not window.corrupt
            read |= {at: window.raw(at) for at in range(window.first_offset, window.end_offset)}
            offset = window.end_offset
        assert offset == reader.run_end(start)  # a read stops where the lost offsets begin
    assert read.keys() == hot.keys()
    assert all(same_but_physical_offset(read[at], hot[at]) for at in hot)
    # from the oldest record the commit log is split directly; after the hole the consume queue says where
    first_run_reads = reads[: reads.index(FileType.CONSUME_QUEUE)]
    assert set(first_run_reads) == {FileType.COMMIT_LOG}
    assert await reader.read(12) is None and await reader.read(30) is None


async def test_a_window_is_trimmed_to_its_byte_bound_but_never_below_one_record(
    memory_provider: MemoryProvider, metadata: MetadataStore
) -> None:
    queue, hot = await _queue_with_hole(memory_provider, metadata)
    reader = ColdQueueReader(queue, ColdReadOptions(window_count=100, window_bytes=1))
    window = await reader.read(3)
    assert window is not None and len(window) == 1 and same_but_physical_offset(window.raw(3), hot[3])
    jumped = await reader.read(25, 2)
    assert jumped is not None and same_but_physical_offset(jumped.raw(25), hot[25]) and len(jumped) == 1


async def test_windows_from_a_start_report_the_lost_offsets_between_them(
    memory_provider: MemoryProvider, metadata: MetadataStore
) -> None:
    queue, _hot = await _queue_with_hole(memory_provider, metadata)
    reader = ColdQueueReader(queue, ColdReadOptions(window_count=4, window_bytes=1 << 20))
    items = [item async for item in reader.windows(9, 40)]
    lost = [item for item in items if isinstance(item, LostRange)]
    assert lost == [LostRange(12, 20)]
    offsets = [
        at for item in items if not isinstance(item, LostRange) for at in range(item.first_offset, item.end_offset)
    ]
    assert offsets == [*range(9, 12), *range(20, 30)]
    assert all(len(item) <= 4 for item in items if not isinstance(item, LostRange))
    assert [item async for item in reader.windows(14, 16)] == [LostRange(14, 16)]
    with pytest.raises(NotFoundError, match="below the cold min offset"):
        [item async for item in ColdQueueReader(queue, reader.options).windows(-1, 5)]


class _CountingBudget:
    """A read budget that records what is held: each acquire in full, nothing ever waits."""

    def __init__(self) -> None:
        self.held = 0
        self.most = 0

    async def acquire(self, size: int) -> int:
        self.held += size
        self.most = max(self.most, self.held)
        return size

    async def release(self, size: int) -> None:
        self.held -= size


async def test_each_window_holds_its_bytes_in_the_budget_until_its_reader_gives_them_back(
    memory_provider: MemoryProvider, metadata: MetadataStore
) -> None:
    queue, hot = await _queue_with_hole(memory_provider, metadata)
    reader = ColdQueueReader(queue, ColdReadOptions(window_count=4, window_bytes=1 << 20))
    budget = _CountingBudget()
    offsets = []
    async for item in reader.windows(0, 30, budget=budget):
        if isinstance(item, LostRange):
            assert budget.held == 0  # a hole is read from nothing
            continue
        # held from before the read until now: its bytes at least, never a whole segment for four records
        assert len(item.data) <= budget.held < 1000
        offsets += range(item.first_offset, item.end_offset)
        await budget.release(budget.held)
    assert offsets == sorted(hot)
    # a read told to follow from a place that holds another record gives back what it read there, and
    # the consume queue says where the records are
    reader.follow = FollowPoint(20, 0, len(hot[0]))
    window = await reader.read(20, 2, budget=budget)
    assert window is not None and same_but_physical_offset(window.raw(21), hot[21])
    assert budget.held == len(window.data) == len(hot[20]) + len(hot[21])


async def test_archived_reads_go_on_past_object_ends_and_stop_at_lost_offsets(
    memory_provider: MemoryProvider, metadata: MetadataStore
) -> None:
    queue, hot = await _queue_with_hole(memory_provider, metadata)
    # more records than one 1,000-byte commit-log segment holds, up to the hole
    records = await read_archived(queue, 1, 100)
    assert len(records) == 11 and all(same_but_physical_offset(records[at - 1], hot[at]) for at in range(1, 12))
    with pytest.raises(NotFoundError, match=r"offsets \[12, 20\) .* were lost"):
        await read_archived(queue, 13, 2)


async def test_archived_reads_through_one_reader_follow_the_read_before_without_consume_queue_reads(
    memory_provider: MemoryProvider, metadata: MetadataStore
) -> None:
    store = FlatFileStore(memory_provider, metadata, cluster="c", broker="b")
    queue = await store.get_or_create(TOPIC, 0)
    hot = await append_range(queue, 0, 30)
    await queue.commit()
    reads: list[FileType] = []
    reader = ColdQueueReader(queue, ColdReadOptions(window_count=100, window_bytes=1 << 20), count_read=reads.append)
    assert len(await read_archived(queue, 5, 10, reader=reader)) == 10
    assert FileType.CONSUME_QUEUE in reads  # a first read from the middle asks the consume queue
    reads.clear()
    again = await read_archived(queue, 15, 10, reader=reader)
    assert all(same_but_physical_offset(raw, hot[at]) for at, raw in enumerate(again, 15)) and len(again) == 10
    assert reads == [FileType.COMMIT_LOG]


def test_a_located_window_leaves_bodies_to_its_reader_but_refuses_a_record_of_another_offset() -> None:
    records = [make_record(offset) for offset in range(10, 14)]
    units = np.zeros(len(records), dtype=UNIT_DTYPE)
    units["size"] = [len(raw) for raw in records]
    units["commitlog_offset"] = np.cumsum(units["size"]) - units["size"]
    damaged = bytearray(b"".join(records))
    body_crc_at = 8  # TOTALSIZE(4) MAGICCODE(4) BODYCRC(4): a wrong CRC stands for a damaged body
    damaged[body_crc_at] ^= 0xFF
    data = bytes(damaged)
    assert 10 in check_window(TOPIC, 0, 10, data, 0, units).corrupt
    located = located_window(TOPIC, 0, 10, data, 0, units)
    assert not located.corrupt and located.raw(11) == records[1]
    # the same records taken for offsets 11.. are not where the window says: each one is refused
    shifted = located_window(TOPIC, 0, 11, data, 0, units)
    assert sorted(shifted.corrupt) == [11, 12, 13, 14] and "queue offset" in str(shifted.corrupt[12])


async def test_a_listed_queue_reads_every_archived_record_and_its_lost_offsets(
    memory_provider: MemoryProvider, metadata: MetadataStore
) -> None:
    """A queue built from listed segments, with no metadata store, reads through the one cold reader."""
    queue, hot = await _queue_with_hole(memory_provider, metadata)
    commit_log = await listed_segments(memory_provider, queue.path, FileType.COMMIT_LOG)
    consume_queue = await listed_segments(memory_provider, queue.path, FileType.CONSUME_QUEUE)
    spans = [[_Span(s.base_offset, s.size) for s in segments] for segments in (commit_log, consume_queue)]
    listed = listed_message_file(memory_provider, TOPIC, 0, queue.path, (0, 30), spans[0], spans[1])
    assert listed.read_only and (listed.min_offset, listed.archived_offset) == (0, 30)
    assert listed.lost_ranges == queue.lost_ranges
    reader = ColdQueueReader(listed, ColdReadOptions(window_count=100, window_bytes=1 << 20, check_records=False))
    read: dict[int, bytes] = {}
    lost = []
    async for window in reader.windows(0, 30):
        if isinstance(window, LostRange):
            lost.append((window.start, window.end))
            continue
        read |= {at: window.raw(at) for at in range(window.first_offset, window.end_offset)}
    assert lost == [(12, 20)]
    assert read.keys() == hot.keys()
    assert all(same_but_physical_offset(read[at], hot[at]) for at in hot)
    with pytest.raises(ReadOnlyError):
        NO_METADATA.get_topic(TOPIC)


class _Span:
    """A listed segment with no store-time range, as a listing finds it."""

    def __init__(self, base_offset: int, size: int) -> None:
        self.base_offset, self.size = base_offset, size
        self.begin_timestamp: int | None = None
        self.end_timestamp: int | None = None
