"""A queue's durable end: the messages a machine crash cannot take back, which is all the archiver may take."""

from __future__ import annotations

from pathlib import Path

from tieredstore.local import HotStoreFollower, LocalMessageStore

from .conftest import small_config


def test_under_async_flush_messages_become_durable_when_flushed(tmp_path: Path) -> None:
    with LocalMessageStore(tmp_path, config=small_config()) as store:  # flushes only when told to
        for n in range(24):  # per queue more than a consume-queue file of units, across commit-log files
            store.put_message("Orders", n % 2, b"x" * 3000)
        assert [store.durable_max_offset("Orders", q) for q in (0, 1)] == [0, 0]
        store.flush()
        assert [store.durable_max_offset("Orders", q) for q in (0, 1)] == [12, 12]
        store.put_message("Orders", 0, b"late")
        assert store.durable_max_offset("Orders", 0) == 12
        assert store.max_offset("Orders", 0) == 13
        # The archiver of a store it writes flushes the queue it takes from instead of waiting.
        assert store.flush_queue("Orders", 0) == 13
        assert store.durable_max_offset("Orders", 0) == 13
        assert store.durable_max_offset("Orders", 5) == 0  # a queue never written


def test_under_sync_flush_every_acknowledged_message_is_durable_at_once(tmp_path: Path) -> None:
    with LocalMessageStore(tmp_path, config=small_config(flush_mode="sync")) as store:
        for n in range(25):
            store.put_message("Orders", 0, b"y" * (100 + n))
            assert store.durable_max_offset("Orders", 0) == n + 1


def test_a_follower_knows_what_the_writers_checkpoint_covers(tmp_path: Path) -> None:
    with (
        LocalMessageStore(tmp_path, config=small_config()) as writer,
        HotStoreFollower(tmp_path, config=small_config(), refresh_interval=0.0) as follower,
    ):
        for _ in range(8):
            writer.put_message("Orders", 0, b"z" * 500)
        assert follower.max_offset("Orders", 0) == 8, "the follower sees what is written"
        assert follower.durable_max_offset("Orders", 0) == 0, "no checkpoint yet"
        writer.flush()
        assert follower.durable_max_offset("Orders", 0) == 8
        assert follower.commitlog_flushed_offset == writer.commitlog_flushed_offset
        writer.put_message("Orders", 0, b"late")
        writer.flush_queue("Orders", 0)  # the commit log is synced, the checkpoint waits for the periodic flush
        assert follower.max_offset("Orders", 0) == 9
        assert follower.flush_queue("Orders", 0) == 8, "a follower cannot flush: it reads the checkpoint"
        writer.flush()
        assert follower.durable_max_offset("Orders", 0) == 9
