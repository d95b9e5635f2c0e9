"""Segment changes are fenced by the lease epoch like positions are: a zombie archiver cannot roll,
seal, cut or delete the cold files of a queue another archiver has taken over.

An archiver paused past its lease could otherwise, on waking, seal the successor's open segment or add
a segment row at its own (older) offset. Each change names the epoch its writer holds (an argument).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator

import pytest

from tests.flat.helpers import BASE_TIMESTAMP, CrashingProvider, CrashPlan, SimulatedCrash, append_range
from tieredstore.errors import LeaseLostError
from tieredstore.flat import FlatFileStore, check_queue_invariant
from tieredstore.flat.commit_log import FlatCommitLogFile
from tieredstore.formats.naming import FileType
from tieredstore.leases import LeaseManager
from tieredstore.metadata import LeaseHold, MetadataStore, SegmentStatus, SegmentUpdate, upgrade
from tieredstore.providers.memory import MemoryProvider

pytestmark = pytest.mark.usefixtures("no_idle_transaction_limit")

TOPIC = "Orders"
PATH = "abcd1234_c/b/Orders/0"
QUEUE = (TOPIC, 0)


@pytest.fixture
def stores(metadata_url: str) -> Iterator[list[MetadataStore]]:
    """A zombie's store and its successor's (own connections each, like separate processes)."""
    upgrade(metadata_url)
    opened = [MetadataStore(metadata_url) for _ in range(2)]
    opened[0].get_or_create_queue(TOPIC, 0)
    yield opened
    for store in opened:
        store.close()


def hold_lease(zombie_store: MetadataStore) -> LeaseHold:
    """The zombie holds the queue's lease (without a storage hold), as it opens the queue under it."""
    zombie = LeaseManager(zombie_store, owner="zombie", lease_duration=1.5, renew_interval=0.5)
    zombie.round()
    return LeaseHold(QUEUE, zombie.epoch_of)


def replace_after_stall(successor_store: MetadataStore) -> None:
    """The zombie stalls past its lease (it has not noticed yet) and the successor takes the queue over."""
    time.sleep(1.7)
    LeaseManager(successor_store, owner="successor", lease_duration=1.5, renew_interval=0.5).round()


def test_a_stale_epoch_cannot_add_update_or_delete_a_queues_segments(stores: list[MetadataStore]) -> None:
    zombie_store, successor_store = stores
    epoch = hold_lease(zombie_store).epoch()
    # While it holds the lease.
    zombie_store.add_segment(PATH, FileType.COMMIT_LOG, 0, queue=QUEUE, expected_epoch=epoch)
    replace_after_stall(successor_store)
    with pytest.raises(LeaseLostError, match="epoch 2"):
        zombie_store.add_segment(PATH, FileType.COMMIT_LOG, 100, queue=QUEUE, expected_epoch=epoch)
    with pytest.raises(LeaseLostError, match="epoch 2"):
        zombie_store.update_segment(
            SegmentUpdate(PATH, FileType.COMMIT_LOG, 0, size=100, status=SegmentStatus.SEALED),
            queue=QUEUE,
            expected_epoch=epoch,
        )
    with pytest.raises(LeaseLostError, match="epoch 2"):
        zombie_store.delete_segment(PATH, FileType.COMMIT_LOG, 0, queue=QUEUE, expected_epoch=epoch)
    with pytest.raises(LeaseLostError):
        zombie_store.leases.check_lease(QUEUE, epoch)
    # Nothing changed: one segment, still NEW and empty.
    rows = successor_store.list_segments(PATH, FileType.COMMIT_LOG)
    assert [(r.base_offset, r.status, r.size) for r in rows] == [(0, SegmentStatus.NEW, 0)]
    # Without an epoch (the CLI, a lone archiver) nothing is checked; the successor's epoch passes.
    successor_store.add_segment(PATH, FileType.COMMIT_LOG, 100, queue=QUEUE)
    successor_store.leases.check_lease(QUEUE, epoch + 1)


async def test_a_zombie_archivers_roll_changes_nothing_the_successor_sees(stores: list[MetadataStore]) -> None:
    zombie_store, successor_store = stores
    provider = MemoryProvider()
    zombie_log = FlatCommitLogFile(provider, zombie_store, PATH, lease=hold_lease(zombie_store))
    await zombie_log.append(b"a" * 100, BASE_TIMESTAMP)
    await zombie_log.commit()
    replace_after_stall(successor_store)
    await zombie_log.append(b"b" * 50, BASE_TIMESTAMP + 1)
    with pytest.raises(LeaseLostError):
        await zombie_log.roll(BASE_TIMESTAMP + 2)  # it would seal segment 0 and add one at 150
    with pytest.raises(LeaseLostError):
        await zombie_log.truncate(40)  # it would cut committed bytes the successor may rely on
    rows = successor_store.list_segments(PATH, FileType.COMMIT_LOG)
    assert [(r.base_offset, r.status) for r in rows] == [(0, SegmentStatus.NEW)]
    assert await provider.segment(FileType.COMMIT_LOG, PATH, 0, commit_position=150).read(0, 100) == b"a" * 100


def test_a_passed_lease_check_holds_the_queue_until_the_deletion_it_guards_is_done(
    stores: list[MetadataStore],
) -> None:
    """A lease past its expiry but not yet taken over passes the epoch check; the check must then hold
    it, or a successor could take the queue between the check and the deletion, and the zombie's late
    delete would remove what the successor wrote there."""
    zombie_store, successor_store = stores
    zombie = LeaseManager(zombie_store, owner="zombie", lease_duration=1.5, renew_interval=0.5)
    zombie.round()
    epoch = zombie.epoch_of(*QUEUE)
    time.sleep(1.7)  # expired: renewals stopped (a stall), but nobody has taken the queue yet
    zombie_store.leases.check_lease(QUEUE, epoch, hold_ms=1500)  # about to cut orphan bytes
    successor = LeaseManager(successor_store, owner="successor", lease_duration=1.5, renew_interval=0.5)
    successor.round()
    assert not successor.holds(QUEUE), "the queue was taken over between the check and the deletion"
    time.sleep(1.7)  # the hold is over and the zombie did not renew: now the takeover goes ahead
    successor.round()
    assert successor.holds(QUEUE)
    with pytest.raises(LeaseLostError, match="epoch 2"):
        zombie_store.leases.check_lease(QUEUE, epoch, hold_ms=1500)


async def test_a_zombie_truncation_before_a_takeover_holds_the_queue(
    stores: list[MetadataStore],
) -> None:
    zombie_store, successor_store = stores
    provider = MemoryProvider()
    zombie = LeaseManager(zombie_store, owner="zombie", lease_duration=1.5, renew_interval=0.5)
    zombie.round()
    zombie_log = FlatCommitLogFile(provider, zombie_store, PATH, lease=zombie.hold(QUEUE))
    await zombie_log.append(b"a" * 100, BASE_TIMESTAMP)
    await zombie_log.commit()
    await asyncio.sleep(1.7)
    await zombie_log.truncate(40)  # expired but not taken over: allowed, and it holds the queue
    successor = LeaseManager(successor_store, owner="successor", lease_duration=1.5, renew_interval=0.5)
    assert not successor.round().acquired
    assert await provider.segment(FileType.COMMIT_LOG, PATH, 0, commit_position=40).read(0, 40) == b"a" * 40


def test_a_released_queue_refuses_storage_changes(stores: list[MetadataStore]) -> None:
    """Once released (no owner), the next archiver may take the queue at once: nothing is held for it."""
    zombie_store, _ = stores
    zombie = LeaseManager(zombie_store, owner="zombie", lease_duration=1.5, renew_interval=0.5)
    zombie.round()
    epoch = zombie.epoch_of(*QUEUE)
    zombie_store.leases.release_leases("zombie")  # e.g. shutting down while a deletion was about to start
    with pytest.raises(LeaseLostError, match="released"):
        zombie_store.leases.check_lease(QUEUE, epoch, hold_ms=1500)


async def test_a_zombie_cut_after_a_takeover_removes_nothing_the_successor_wrote(
    stores: list[MetadataStore],
) -> None:
    """The race a lease check cannot close: the zombie checked its lease, stalled, and cuts orphan bytes
    after a successor has taken the queue over and archived on from there (finishing the commit the
    crash cut short, so those bytes are now archived messages). Under leases no recovery deletes, so
    the cut removes nothing, and the successor's archive stays whole."""
    zombie_store, successor_store = stores
    name = f"fence-{uuid.uuid4().hex}"
    provider = MemoryProvider(f"memory://{name}")
    try:
        # First life, without leases: 0..9 archived, then a commit whose commit log landed and whose
        # consume queue did not (the common orphan: bytes no unit references).
        plan = CrashPlan(crash_on=FileType.CONSUME_QUEUE)
        first = FlatFileStore(CrashingProvider(provider, plan), zombie_store, cluster="c", broker="b")
        queue = await first.get_or_create(TOPIC, 0)
        hot = await append_range(queue, 0, 10)
        await queue.commit()
        hot |= await append_range(queue, 10, 20)
        plan.armed = True
        with pytest.raises(SimulatedCrash):
            await queue.commit()

        # The zombie restarts under a lease, loads the queue's files and finds the orphan bytes ...
        zombie = LeaseManager(zombie_store, owner="zombie", lease_duration=1.5, renew_interval=0.5)
        zombie.round()
        stalled = FlatFileStore(provider, zombie_store, cluster="c", broker="b")._new_file(
            zombie_store.get_queue(TOPIC, 0), zombie.hold(QUEUE)
        )
        await stalled.commit_log.recover()
        await stalled.consume_queue.recover()
        referenced_end = sum(len(hot[offset]) for offset in range(10))
        assert stalled.commit_log.commit_offset > referenced_end
        # ... its lease check passes, and it stalls past its lease before cutting them.
        zombie_store.leases.check_lease = lambda queue, epoch, hold_ms=None: None  # type: ignore[method-assign]
        await asyncio.sleep(1.7)

        successor = LeaseManager(successor_store, owner="successor", lease_duration=30, renew_interval=10)
        assert successor.round().acquired == [QUEUE]
        archive = FlatFileStore(provider, successor_store, cluster="c", broker="b")
        await archive.recover(leases=successor.hold)
        queue = archive.get(TOPIC, 0)
        assert queue.archived_offset == 20  # the commit cut short is finished: its records get their units
        hot |= await append_range(queue, 20, 30)
        assert await queue.commit() == 30

        # The zombie wakes up and makes its cut; its epoch is stale, so its metadata change is refused.
        refused = False
        try:
            await stalled._cut(stalled.commit_log, referenced_end)
        except LeaseLostError:
            refused = True

        reloaded = FlatFileStore(provider, successor_store, cluster="c", broker="b")
        await reloaded.recover(leases=successor.hold)
        assert reloaded.get(TOPIC, 0).archived_offset == 30
        assert await check_queue_invariant(reloaded.get(TOPIC, 0), reference=hot) == []
        assert refused
    finally:
        MemoryProvider.wipe(name)


async def test_a_zombie_queue_opened_under_its_lease_cannot_record_a_commit_or_start_a_segment(
    stores: list[MetadataStore],
) -> None:
    """The queue an archiver opened under its lease names that lease's epoch in each metadata change:
    once a successor took the queue over, the zombie's commit records nothing, and its roll adds no row."""
    zombie_store, successor_store = stores
    provider = MemoryProvider()
    zombie = LeaseManager(zombie_store, owner="zombie", lease_duration=1.5, renew_interval=0.5)
    zombie.round()
    flat = FlatFileStore(provider, zombie_store, cluster="c", broker="b")
    queue = await flat.get_or_create(TOPIC, 0, lease=zombie.hold(QUEUE))
    await append_range(queue, 0, 5)
    assert await queue.commit() == 5  # while it holds the lease
    recorded = successor_store.get_queue(TOPIC, 0)
    replace_after_stall(successor_store)
    await append_range(queue, 5, 10)
    with pytest.raises(LeaseLostError, match="epoch 2"):
        await queue.commit()
    with pytest.raises(LeaseLostError, match="epoch 2"):
        await queue.commit_log.roll(BASE_TIMESTAMP + 10)
    now = successor_store.get_queue(TOPIC, 0)
    assert (now.max_offset, now.version) == (recorded.max_offset, recorded.version)
    assert (now.owner, now.epoch) == ("successor", 2)
    assert [r.base_offset for r in successor_store.list_segments(queue.path, FileType.COMMIT_LOG)] == [0]
