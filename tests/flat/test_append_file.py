"""FlatAppendFile, FlatCommitLogFile and FlatConsumeQueueFile on the memory provider."""

from __future__ import annotations

import pytest

from tieredstore.errors import NotFoundError
from tieredstore.flat import BoundaryType, FlatAppendFile, FlatCommitLogFile, FlatConsumeQueueFile
from tieredstore.formats.consume_queue import UNIT_SIZE, ConsumeQueueUnit
from tieredstore.formats.naming import FileType
from tieredstore.metadata import MetadataStore, SegmentStatus, SegmentUpdate
from tieredstore.providers.memory import MemoryProvider

from .helpers import BASE_TIMESTAMP, make_record

PATH = "abcd1234_c/b/TopicA/0"


def chunk(index: int, size: int = 30) -> bytes:
    return bytes([index % 256]) * size


def new_file(provider: MemoryProvider, metadata: MetadataStore, **kwargs: object) -> FlatAppendFile:
    return FlatAppendFile(provider, metadata, PATH, FileType.COMMIT_LOG, max_segment_size=100, **kwargs)  # type: ignore[arg-type]


async def test_appends_roll_on_full_and_reads_span_segments(
    memory_provider: MemoryProvider, metadata: MetadataStore
) -> None:
    flat = new_file(memory_provider, metadata)
    offsets = [await flat.append(chunk(i), BASE_TIMESTAMP + i) for i in range(7)]
    await flat.commit()
    assert offsets == [i * 30 for i in range(7)]
    # 100-byte segments take three 30-byte appends each: bases 0, 90, 180.
    assert [s.base_offset for s in flat.segments] == [0, 90, 180]
    assert (flat.min_offset, flat.commit_offset, flat.append_offset) == (0, 210, 210)
    assert await flat.read(80, 40) == chunk(2)[:10] + chunk(3)  # spans the first two segments
    assert await flat.read(0, 1000) == b"".join(chunk(i) for i in range(7))
    rows = metadata.list_segments(PATH, FileType.COMMIT_LOG)
    assert [(r.base_offset, r.size, r.status) for r in rows[:2]] == [
        (0, 90, SegmentStatus.SEALED),
        (90, 90, SegmentStatus.SEALED),
    ]
    assert (rows[0].begin_timestamp, rows[0].end_timestamp) == (BASE_TIMESTAMP, BASE_TIMESTAMP + 2)
    assert rows[2].status is SegmentStatus.NEW


async def test_uncommitted_bytes_are_not_readable_and_old_offsets_are_not_found(
    memory_provider: MemoryProvider, metadata: MetadataStore
) -> None:
    flat = new_file(memory_provider, metadata, initial_offset=1000)
    await flat.append(chunk(1), BASE_TIMESTAMP)
    assert (flat.commit_offset, flat.append_offset) == (1000, 1030)
    assert await flat.read(1000, 30) == b""
    await flat.commit()
    assert await flat.read(1000, 30) == chunk(1)
    assert await flat.read(1030, 10) == b""
    with pytest.raises(NotFoundError, match="below the min offset 1000"):
        await flat.read(999, 10)


async def test_destroy_expired_removes_old_head_segments_object_first(
    memory_provider: MemoryProvider, metadata: MetadataStore
) -> None:
    flat = new_file(memory_provider, metadata)
    for i in range(9):
        await flat.append(chunk(i), BASE_TIMESTAMP + i * 1000)
    await flat.commit()
    first, second, last = flat.segments
    assert await flat.destroy_expired(BASE_TIMESTAMP + 2000) == 0  # segment 0's newest data is at +2000
    assert await flat.destroy_expired(BASE_TIMESTAMP + 2001, limit_offset=80) == 0  # still referenced
    assert await flat.destroy_expired(BASE_TIMESTAMP + 100_000) == 2  # never the last segment
    assert flat.segments == [last]
    assert not await first.exists() and not await second.exists()
    assert flat.min_offset == 180
    assert [r.base_offset for r in metadata.list_segments(PATH, FileType.COMMIT_LOG)] == [180]
    deleted = metadata.list_segments(PATH, FileType.COMMIT_LOG, statuses=[SegmentStatus.DELETED])
    assert [r.base_offset for r in deleted] == [0, 90]
    with pytest.raises(NotFoundError):
        await flat.read(0, 10)


async def test_recover_rebuilds_from_metadata_and_corrects_the_last_size(
    memory_provider: MemoryProvider, metadata: MetadataStore
) -> None:
    flat = new_file(memory_provider, metadata)
    for i in range(5):
        await flat.append(chunk(i), BASE_TIMESTAMP + i)
    await flat.commit()  # metadata still says the last segment holds 0 bytes: only the roll recorded sizes
    restarted = new_file(MemoryProvider(memory_provider.url), metadata)
    assert await restarted.recover() is True
    assert [s.base_offset for s in restarted.segments] == [0, 90]
    assert restarted.commit_offset == 150
    assert await restarted.read(0, 150) == b"".join(chunk(i) for i in range(5))
    await restarted.append(chunk(5), BASE_TIMESTAMP + 5)  # appends go on from the corrected end
    await restarted.commit()
    assert await restarted.read(150, 30) == chunk(5)


async def test_recover_finishes_an_interrupted_removal(
    memory_provider: MemoryProvider, metadata: MetadataStore
) -> None:
    flat = new_file(memory_provider, metadata)
    for i in range(6):
        await flat.append(chunk(i), BASE_TIMESTAMP + i)
    await flat.commit()
    # A crash after marking segment 0 DELETING but before its object went away.
    metadata.update_segment(SegmentUpdate(PATH, FileType.COMMIT_LOG, 0, status=SegmentStatus.DELETING))
    restarted = new_file(MemoryProvider(memory_provider.url), metadata)
    await restarted.recover()
    assert restarted.min_offset == 90
    assert not await memory_provider.segment(FileType.COMMIT_LOG, PATH, 0).exists()
    assert metadata.get_segment(PATH, FileType.COMMIT_LOG, 0).status is SegmentStatus.DELETED


async def test_truncate_removes_whole_tail_segments_and_cuts_the_one_holding_the_offset(
    memory_provider: MemoryProvider, metadata: MetadataStore
) -> None:
    flat = new_file(memory_provider, metadata)
    for i in range(7):
        await flat.append(chunk(i), BASE_TIMESTAMP + i)
    await flat.commit()
    await flat.truncate(100)
    assert [s.base_offset for s in flat.segments] == [0, 90]
    assert flat.commit_offset == 100
    assert await memory_provider.segment(FileType.COMMIT_LOG, PATH, 180).real_size() == 0
    assert [r.base_offset for r in metadata.list_segments(PATH, FileType.COMMIT_LOG)] == [0, 90]
    await flat.truncate(90)  # the sealed segment 0 is the last now and writable again
    assert [s.base_offset for s in flat.segments] == [0]
    await flat.truncate(50)
    assert metadata.get_segment(PATH, FileType.COMMIT_LOG, 0).status is SegmentStatus.NEW
    await flat.append(b"x" * 20, BASE_TIMESTAMP)
    await flat.commit()
    assert await flat.read(0, 100) == chunk(0) + chunk(1)[:20] + b"x" * 20


async def test_consume_queue_commits_its_commit_log_first(
    memory_provider: MemoryProvider, metadata: MetadataStore
) -> None:
    commit_log = FlatCommitLogFile(memory_provider, metadata, PATH)
    consume_queue = FlatConsumeQueueFile(memory_provider, metadata, PATH, commit_log=commit_log)
    await commit_log.append(b"r" * 100, BASE_TIMESTAMP)
    await consume_queue.append_unit(ConsumeQueueUnit(0, 100, 0), BASE_TIMESTAMP)
    await consume_queue.commit()
    assert commit_log.commit_offset == 100
    assert consume_queue.commit_queue_offset == 1


async def test_consume_queue_rolls_on_whole_units(memory_provider: MemoryProvider, metadata: MetadataStore) -> None:
    queue = FlatConsumeQueueFile(memory_provider, metadata, PATH, max_segment_size=50, initial_queue_offset=7)
    for i in range(5):
        assert await queue.append_unit(ConsumeQueueUnit(i * 10, 10, i), BASE_TIMESTAMP) == 7 + i
    await queue.commit()
    assert [s.base_offset for s in queue.segments] == [140, 180, 220]  # two 20-byte units per 40-byte segment
    assert [u.commitlog_offset for u in await queue.read_units(8, 3)] == [10, 20, 30]
    assert (queue.min_queue_offset, queue.commit_queue_offset) == (7, 12)


async def test_both_files_roll_by_time_whatever_their_size_and_never_when_empty(
    memory_provider: MemoryProvider, metadata: MetadataStore
) -> None:
    now = [BASE_TIMESTAMP]
    commit_log = FlatCommitLogFile(memory_provider, metadata, PATH, rolling_interval_ms=1000, clock=lambda: now[0])
    queue = FlatConsumeQueueFile(
        memory_provider, metadata, PATH, commit_log=commit_log, rolling_interval_ms=1000, clock=lambda: now[0]
    )
    await commit_log.append(b"a" * 60, BASE_TIMESTAMP)
    await queue.append_unit(ConsumeQueueUnit(0, 60, 0), BASE_TIMESTAMP)
    assert await commit_log.try_rolling(BASE_TIMESTAMP + 999) is False  # not old enough
    now[0] += 1000
    # 60 bytes and one unit: small segments roll too, so that retention can remove them.
    assert await queue.try_rolling() is True and await commit_log.try_rolling() is True
    assert [s.base_offset for s in commit_log.segments] == [0, 60]
    assert [s.base_offset for s in queue.segments] == [0, UNIT_SIZE]
    for file_type in (FileType.COMMIT_LOG, FileType.CONSUME_QUEUE):
        assert metadata.get_segment(PATH, file_type, 0).status is SegmentStatus.SEALED
    now[0] += 10_000
    # The new segments are empty: sealing them would leave nothing to write to.
    assert await queue.try_rolling() is False and await commit_log.try_rolling() is False
    assert metadata.get_segment(PATH, FileType.COMMIT_LOG, 60).status is SegmentStatus.NEW


async def test_commit_log_finds_segments_by_queue_offset_and_time(
    memory_provider: MemoryProvider, metadata: MetadataStore
) -> None:
    commit_log = FlatCommitLogFile(memory_provider, metadata, PATH, max_segment_size=400)
    ends = []
    for offset in range(100, 112):
        record = make_record(offset, size=100)
        await commit_log.append(record, BASE_TIMESTAMP + offset)
        ends.append(commit_log.append_offset)
    await commit_log.commit()
    assert len(commit_log.segments) >= 3
    firsts = [await commit_log.first_queue_offset(s) for s in commit_log.segments]
    assert firsts[0] == 100 and firsts == sorted(firsts)
    for offset in (100, firsts[1] - 1, firsts[1], 111):
        segment = await commit_log.segment_for_queue_offset(offset)
        assert segment.base_offset == commit_log.segments[sum(f <= offset for f in firsts) - 1].base_offset
    with pytest.raises(NotFoundError):
        await commit_log.segment_for_queue_offset(99)
    assert commit_log.segment_for_timestamp(0) is commit_log.segments[0]
    assert commit_log.segment_for_timestamp(BASE_TIMESTAMP + 111) is commit_log.segments[-1]


@pytest.mark.parametrize(
    ("timestamp", "lower", "upper"),
    [
        (0, 0, 0),  # before everything
        (10, 0, 1),  # equal to the first run of ties
        (15, 2, 1),  # between two times
        (20, 2, 4),
        (30, 5, 5),
        (99, 6, 5),  # after everything: LOWER is the commit offset, UPPER the last offset
    ],
)
async def test_time_search_lower_and_upper_bounds(
    memory_provider: MemoryProvider, metadata: MetadataStore, timestamp: int, lower: int, upper: int
) -> None:
    times = [10, 10, 20, 20, 20, 30]
    queue = FlatConsumeQueueFile(memory_provider, metadata, PATH, max_segment_size=40)
    for index in range(len(times)):
        await queue.append_unit(ConsumeQueueUnit(index, 1, 0), times[index])
    await queue.commit()

    async def time_of(unit: ConsumeQueueUnit) -> int:
        return times[unit.commitlog_offset]

    assert await queue.find_queue_offset(timestamp, BoundaryType.LOWER, time_of) == lower
    assert await queue.find_queue_offset(timestamp, BoundaryType.UPPER, time_of) == upper
