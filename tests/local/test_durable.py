"""A queue's durable end: the messages a machine crash cannot take back, which is all the archiver may take."""

from __future__ import annotations

import shutil
from pathlib import Path

from structlog.testing import capture_logs

from tieredstore.local import HotStoreFollower, LocalMessageStore
from tieredstore.local.checkpoint import CLOCK_STEP_MARGIN_MS

from .conftest import FIXTURES, small_config, store_at_times, write_rocketmq_checkpoint

T0 = 1_786_727_751_000
# A broker's appends, one a second, alternating between queue 0 and queue 1.
BROKER_APPENDS = [(n % 2, T0 + n * 1000) for n in range(12)]


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


def durable_ends(follower: HotStoreFollower, topic: str = "Orders") -> list[int]:
    return [follower.durable_max_offset(topic, queue_id) for queue_id in (0, 1)]


def test_a_follower_of_a_rocketmq_broker_takes_what_the_brokers_flush_time_covers(tmp_path: Path) -> None:
    store_at_times(tmp_path, "Orders", BROKER_APPENDS)
    (tmp_path / "checkpoint").unlink()  # a broker that never flushed
    with capture_logs() as logs, HotStoreFollower(tmp_path, config=small_config(), refresh_interval=0.0) as follower:
        assert follower.max_offset("Orders", 0) == 6, "the follower sees every record"
        assert durable_ends(follower) == [0, 0]
        assert durable_ends(follower) == [0, 0]
        said = [entry for entry in logs if "nothing is flushed yet" in entry["event"]]
        assert len(said) == 1, "the reason nothing is archived is said once, not at every look"
        assert said[0]["log_level"] == "info" and said[0]["source"] == "missing"

        # The broker's last thorough flush covered the record stored at T0 + 5 s: records 0..5. Those
        # stored within the clock margin before it wait, as RocketMQ's own recovery does not trust them.
        write_rocketmq_checkpoint(tmp_path, physic_timestamp=T0 + 5000 + CLOCK_STEP_MARGIN_MS)
        assert durable_ends(follower) == [3, 3]
        assert durable_ends(follower) == [3, 3]
        assert [entry["event"] for entry in logs].count(
            "following a RocketMQ broker's checkpoint: archiving records stored before its flush time"
        ) == 1

        write_rocketmq_checkpoint(tmp_path, physic_timestamp=T0 + 11_000 + CLOCK_STEP_MARGIN_MS)
        assert durable_ends(follower) == [6, 6]


def test_a_rocketmq_confirm_offset_is_a_floor_the_flush_time_moves_past(tmp_path: Path) -> None:
    ends = store_at_times(tmp_path, "Orders", BROKER_APPENDS)
    # A broker writes confirmPhyOffset at its start (the end its recovery found); records 0..7 lie below.
    write_rocketmq_checkpoint(tmp_path, confirm_phy_offset=ends[7])
    with HotStoreFollower(tmp_path, config=small_config(), refresh_interval=0.0) as follower:
        assert durable_ends(follower) == [4, 4]
        assert follower.commitlog_flushed_offset == ends[7]
        # Outside controller mode the broker never moves it again while running; its flush time moves.
        write_rocketmq_checkpoint(
            tmp_path, physic_timestamp=T0 + 11_000 + CLOCK_STEP_MARGIN_MS, confirm_phy_offset=ends[7]
        )
        assert durable_ends(follower) == [6, 6]


def test_a_follower_of_a_store_another_rocketmq_implementation_wrote(tmp_path: Path) -> None:
    store_dir = tmp_path / "broker"
    shutil.copytree(FIXTURES / "rust-0.9.0-writer", store_dir)
    first_stored, second_stored = 1786727751703, 1786727751704  # the fixture's two records (README.md)
    with HotStoreFollower(store_dir, config=small_config(), refresh_interval=0.0) as follower:
        assert follower.max_offset("V1UpgradeTopic", 0) == 2
        assert follower.durable_max_offset("V1UpgradeTopic", 0) == 0, "its checkpoint has no physic timestamp"
        write_rocketmq_checkpoint(store_dir, physic_timestamp=first_stored + CLOCK_STEP_MARGIN_MS)
        assert follower.durable_max_offset("V1UpgradeTopic", 0) == 1
        write_rocketmq_checkpoint(store_dir, physic_timestamp=second_stored + CLOCK_STEP_MARGIN_MS)
        assert follower.durable_max_offset("V1UpgradeTopic", 0) == 2
