"""FlatMessageFile and FlatFileStore: the archiver's write path, reads by queue offset, expiry, store recovery."""

from __future__ import annotations

import asyncio
import struct

import pytest

from tieredstore.errors import CorruptRecordError, NotFoundError, ValidationError
from tieredstore.flat import BoundaryType, FlatFileSettings, FlatFileStore, check_queue_invariant
from tieredstore.flat.message_file import RecordRun
from tieredstore.formats.message import POS_PHYSICAL_OFFSET, decode
from tieredstore.formats.naming import FileType
from tieredstore.metadata import MetadataStore, SegmentStatus, upgrade
from tieredstore.providers.memory import MemoryProvider

from .helpers import BASE_TIMESTAMP, TOPIC, append_range, make_record

SMALL = FlatFileSettings(commit_log_max_size=1000, consume_queue_max_size=100)


def new_store(provider: MemoryProvider, metadata: MetadataStore, **kwargs: object) -> FlatFileStore:
    return FlatFileStore(provider, metadata, cluster="c", broker="b", **kwargs)  # type: ignore[arg-type]


async def test_commit_archives_and_records_positions(memory_provider: MemoryProvider, metadata: MetadataStore) -> None:
    store = new_store(memory_provider, metadata, settings=SMALL)
    queue = await store.get_or_create(TOPIC, 0)
    hot = await append_range(queue, 0, 25)
    assert queue.archived_offset < 25 <= queue.append_offset  # buffered, not archived yet
    assert await queue.commit() == 25
    assert metadata.get_queue(TOPIC, 0).max_offset == 25
    records = await queue.read_messages(0, 100)
    assert len(records) == 25
    for offset, record in enumerate(records):
        unit = (await queue.read_units(offset, 1))[0]
        assert decode(record).physical_offset == unit.commitlog_offset  # rewritten to the cold position
        assert record[:POS_PHYSICAL_OFFSET] == hot[offset][:POS_PHYSICAL_OFFSET]
        assert record[POS_PHYSICAL_OFFSET + 8 :] == hot[offset][POS_PHYSICAL_OFFSET + 8 :]
    assert len(queue.commit_log.segments) > 1 and len(queue.consume_queue.segments) > 1
    rows = metadata.list_segments(queue.path, FileType.CONSUME_QUEUE)
    assert rows[-1].size == queue.consume_queue.segments[-1].commit_position
    assert await check_queue_invariant(queue, reference=hot) == []


async def test_commit_calls_its_hook_once_the_files_are_durable_and_before_the_positions_are_recorded(
    memory_provider: MemoryProvider, metadata: MetadataStore
) -> None:
    """The archiver puts key-index entries from the hook: they must never name a message that is not
    durable, and a failing hook must leave the batch unrecorded, to be retried."""
    queue = await new_store(memory_provider, metadata).get_or_create(TOPIC, 0)
    await append_range(queue, 0, 5)
    seen: list[tuple[int, int]] = []

    async def failing_hook() -> None:
        seen.append((queue.archived_offset, metadata.get_queue(TOPIC, 0).max_offset))
        raise OSError("the key index is unreachable")

    with pytest.raises(OSError, match="unreachable"):
        await queue.commit(on_durable=failing_hook)
    assert seen == [(5, 0)]  # both files durable, metadata not told yet
    assert metadata.get_queue(TOPIC, 0).max_offset == 0

    async def hook() -> None:
        seen.append((queue.archived_offset, metadata.get_queue(TOPIC, 0).max_offset))

    assert await queue.commit(on_durable=hook) == 5
    assert seen[-1] == (5, 0) and metadata.get_queue(TOPIC, 0).max_offset == 5


async def test_first_message_may_start_anywhere_then_offsets_must_follow(
    memory_provider: MemoryProvider, metadata: MetadataStore
) -> None:
    queue = await new_store(memory_provider, metadata).get_or_create(TOPIC, 1)
    await append_range(queue, 1000, 1003)
    await queue.commit()
    assert (queue.min_offset, queue.archived_offset) == (1000, 1003)
    with pytest.raises(ValidationError, match="expects offset 1003 next, not 1005"):
        await queue.append_records(RecordRun.of([(make_record(1005, queue_id=1), 1005, BASE_TIMESTAMP, 0)]))
    assert [decode(r).queue_offset for r in await queue.read_messages(1000, 10)] == [1000, 1001, 1002]
    with pytest.raises(NotFoundError):
        await queue.read_units(999, 1)


@pytest.mark.parametrize(
    ("mangle", "error"),
    [
        (lambda r: r[:40], CorruptRecordError),
        (lambda r: r[:4] + b"\x00\x00\x00\x01" + r[8:], CorruptRecordError),
        (lambda r: struct.pack(">i", len(r) + 1) + r[4:], CorruptRecordError),
        (lambda r: r[:20] + struct.pack(">q", 7) + r[28:], ValidationError),
    ],
    ids=["truncated", "bad-magic", "wrong-total-size", "other-queue-offset"],
)
async def test_bad_records_are_refused_and_nothing_is_written(
    memory_provider: MemoryProvider, metadata: MetadataStore, mangle: object, error: type[Exception]
) -> None:
    queue = await new_store(memory_provider, metadata).get_or_create(TOPIC, 0)
    await append_range(queue, 0, 2)
    with pytest.raises(error):
        await queue.append_records(RecordRun.of([(mangle(make_record(2)), 2, BASE_TIMESTAMP, 0)]))  # type: ignore[operator]
    assert queue.append_offset == 2
    assert await queue.commit() == 2
    assert await check_queue_invariant(queue) == []


async def test_find_queue_offset_by_store_time(memory_provider: MemoryProvider, metadata: MetadataStore) -> None:
    queue = await new_store(memory_provider, metadata, settings=SMALL).get_or_create(TOPIC, 0)
    await append_range(queue, 0, 30, timestamp_of=lambda offset: BASE_TIMESTAMP + (offset // 3) * 100)
    await queue.commit()
    assert await queue.find_queue_offset(BASE_TIMESTAMP + 500, BoundaryType.LOWER) == 15
    assert await queue.find_queue_offset(BASE_TIMESTAMP + 500, BoundaryType.UPPER) == 17
    assert await queue.find_queue_offset(BASE_TIMESTAMP + 550, BoundaryType.LOWER) == 18
    assert await queue.find_queue_offset(BASE_TIMESTAMP - 1, BoundaryType.LOWER) == 0


async def test_expiry_removes_consume_queue_then_unreferenced_commit_log(
    memory_provider: MemoryProvider, metadata: MetadataStore
) -> None:
    queue = await new_store(memory_provider, metadata, settings=SMALL).get_or_create(TOPIC, 0)
    hot = await append_range(queue, 0, 40, timestamp_of=lambda offset: BASE_TIMESTAMP + offset * 1000)
    await queue.commit()
    removed = await queue.destroy_expired(BASE_TIMESTAMP + 20_000)
    assert removed > 0
    assert 0 < queue.min_offset <= 20
    first_unit = (await queue.read_units(queue.min_offset, 1))[0]
    assert queue.commit_log.min_offset <= first_unit.commitlog_offset  # every remaining unit still resolves
    assert metadata.get_queue(TOPIC, 0).min_offset == queue.min_offset
    reference = {o: r for o, r in hot.items() if o >= queue.min_offset}
    assert await check_queue_invariant(queue, reference=reference) == []
    deleted = metadata.list_segments(queue.path, FileType.CONSUME_QUEUE, statuses=[SegmentStatus.DELETED])
    assert deleted


async def test_store_recovers_every_queue_with_bounded_concurrency(
    memory_provider: MemoryProvider, metadata: MetadataStore
) -> None:
    store = new_store(memory_provider, metadata)
    hot = {}
    for queue_id in range(12):
        queue = await store.get_or_create(TOPIC, queue_id)
        hot[queue_id] = await append_range(queue, 0, queue_id + 1)
        await queue.commit()
    in_flight = 0
    peak = 0
    restarted_provider = MemoryProvider(memory_provider.url)
    original = restarted_provider.segment

    def counting_segment(*args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        segment = original(*args, **kwargs)  # type: ignore[arg-type]
        real_size = segment._real_size

        async def slow_real_size() -> int:
            nonlocal in_flight, peak
            in_flight += 1
            peak = max(peak, in_flight)
            await asyncio.sleep(0.01)
            in_flight -= 1
            return await real_size()

        segment._real_size = slow_real_size  # type: ignore[method-assign]
        return segment

    restarted_provider.segment = counting_segment  # type: ignore[method-assign]
    restarted = new_store(restarted_provider, metadata, settings=FlatFileSettings(recovery_concurrency=3))
    report = await restarted.recover()
    assert report.recovered == 12 and not report.failed
    assert 1 < peak <= 3 * 2  # three queues at once, each checking its commit log and consume queue
    for queue_id in range(12):
        queue = restarted.get(TOPIC, queue_id)
        assert queue.archived_offset == queue_id + 1
        assert await check_queue_invariant(queue, reference=hot[queue_id]) == []


async def test_destroy_topic_removes_objects_and_rows(memory_provider: MemoryProvider, metadata: MetadataStore) -> None:
    store = new_store(memory_provider, metadata)
    for queue_id in range(2):
        queue = await store.get_or_create(TOPIC, queue_id)
        await append_range(queue, 0, 3)
        await queue.commit()
    other = await store.get_or_create("TopicB", 0)
    await append_range(other, 0, 3)
    await other.commit()
    await store.destroy_topic(TOPIC)
    assert all("/TopicA/" not in key for key in memory_provider.volume)
    assert [path for path, _ in metadata.list_all_segments()] == [other.path, other.path]
    with pytest.raises(NotFoundError):
        metadata.get_topic(TOPIC)
    with pytest.raises(NotFoundError):
        store.get(TOPIC, 0)
    assert await check_queue_invariant(store.get("TopicB", 0)) == []


async def test_store_recovery_on_postgres(memory_provider: MemoryProvider, postgres_url: str) -> None:
    upgrade(postgres_url)
    with MetadataStore(postgres_url) as metadata:
        queue = await new_store(memory_provider, metadata).get_or_create(TOPIC, 0)
        hot = await append_range(queue, 0, 10)
        await queue.commit()
    with MetadataStore(postgres_url) as metadata:
        restarted = new_store(MemoryProvider(memory_provider.url), metadata)
        assert (await restarted.recover()).recovered == 1
        assert await check_queue_invariant(restarted.get(TOPIC, 0), reference=hot) == []


async def test_in_memory_metadata_serves_concurrent_queues(memory_provider: MemoryProvider) -> None:
    with MetadataStore.open("sqlite://") as metadata:
        store = new_store(memory_provider, metadata)
        queues = await asyncio.gather(*(store.get_or_create(TOPIC, queue_id) for queue_id in range(8)))
        for queue in queues:
            await append_range(queue, 0, 5)
        assert await asyncio.gather(*(queue.commit() for queue in queues)) == [5] * 8
        assert [q.max_offset for q in metadata.list_queues(TOPIC)] == [5] * 8
