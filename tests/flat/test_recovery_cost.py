"""What a clean restart costs per queue in provider calls: the restart time of a broker with many queues."""

from __future__ import annotations

from collections import Counter
from typing import Any

from tieredstore.flat import FlatFileSettings, FlatFileStore
from tieredstore.formats.consume_queue import UNIT_SIZE
from tieredstore.formats.naming import FileType
from tieredstore.metadata import MetadataStore
from tieredstore.providers.base import FileSegment
from tieredstore.providers.memory import MemoryProvider

from .helpers import TOPIC, append_range

SMALL = FlatFileSettings(commit_log_max_size=1000, consume_queue_max_size=5 * UNIT_SIZE)


class CountingProvider(MemoryProvider):
    """A memory provider that counts the storage calls of the segments it makes, by (call, file type)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.calls: Counter[tuple[str, FileType]] = Counter()

    def segment(self, file_type: FileType, path: str, base_offset: int, **kwargs: Any) -> FileSegment:
        segment = super().segment(file_type, path, base_offset, **kwargs)
        for name in ("_real_size", "_read"):
            inner = getattr(segment, name)

            async def counted(*args: Any, _inner: Any = inner, _name: str = name) -> Any:
                self.calls[(_name, file_type)] += 1
                return await _inner(*args)

            setattr(segment, name, counted)
        return segment


async def test_a_clean_restart_sizes_each_open_segment_once_and_reads_one_unit(
    memory_provider: MemoryProvider, metadata: MetadataStore
) -> None:
    queue = await FlatFileStore(memory_provider, metadata, cluster="c", broker="b", settings=SMALL).get_or_create(
        TOPIC, 0
    )
    await append_range(queue, 0, 23)
    await queue.commit()
    assert len(queue.commit_log.segments) > 1 and len(queue.consume_queue.segments) > 1

    counting = CountingProvider(memory_provider.url)
    report = await FlatFileStore(counting, metadata, cluster="c", broker="b", settings=SMALL).recover()
    assert report.recovered == 1 and not report.changed
    # Sealed segments are trusted as recorded; the open (NEW) segment of each file is sized once, and the
    # last consume-queue unit is read once to check its commit-log bytes and find the referenced end.
    assert counting.calls == Counter(
        {
            ("_real_size", FileType.COMMIT_LOG): 1,
            ("_real_size", FileType.CONSUME_QUEUE): 1,
            ("_read", FileType.CONSUME_QUEUE): 1,
        }
    )


async def test_a_queue_whose_last_segments_are_sealed_costs_no_size_lookup(
    memory_provider: MemoryProvider, metadata: MetadataStore
) -> None:
    store = FlatFileStore(memory_provider, metadata, cluster="c", broker="b", settings=SMALL)
    queue = await store.get_or_create(TOPIC, 0)
    await append_range(queue, 0, 12)
    await queue.commit()
    await queue.skip_to(20)
    # Crash between sealing the consume queue's segment and starting the next: its last row is SEALED.
    metadata.delete_segment(queue.path, FileType.CONSUME_QUEUE.value, 20 * UNIT_SIZE)

    counting = CountingProvider(memory_provider.url)
    restarted = FlatFileStore(counting, metadata, cluster="c", broker="b", settings=SMALL)
    await restarted.recover()
    assert counting.calls[("_real_size", FileType.CONSUME_QUEUE)] == 0
    recovered = restarted.get(TOPIC, 0)
    assert recovered.archived_offset == 12  # no hole was recorded, so none is kept; the archiver skips again
    assert metadata.get_queue(TOPIC, 0).max_offset == 12
