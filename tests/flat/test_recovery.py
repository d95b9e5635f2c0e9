"""Kill the archiver between any two steps of a commit; after restart the queue is exactly what is durable.

Each scenario archives messages 0..9 cleanly, buffers 10..19, then dies at one point of the commit
(SimulatedCrash is a BaseException: no code under test can react to it). The restart is a new
provider on the same storage root and a new MetadataStore on the same database, recovered by
FlatFileStore.recover. Then the archive must hold exactly the offsets whose unit and bytes are both
durable, no commit-log byte may be unreferenced, and archiving must go on from there to offset 30.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from tests.fixtures.backends import ProviderBackend
from tieredstore.flat import FlatFileSettings, FlatFileStore, FlatMessageFile, check_queue_invariant
from tieredstore.formats.consume_queue import UNIT_SIZE
from tieredstore.formats.naming import FileType
from tieredstore.leases import LeaseManager
from tieredstore.metadata import MetadataStore, upgrade
from tieredstore.providers.base import Provider

from .helpers import TOPIC, CrashingProvider, CrashPlan, SimulatedCrash, append_range, make_record

pytestmark = pytest.mark.reliability

CLEAN, BUFFERED, TOTAL = 10, 20, 30


def _whole_records_within(length: int, first: int) -> int:
    """How many records from queue offset ``first`` fit whole in the first ``length`` bytes of a batch."""
    count, used = 0, 0
    while used + len(make_record(first + count)) <= length:
        used += len(make_record(first + count))
        count += 1
    return count


@dataclass(frozen=True)
class Scenario:
    name: str
    plan: Callable[[], CrashPlan]
    expected_archived: int
    crash_in_metadata: bool = False
    lost_reply: bool = False
    roll_commit_log: bool = False
    commit_reports_success: bool = False
    # Under leases the whole records a cut-short commit left in the commit log are kept and given units.
    expected_under_leases: int | None = None


SCENARIOS = [
    Scenario(
        "commit-log-durable-consume-queue-not",
        lambda: CrashPlan(crash_on=FileType.CONSUME_QUEUE),
        CLEAN,
        expected_under_leases=BUFFERED,
    ),
    Scenario(
        "commit-log-half-written",
        lambda: CrashPlan(crash_on=FileType.COMMIT_LOG, land_bytes=301),
        CLEAN,
        expected_under_leases=CLEAN + _whole_records_within(301, CLEAN),
    ),
    Scenario(
        "consume-queue-partial-unit",
        lambda: CrashPlan(crash_on=FileType.CONSUME_QUEUE, land_bytes=3 * UNIT_SIZE + 7),
        CLEAN + 3,
        expected_under_leases=BUFFERED,
    ),
    Scenario("consume-queue-durable-metadata-not", CrashPlan, BUFFERED, crash_in_metadata=True),
    Scenario(
        "metadata-written-commit-log-chunk-lost",
        lambda: CrashPlan(lose_on=FileType.COMMIT_LOG),
        CLEAN,
        commit_reports_success=True,
    ),
    Scenario(
        "commit-log-reply-lost-then-killed",
        CrashPlan,
        CLEAN,
        lost_reply=True,
        expected_under_leases=BUFFERED,
    ),
    Scenario(
        "new-commit-log-segment-orphaned",
        lambda: CrashPlan(crash_on=FileType.CONSUME_QUEUE),
        CLEAN,
        roll_commit_log=True,
        expected_under_leases=BUFFERED,
    ),
]


async def _archive_then_crash(backend: ProviderBackend, metadata_url: str, scenario: Scenario) -> dict[int, bytes]:
    """The first life of the archiver; returns the hot reference copies of what it appended."""
    plan = scenario.plan()
    provider: Provider = CrashingProvider(backend(), plan)
    settings = FlatFileSettings()
    if scenario.roll_commit_log:
        clean_size = sum(len(make_record(o)) for o in range(CLEAN))
        settings = FlatFileSettings(commit_log_max_size=clean_size)
    metadata = MetadataStore(metadata_url)
    store = FlatFileStore(provider, metadata, cluster="c", broker="b", settings=settings)
    queue = await store.get_or_create(TOPIC, 0)
    hot = await append_range(queue, 0, CLEAN)
    await queue.commit()
    hot |= await append_range(queue, CLEAN, BUFFERED)
    plan.armed = True
    if scenario.crash_in_metadata:

        def die(*args: object, **kwargs: object) -> None:
            raise SimulatedCrash("killed before the metadata transaction")

        metadata.record_commits = die  # type: ignore[method-assign]
    if scenario.lost_reply:
        await _commit_with_lost_reply(queue)
    elif scenario.commit_reports_success:
        assert await queue.commit() == BUFFERED  # storage acknowledged bytes it then lost
    else:
        with pytest.raises(SimulatedCrash):
            await queue.commit()
    if scenario.roll_commit_log:
        assert len(queue.commit_log.segments) >= 2  # the lost batch went to segments of its own
    metadata.close()
    return hot


async def _commit_with_lost_reply(queue: FlatMessageFile) -> None:
    """The commit-log bytes land but the reply is lost; the process is killed before any retry."""
    segment = queue.commit_log.segments[-1]
    inner_commit = segment._commit

    async def landed_then_lost(position: int, data: bytes) -> None:
        await inner_commit(position, data)
        raise SimulatedCrash("reply lost, then killed")

    segment._commit = landed_then_lost  # type: ignore[method-assign]
    with pytest.raises(SimulatedCrash):
        await queue.commit()


@pytest.mark.parametrize("provider_factory", ["memory", "posix", "s3"], indirect=True)
@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
async def test_restart_after_a_crash_keeps_exactly_what_is_durable(
    provider_factory: ProviderBackend, sqlite_url: str, scenario: Scenario
) -> None:
    upgrade(sqlite_url)
    hot = await _archive_then_crash(provider_factory, sqlite_url, scenario)

    with MetadataStore(sqlite_url) as metadata:
        store = FlatFileStore(provider_factory(), metadata, cluster="c", broker="b")
        report = await store.recover()
        assert not report.failed
        queue = store.get(TOPIC, 0)
        assert queue.archived_offset == scenario.expected_archived
        assert metadata.get_queue(TOPIC, 0).max_offset == scenario.expected_archived
        # No orphan bytes, every archived message exactly once, byte-identical to the hot copy.
        assert await check_queue_invariant(queue, reference=hot) == []
        last = (await queue.read_units(queue.archived_offset - 1, 1))[0]
        assert queue.commit_log.commit_offset == last.commitlog_offset + last.size
        assert await queue.commit_log.segments[-1].real_size() == (
            queue.commit_log.commit_offset - queue.commit_log.segments[-1].base_offset
        )

        # Archiving goes on from the recovered offset.
        hot |= await append_range(queue, queue.archived_offset, TOTAL)
        assert await queue.commit() == TOTAL
        assert await check_queue_invariant(queue, reference=hot) == []

    # And a second, clean restart sees the same thing.
    with MetadataStore(sqlite_url) as metadata:
        store = FlatFileStore(provider_factory(), metadata, cluster="c", broker="b")
        report = await store.recover()
        assert not report.changed
        assert store.get(TOPIC, 0).archived_offset == TOTAL
        assert await check_queue_invariant(store.get(TOPIC, 0), reference=hot) == []


@pytest.mark.parametrize("provider_factory", ["memory", "posix", "s3"], indirect=True)
async def test_crash_during_expiry_is_finished_by_recovery(provider_factory: ProviderBackend, sqlite_url: str) -> None:
    upgrade(sqlite_url)
    settings = FlatFileSettings(commit_log_max_size=600, consume_queue_max_size=100)
    plan = CrashPlan()
    with MetadataStore(sqlite_url) as metadata:
        store = FlatFileStore(
            CrashingProvider(provider_factory(), plan), metadata, cluster="c", broker="b", settings=settings
        )
        queue = await store.get_or_create(TOPIC, 0)
        hot = await append_range(queue, 0, 20, timestamp_of=lambda offset: 1000 * offset)
        await queue.commit()
        head = queue.consume_queue.segments[0]

        async def die() -> None:
            raise SimulatedCrash("killed after marking DELETING, before the object went")

        head._destroy = die  # type: ignore[method-assign]
        with pytest.raises(SimulatedCrash):
            await queue.destroy_expired(10_000)
    with MetadataStore(sqlite_url) as metadata:
        store = FlatFileStore(provider_factory(), metadata, cluster="c", broker="b", settings=settings)
        await store.recover()
        queue = store.get(TOPIC, 0)
        assert queue.min_offset == 5  # the DELETING head segment (offsets 0..4) was finished off
        assert not await provider_factory().segment(FileType.CONSUME_QUEUE, queue.path, 0).exists()
        await queue.destroy_expired(10_000)
        assert (
            await check_queue_invariant(queue, reference={o: r for o, r in hot.items() if o >= queue.min_offset}) == []
        )
        assert metadata.get_queue(TOPIC, 0).min_offset == queue.min_offset


async def _stored_sizes(provider: Provider, path: str) -> dict[tuple[FileType, int], int]:
    """The real size of every segment in storage, commit log and consume queue, by (type, base offset)."""
    sizes = {}
    for file_type in (FileType.COMMIT_LOG, FileType.CONSUME_QUEUE):
        for base in await provider.list_segments(path, file_type):
            sizes[file_type, base] = await provider.segment(file_type, path, base).real_size()
    return sizes


@pytest.mark.parametrize("provider_factory", ["memory", "posix", "s3"], indirect=True)
@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
async def test_restart_under_leases_cuts_by_abandoning_bytes_never_by_deleting_them(
    provider_factory: ProviderBackend, sqlite_url: str, scenario: Scenario
) -> None:
    """Under leases recovery must not delete committed bytes: a stalled archiver still inside its own
    recovery when a successor takes the queue over would delete what the successor wrote since. The
    whole records a cut-short commit left in the commit log get their units (the commit is finished, not
    undone); anything else past the archive is abandoned: the segment is sealed there and the file goes
    on in a new one. Nothing in storage shrinks or disappears."""
    upgrade(sqlite_url)
    hot = await _archive_then_crash(provider_factory, sqlite_url, scenario)
    with MetadataStore(sqlite_url) as metadata:
        lease = LeaseManager(metadata, owner="successor", lease_duration=30, renew_interval=10)
        lease.round()
        store = FlatFileStore(provider_factory(), metadata, cluster="c", broker="b")
        path = store.queue_path(TOPIC, 0)
        before = await _stored_sizes(provider_factory(), path)
        report = await store.recover(leases=lease.hold)
        assert not report.failed
        queue = store.get(TOPIC, 0)
        after = await _stored_sizes(provider_factory(), path)
        shrunk = {key: (size, after.get(key)) for key, size in before.items() if after.get(key, -1) < size}
        assert not shrunk, "recovery under leases deleted bytes in storage"
        expected = scenario.expected_under_leases or scenario.expected_archived
        assert queue.archived_offset == expected
        assert metadata.get_queue(TOPIC, 0).max_offset == expected
        assert await check_queue_invariant(queue, reference=hot) == []
        hot |= await append_range(queue, queue.archived_offset, TOTAL)
        assert await queue.commit() == TOTAL
        assert await check_queue_invariant(queue, reference=hot) == []
        assert len(await queue.read_messages(0, TOTAL)) == TOTAL

    with MetadataStore(sqlite_url) as metadata:
        lease = LeaseManager(metadata, owner="successor", lease_duration=30, renew_interval=10)
        lease.round()
        store = FlatFileStore(provider_factory(), metadata, cluster="c", broker="b")
        report = await store.recover(leases=lease.hold)
        assert not report.changed
        assert await check_queue_invariant(store.get(TOPIC, 0), reference=hot) == []
