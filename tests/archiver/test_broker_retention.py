"""A broker deletes its old commit-log and consume-queue files underneath the archiver that follows it.

RocketMQ's retention removes the oldest commit-log files whatever was archived, then every consume-queue
file but the last whose units all point below the commit log's new min offset. Offsets that vanished
before they were archived are recorded as lost (a hole in the cold consume queue, counted in the
metric), and archiving goes on from the first offset still on disk.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from tests.archiver.test_durable import Node, hot_config, migrated_url  # noqa: F401 (a fixture)
from tests.fixtures.backends import ProviderBackend
from tieredstore.dispatcher import Dispatcher
from tieredstore.flat import check_queue_invariant
from tieredstore.formats.consume_queue import UNIT_SIZE
from tieredstore.formats.message import decode
from tieredstore.local import HotStoreFollower, LocalMessageStore
from tieredstore.local.queue import list_offset_files

TOPIC = "Orders"
QUEUES = (0, 1)
_UNIT_OFFSET = struct.Struct(">q")


def body(generation: str, queue_id: int, n: int) -> bytes:
    return f"{generation}:{queue_id}:{n}|".encode() * 200


def produce(writer: LocalMessageStore, generation: str, count: int) -> None:
    for n in range(count):
        for queue_id in QUEUES:
            writer.put_message(TOPIC, queue_id, body(generation, queue_id, n), keys=[f"{generation}-{n}"])
    writer.flush()  # a broker's flush: the follower archives only what is flushed


def broker_retention(store: Path, keep_commit_log_files: int) -> int:
    """What RocketMQ's retention does, whatever was archived: delete all but the newest commit-log files,
    then each consume-queue file but the last whose last unit lies below the new min offset. Returns it."""
    commit_log = list_offset_files(store / "commitlog")
    for _start, path in commit_log[:-keep_commit_log_files]:
        path.unlink()
    min_offset = commit_log[-keep_commit_log_files][0]
    for queue_dir in (store / "consumequeue" / TOPIC).iterdir():
        for _start, path in list_offset_files(queue_dir)[:-1]:
            data = path.read_bytes()
            last = max(p for p in range(0, len(data), UNIT_SIZE) if any(data[p : p + UNIT_SIZE]))
            if _UNIT_OFFSET.unpack_from(data, last)[0] < min_offset:
                path.unlink()
    return min_offset


async def archived_bodies(node: Node, queue_id: int) -> dict[int, bytes]:
    flat_file = node.parts.flat.get(TOPIC, queue_id)
    bodies: dict[int, bytes] = {}
    offset = flat_file.min_offset
    for start, end in [*flat_file.lost_ranges, (flat_file.archived_offset, flat_file.archived_offset)]:
        for n, raw in enumerate(await flat_file.read_messages(offset, start - offset)):
            bodies[offset + n] = decode(raw).body
        offset = end
    return bodies


@pytest.mark.parametrize("provider_factory", ["posix", "s3"], indirect=True)
async def test_offsets_the_broker_deleted_before_they_were_archived_are_recorded_lost_and_archiving_goes_on(
    tmp_path: Path,
    provider_factory: ProviderBackend,
    migrated_url: str,  # noqa: F811
) -> None:
    store = tmp_path / "broker"
    with LocalMessageStore(store, config=hot_config()) as writer:
        follower = HotStoreFollower(store, config=hot_config(), refresh_interval=0.0)
        node = Node(tmp_path, follower, migrated_url, provider_factory)
        dispatcher: Dispatcher = await node.start()
        try:
            produce(writer, "archived", 10)
            assert await dispatcher.scan() == 10 * len(QUEUES)
            reference = {q: {m.queue_offset: m.raw for m in follower.read_messages(TOPIC, q, 0, 10)} for q in QUEUES}
            # The archiver falls behind (stopped, or its storage is down) while the broker goes on and its
            # retention deletes files that hold offsets the archive does not have yet.
            produce(writer, "deleted", 60)
            commitlog_min = broker_retention(store, keep_commit_log_files=2)
            # The follower's first look after the deletion knows the offsets are gone, though it had checked
            # none of the units in the deleted files.
            assert all(follower.min_offset(TOPIC, q) > 10 for q in QUEUES)
            produce(writer, "kept", 20)
            await dispatcher.run_once()

            for queue_id in QUEUES:
                hot_min = follower.min_offset(TOPIC, queue_id)
                assert 10 < hot_min < 70, "the deletion took unarchived offsets, not all of them"
                flat_file = node.parts.flat.get(TOPIC, queue_id)
                assert flat_file.lost_ranges == [(10, hot_min)]
                assert flat_file.archived_offset == 90
                cold = await archived_bodies(node, queue_id)
                expected = {n: body("archived", queue_id, n) for n in range(10)}
                expected.update({n: body("deleted", queue_id, n - 10) for n in range(hot_min, 70)})
                expected.update({n: body("kept", queue_id, n - 70) for n in range(70, 90)})
                assert cold == expected, "every offset still on disk archived once, at its queue offset"
                for m in follower.read_messages(TOPIC, queue_id, hot_min, 1000, 1 << 30):
                    reference[queue_id][m.queue_offset] = m.raw
                problems = await check_queue_invariant(flat_file, reference=reference[queue_id])
                assert [str(p) for p in problems] == []
            lost = sum(follower.min_offset(TOPIC, q) - 10 for q in QUEUES)
            assert dispatcher.stats.lost_messages == lost
            registry = node.parts.metrics.registry
            assert registry.get_sample_value("tieredstore_lost_messages_total", {"topic": TOPIC}) == lost
            assert follower.commitlog_min_offset == commitlog_min

            # And it goes on: the next messages are archived as usual, nothing counted lost again.
            produce(writer, "later", 5)
            await dispatcher.run_once()
            assert {s.archived_offset for s in dispatcher.status()} == {95}
            assert dispatcher.stats.lost_messages == lost
        finally:
            follower.close()
            await node.stop()
