"""Offsets the hot store lost before they were archived: skip_to records a hole that reads, searches,
the checker, expiry and recovery (after clean restarts and crashes) all respect."""

from __future__ import annotations

import pytest

from tests.fixtures.backends import ProviderBackend
from tieredstore.errors import NotFoundError, ValidationError
from tieredstore.flat import (
    BoundaryType,
    FlatFileSettings,
    FlatFileStore,
    FlatMessageFile,
    ProblemKind,
    check_queue_invariant,
)
from tieredstore.formats.consume_queue import UNIT_SIZE
from tieredstore.formats.message import decode
from tieredstore.formats.naming import FileType
from tieredstore.metadata import MetadataStore, SegmentStatus, upgrade
from tieredstore.providers.base import Provider
from tieredstore.providers.memory import MemoryProvider

from .helpers import TOPIC, CrashingProvider, CrashPlan, SimulatedCrash, append_range

SMALL = FlatFileSettings(commit_log_max_size=1000, consume_queue_max_size=5 * UNIT_SIZE)


def new_store(provider: Provider, metadata: MetadataStore, settings: FlatFileSettings = SMALL) -> FlatFileStore:
    return FlatFileStore(provider, metadata, cluster="c", broker="b", settings=settings)


async def queue_with_hole(
    store: FlatFileStore, *, before: int = 12, resume: int = 20, after: int = 30
) -> tuple[FlatMessageFile, dict[int, bytes]]:
    """Offsets 0..before-1 archived, before..resume-1 lost, resume..after-1 archived."""
    queue = await store.get_or_create(TOPIC, 0)
    hot = await append_range(queue, 0, before)
    await queue.commit()
    assert await queue.skip_to(resume) == resume
    hot |= await append_range(queue, resume, after)
    await queue.commit()
    return queue, hot


async def test_skip_records_a_hole_and_archiving_goes_on(
    memory_provider: MemoryProvider, metadata: MetadataStore
) -> None:
    queue, hot = await queue_with_hole(new_store(memory_provider, metadata))
    assert (queue.min_offset, queue.archived_offset) == (0, 30)
    assert queue.lost_ranges == [(12, 20)]
    assert queue.archived_runs == [(0, 12), (20, 30)]
    assert metadata.get_queue(TOPIC, 0).max_offset == 30
    # The consume queue segment before the hole is sealed; the next one starts at the resumed offset.
    rows = {r.base_offset: r for r in metadata.list_segments(queue.path, FileType.CONSUME_QUEUE)}
    assert rows[10 * UNIT_SIZE].status is SegmentStatus.SEALED and rows[10 * UNIT_SIZE].size == 2 * UNIT_SIZE
    assert 20 * UNIT_SIZE in rows and 12 * UNIT_SIZE not in rows

    for lost in (12, 15, 19):
        with pytest.raises(NotFoundError, match="hole"):
            await queue.read_units(lost, 1)
        with pytest.raises(NotFoundError):
            await queue.read_messages(lost, 1)
    # A read that starts before the hole stops where it begins, never returning foreign bytes.
    assert [decode(r).queue_offset for r in await queue.read_messages(8, 10)] == [8, 9, 10, 11]
    assert [decode(r).queue_offset for r in await queue.read_messages(20, 3)] == [20, 21, 22]
    assert queue.next_archived_offset(13) == 20 and queue.next_archived_offset(11) == 11
    assert queue.archived_run_end(9) == 12 and queue.archived_run_end(25) == 30

    # The commit log did not skip: the first record after the hole follows the last one before it.
    before, after = (await queue.read_units(11, 1))[0], (await queue.read_units(20, 1))[0]
    assert after.commitlog_offset == before.commitlog_offset + before.size
    assert await check_queue_invariant(queue, reference=hot, batch=4) == []


async def test_an_empty_queue_simply_starts_at_the_skipped_offset(
    memory_provider: MemoryProvider, metadata: MetadataStore
) -> None:
    queue = await new_store(memory_provider, metadata).get_or_create(TOPIC, 3)
    await queue.skip_to(50)
    assert (queue.min_offset, queue.archived_offset, queue.lost_ranges) == (50, 50, [])
    position = metadata.get_queue(TOPIC, 3)
    assert (position.min_offset, position.max_offset) == (50, 50)
    hot = await append_range(queue, 50, 53)
    assert await queue.commit() == 53
    assert await check_queue_invariant(queue, reference=hot) == []


async def test_two_losses_in_a_row_make_one_hole(memory_provider: MemoryProvider, metadata: MetadataStore) -> None:
    store = new_store(memory_provider, metadata)
    queue = await store.get_or_create(TOPIC, 0)
    hot = await append_range(queue, 0, 7)
    await queue.commit()
    await queue.skip_to(20)
    await queue.skip_to(33)  # nothing archived between: the empty segment at 20 is dropped, not sealed
    assert queue.lost_ranges == [(7, 33)]
    assert [r.base_offset // UNIT_SIZE for r in metadata.list_segments(queue.path, FileType.CONSUME_QUEUE)] == [
        0,
        5,
        33,
    ]
    hot |= await append_range(queue, 33, 36)
    await queue.commit()
    assert await check_queue_invariant(queue, reference=hot) == []


async def test_skip_refuses_buffered_messages_and_going_back(
    memory_provider: MemoryProvider, metadata: MetadataStore
) -> None:
    queue = await new_store(memory_provider, metadata).get_or_create(TOPIC, 0)
    await append_range(queue, 0, 5)
    with pytest.raises(ValidationError, match="commit buffered"):
        await queue.skip_to(9)
    await queue.commit()
    with pytest.raises(ValidationError, match="cannot skip back"):
        await queue.skip_to(4)
    assert await queue.skip_to(5) == 5  # already there: nothing to record
    assert queue.lost_ranges == []


async def test_time_search_skips_the_hole(memory_provider: MemoryProvider, metadata: MetadataStore) -> None:
    queue, _ = await queue_with_hole(new_store(memory_provider, metadata))
    # helpers stamp offset o at BASE + o; the lost offsets 12..19 never had a cold time.
    base = decode((await queue.read_messages(0, 1))[0]).store_timestamp
    assert await queue.find_queue_offset(base + 15, BoundaryType.LOWER) == 20
    assert await queue.find_queue_offset(base + 15, BoundaryType.UPPER) == 11
    assert await queue.find_queue_offset(base + 25, BoundaryType.LOWER) == 25
    assert await queue.find_queue_offset(base + 99, BoundaryType.LOWER) == 30


async def test_expiry_past_the_hole_moves_the_min_offset_over_it(
    memory_provider: MemoryProvider, metadata: MetadataStore
) -> None:
    queue, hot = await queue_with_hole(new_store(memory_provider, metadata))
    base = decode((await queue.read_messages(0, 1))[0]).store_timestamp
    await queue.destroy_expired(base + 21)
    assert queue.min_offset == 20 and queue.lost_ranges == []
    assert metadata.get_queue(TOPIC, 0).min_offset == 20
    assert await check_queue_invariant(queue, reference={o: r for o, r in hot.items() if o >= 20}) == []


async def test_checker_flags_a_hole_that_lost_archived_messages(
    memory_provider: MemoryProvider, metadata: MetadataStore
) -> None:
    store = new_store(memory_provider, metadata)
    queue = await store.get_or_create(TOPIC, 0)
    hot = await append_range(queue, 0, 15)
    await queue.commit()
    # The row of the consume-queue segment holding offsets 5..9 goes missing: a hole nobody recorded,
    # and the commit log still holds those five messages.
    metadata.delete_segment(queue.path, FileType.CONSUME_QUEUE.value, 5 * UNIT_SIZE)
    reloaded = new_store(memory_provider, metadata)
    await reloaded.recover()
    damaged = reloaded.get(TOPIC, 0)
    assert damaged.lost_ranges == [(5, 10)]
    problems = await check_queue_invariant(damaged, reference=hot)
    assert [p.kind for p in problems] == [ProblemKind.UNRECORDED_GAP]
    assert problems[0].queue_offset == 10
    assert "5..9" in problems[0].detail


@pytest.mark.parametrize("provider_factory", ["memory", "posix", "s3"], indirect=True)
async def test_a_restart_keeps_the_hole(provider_factory: ProviderBackend, sqlite_url: str) -> None:
    upgrade(sqlite_url)
    with MetadataStore(sqlite_url) as metadata:
        store = new_store(provider_factory(), metadata)
        queue, hot = await queue_with_hole(store, after=20)  # nothing after the hole yet
    with MetadataStore(sqlite_url) as metadata:
        store = new_store(provider_factory(), metadata)
        report = await store.recover()
        assert not report.changed and not report.failed
        queue = store.get(TOPIC, 0)
        assert (queue.archived_offset, queue.lost_ranges) == (20, [(12, 20)])
        hot |= await append_range(queue, 20, 26)
        await queue.commit()
    with MetadataStore(sqlite_url) as metadata:
        store = new_store(provider_factory(), metadata)
        report = await store.recover()
        assert not report.changed
        queue = store.get(TOPIC, 0)
        assert (queue.archived_offset, queue.lost_ranges) == (26, [(12, 20)])
        assert await check_queue_invariant(queue, reference=hot) == []


@pytest.mark.parametrize(
    ("land_bytes", "expected_archived"),
    [(0, 20), (3 * UNIT_SIZE + 7, 23), (7, 20)],
    ids=["consume-queue-lost", "three-units-and-a-half", "half-a-unit"],
)
async def test_a_crash_just_after_the_hole_keeps_it(
    memory_provider: MemoryProvider, sqlite_url: str, land_bytes: int, expected_archived: int
) -> None:
    """Messages after the hole reach the commit log, then the consume-queue commit dies part way."""
    upgrade(sqlite_url)
    plan = CrashPlan(crash_on=FileType.CONSUME_QUEUE, land_bytes=land_bytes)
    with MetadataStore(sqlite_url) as metadata:
        queue, hot = await queue_with_hole(new_store(CrashingProvider(memory_provider, plan), metadata), after=20)
        hot |= await append_range(queue, 20, 25)
        plan.armed = True
        with pytest.raises(SimulatedCrash):
            await queue.commit()
    with MetadataStore(sqlite_url) as metadata:
        store = new_store(MemoryProvider(memory_provider.url), metadata)
        await store.recover()
        queue = store.get(TOPIC, 0)
        assert queue.archived_offset == expected_archived
        assert queue.lost_ranges == [(12, 20)]
        assert metadata.get_queue(TOPIC, 0).max_offset == expected_archived
        assert await check_queue_invariant(queue, reference=hot) == []  # orphan commit-log bytes are gone
        hot |= await append_range(queue, expected_archived, 28)
        assert await queue.commit() == 28
        assert await check_queue_invariant(queue, reference=hot) == []


async def test_runs_asked_after_every_change_are_current(
    memory_provider: MemoryProvider, metadata: MetadataStore
) -> None:
    """Readers ask for the runs on every call, and the answer is remembered between changes: each kind of
    change (appends within a segment, rolls, a hole, expiry of head segments) must show at once."""
    queue = await new_store(memory_provider, metadata).get_or_create(TOPIC, 0)
    assert (queue.archived_runs, queue.lost_ranges) == ([], [])
    await append_range(queue, 0, 3)
    await queue.commit()  # within the first consume-queue segment (5 units)
    assert (queue.archived_runs, queue.lost_ranges) == ([(0, 3)], [])
    await append_range(queue, 3, 12)
    await queue.commit()  # rolled twice
    assert (queue.archived_runs, queue.lost_ranges) == ([(0, 12)], [])
    await queue.skip_to(20)
    assert (queue.archived_runs, queue.lost_ranges) == ([(0, 12)], [(12, 20)])
    await append_range(queue, 20, 21)
    await queue.commit()
    assert (queue.archived_runs, queue.lost_ranges) == ([(0, 12), (20, 21)], [(12, 20)])
    assert queue.archived_run_end(20) == 21
    await append_range(queue, 21, 30)
    await queue.commit()
    assert queue.archived_run_end(20) == 30 and queue.archived_run_end(3) == 12
    base = decode((await queue.read_messages(0, 1))[0]).store_timestamp
    await queue.destroy_expired(base + 6)  # the head segments that end before offset 6 go
    assert queue.min_offset > 0 and queue.archived_runs[0][0] == queue.min_offset
    assert queue.lost_ranges == [(12, 20)]
    await queue.destroy_expired(base + 21)
    assert (queue.archived_runs, queue.lost_ranges) == ([(20, 30)], [])
