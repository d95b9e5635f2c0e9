"""The cold reader of a queue: checked windows read by units or following the commit log, trimmed at
object ends, stopping at lost offsets."""

from __future__ import annotations

import pytest

from tieredstore.errors import NotFoundError
from tieredstore.flat import FlatFileSettings, FlatFileStore, FlatMessageFile
from tieredstore.flat.cold_reader import ColdQueueReader, ColdReadOptions, LostRange
from tieredstore.formats.consume_queue import UNIT_SIZE
from tieredstore.formats.message import same_but_physical_offset
from tieredstore.formats.naming import FileType
from tieredstore.metadata import MetadataStore
from tieredstore.providers.memory import MemoryProvider

from .helpers import TOPIC, append_range

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
