"""Nothing is archived before the hot store has flushed it, so a power loss cannot take back an archived message.

Had the archiver taken messages a power loss then removed from the hot store, producers would write
new messages at those offsets after the restart, and the archive, already past them, would never
take the new ones. The hot store here flushes only when told to (async flush with an interval of an
hour), so what is flushed at each step is exactly what the test says.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from tests.archiver.helpers import Archive
from tests.fixtures.backends import ProviderBackend
from tests.local.conftest import abandon, small_config, store_at_times, write_rocketmq_checkpoint
from tieredstore.dispatcher import Dispatcher
from tieredstore.flat import FlatFileStore, check_queue_invariant
from tieredstore.formats.consume_queue import UNIT_SIZE
from tieredstore.formats.message import decode
from tieredstore.local import HotStoreFollower, LocalMessageStore, LocalStoreConfig
from tieredstore.local.checkpoint import CLOCK_STEP_MARGIN_MS, Checkpoint
from tieredstore.metadata import MetadataStore, upgrade

TOPIC = "Orders"
QUEUES = (0, 1)
_UNIT_OFFSET = struct.Struct(">q")


def hot_config() -> LocalStoreConfig:
    return LocalStoreConfig(
        commit_log_file_size=64 << 10,
        max_message_size=16 << 10,
        consume_queue_units_per_file=16,
        flush_mode="async",
        flush_interval=3600.0,
    )


def body(generation: str, queue_id: int, n: int) -> bytes:
    return f"{generation}:{queue_id}:{n}|".encode() * (1 + n % 30)


def produce(store: LocalMessageStore, generation: str, count: int) -> dict[int, list[bytes]]:
    """``count`` messages into each queue; the bodies put, by queue."""
    put: dict[int, list[bytes]] = {}
    for n in range(count):
        for queue_id in QUEUES:
            store.put_message(TOPIC, queue_id, body(generation, queue_id, n), keys=[f"{generation}-{n}"])
            put.setdefault(queue_id, []).append(body(generation, queue_id, n))
    return put


def lose_power(store_dir: Path, commitlog_flushed: int) -> None:
    """Do to the hot files what a power loss does to pages never flushed: they read as zeros again.

    The commit log is flushed up to ``commitlog_flushed``; a consume queue only up to the checkpoint
    (the periodic flush writes its units before the checkpoint, a commit-log sync does not).
    """
    checkpoint = Checkpoint.read(store_dir / "checkpoint")
    confirmed = checkpoint.confirmed_offset if checkpoint is not None else 0
    for path in (store_dir / "commitlog").iterdir():
        start, size = int(path.name), path.stat().st_size
        cut = max(0, commitlog_flushed - start)
        if cut < size:
            with path.open("r+b") as file:
                file.seek(cut)
                file.write(bytes(size - cut))
    for path in (store_dir / "consumequeue").glob("*/*/*"):
        data = bytearray(path.read_bytes())
        for position in range(0, len(data) - UNIT_SIZE + 1, UNIT_SIZE):
            if _UNIT_OFFSET.unpack_from(data, position)[0] >= confirmed:
                data[position : position + UNIT_SIZE] = bytes(UNIT_SIZE)
        path.write_bytes(bytes(data))


class Node:
    """One life of the archiver process: its view of the hot store, metadata, cold provider, dispatcher."""

    def __init__(self, root: Path, hot: LocalMessageStore, metadata_url: str, backend: ProviderBackend) -> None:
        self.parts = Archive(root, hot, MetadataStore.open(metadata_url), backend())

    async def start(self) -> Dispatcher:
        await self.parts.open()
        dispatcher = self.parts.dispatcher(group_commit_timeout=0)
        await dispatcher.start()
        return dispatcher

    async def stop(self) -> None:
        """The cold side's connections closed; the hot store is the caller's (a writer may be abandoned)."""
        await self.parts.index.close()
        await self.parts.provider.close()
        self.parts.metadata.close()


def archiver_view(writer_dir: Path, writer: LocalMessageStore, mode: str) -> LocalMessageStore:
    """The hot store as the archiver sees it: the writer itself (one process) or a follower of it."""
    return writer if mode == "writer" else HotStoreFollower(writer_dir, config=hot_config(), refresh_interval=0.0)


async def cold_bodies(backend: ProviderBackend, metadata_url: str, queue_id: int) -> list[bytes]:
    """Every archived message of the queue, read back from cold storage by a fresh reader."""
    with MetadataStore.open(metadata_url) as metadata:
        provider = backend()
        flat = FlatFileStore(provider, metadata, cluster="TestCluster", broker="broker-a")
        await flat.recover()
        queue = flat.get(TOPIC, queue_id)
        records = await queue.read_messages(0, queue.archived_offset + 1)
        await provider.close()
    return [decode(raw).body for raw in records]


@pytest.fixture
def migrated_url(metadata_url: str) -> str:
    upgrade(metadata_url)
    return metadata_url


@pytest.mark.parametrize("provider_factory", ["posix", "s3"], indirect=True)
@pytest.mark.parametrize("mode", ["writer", "follower"])
async def test_after_a_power_loss_every_flushed_message_is_archived_once_and_later_ones_are_not_lost(
    tmp_path: Path, provider_factory: ProviderBackend, migrated_url: str, mode: str
) -> None:
    hot_dir = tmp_path / "hot"
    writer = LocalMessageStore(hot_dir, config=hot_config())
    flushed = produce(writer, "before", 30)
    writer.flush()
    produce(writer, "unflushed", 20)  # acknowledged under async flush, never flushed: a power loss may take them
    node = Node(tmp_path, archiver_view(hot_dir, writer, mode), migrated_url, provider_factory)
    dispatcher = await node.start()
    await dispatcher.scan()
    produce(writer, "lost", 5)  # put after the archiver's pass, not flushed either

    # The power goes: the archiver dies with the machine, the hot store keeps only what reached the disk.
    flushed_position = writer.commitlog_flushed_offset
    if mode == "follower":
        node.parts.hot.close()
    await node.stop()
    abandon(writer)
    lose_power(hot_dir, flushed_position)

    writer = LocalMessageStore(hot_dir, config=hot_config())
    try:
        assert not writer.recovery.clean
        survivors = {q: writer.max_offset(TOPIC, q) for q in QUEUES}
        assert all(survivors[q] >= len(flushed[q]) for q in QUEUES), "every flushed message survived"
        node = Node(tmp_path, archiver_view(hot_dir, writer, mode), migrated_url, provider_factory)
        dispatcher = await node.start()
        after = produce(writer, "after", 25)
        writer.flush()  # acknowledged and flushed
        await dispatcher.run_once()
        for queue_id in QUEUES:
            reference = {m.queue_offset: m.raw for m in writer.read_messages(TOPIC, queue_id, 0, 1000, 1 << 30)}
            flat_file = node.parts.flat.get(TOPIC, queue_id)
            assert [str(p) for p in await check_queue_invariant(flat_file, reference=reference)] == []
        if mode == "follower":
            node.parts.hot.close()
        await node.stop()
        for queue_id in QUEUES:
            survived = [writer.get_message(TOPIC, queue_id, o).body for o in range(survivors[queue_id])]
            assert survived[: len(flushed[queue_id])] == flushed[queue_id]
            # Read back from cold storage: what survived the power loss, then everything put after it,
            # each once, at its hot queue offset.
            assert await cold_bodies(provider_factory, migrated_url, queue_id) == survived + after[queue_id]
    finally:
        writer.close()


@pytest.mark.parametrize("provider_factory", ["posix", "s3"], indirect=True)
async def test_a_follower_archives_only_what_the_writers_checkpoint_covers(
    tmp_path: Path, provider_factory: ProviderBackend, sqlite_url: str
) -> None:
    upgrade(sqlite_url)
    hot_dir = tmp_path / "hot"
    with LocalMessageStore(hot_dir, config=hot_config()) as writer:
        node = Node(tmp_path, archiver_view(hot_dir, writer, "follower"), sqlite_url, provider_factory)
        dispatcher = await node.start()
        try:
            produce(writer, "first", 10)
            assert await dispatcher.scan() == 0, "no checkpoint yet: nothing is known to be flushed"
            writer.flush()
            assert await dispatcher.scan() == 10 * len(QUEUES)
            produce(writer, "second", 7)
            assert await dispatcher.scan() == 0, "written but not flushed: not archived"
            # Lag still counts what is written: the follower sees the messages, the archive waits for them.
            assert {(s.queue_id, s.archived_offset, s.lag) for s in dispatcher.status()} == {(0, 10, 7), (1, 10, 7)}
            writer.flush()
            assert await dispatcher.scan() == 7 * len(QUEUES)
            assert [s.lag for s in dispatcher.status()] == [0, 0]
        finally:
            node.parts.hot.close()
            await node.stop()
        for queue_id in QUEUES:
            expected = [body(g, queue_id, n) for g, count in (("first", 10), ("second", 7)) for n in range(count)]
            assert await cold_bodies(provider_factory, sqlite_url, queue_id) == expected


@pytest.mark.parametrize("provider_factory", ["posix", "s3"], indirect=True)
async def test_an_archiver_following_a_rocketmq_broker_takes_what_the_brokers_checkpoint_covers(
    tmp_path: Path, provider_factory: ProviderBackend, migrated_url: str
) -> None:
    hot_dir = tmp_path / "hot"
    started = 1_786_727_751_000
    # A broker's appends, one a second, alternating between the queues: 10 messages each.
    ends = store_at_times(hot_dir, TOPIC, [(n % 2, started + n * 1000) for n in range(20)])
    # The broker last started when records 0..3 were on disk (its confirmPhyOffset) and has not flushed since.
    write_rocketmq_checkpoint(hot_dir, confirm_phy_offset=ends[3])
    follower = HotStoreFollower(hot_dir, config=small_config(), refresh_interval=0.0)
    node = Node(tmp_path, follower, migrated_url, provider_factory)
    dispatcher = await node.start()
    try:
        assert await dispatcher.scan() == 4
        # Its flush time moves (records 0..13 flushed); its confirmPhyOffset stays where its start put it.
        write_rocketmq_checkpoint(
            hot_dir, physic_timestamp=started + 13_000 + CLOCK_STEP_MARGIN_MS, confirm_phy_offset=ends[3]
        )
        assert await dispatcher.scan() == 10
        assert {(s.queue_id, s.archived_offset, s.lag) for s in dispatcher.status()} == {(0, 7, 3), (1, 7, 3)}
        write_rocketmq_checkpoint(
            hot_dir, physic_timestamp=started + 19_000 + CLOCK_STEP_MARGIN_MS, confirm_phy_offset=ends[3]
        )
        assert await dispatcher.scan() == 6
        assert [s.lag for s in dispatcher.status()] == [0, 0]
    finally:
        follower.close()
        await node.stop()
    for queue_id in QUEUES:
        assert await cold_bodies(provider_factory, migrated_url, queue_id) == [
            f"{queue_id}:{n}".encode() for n in range(10)
        ]
