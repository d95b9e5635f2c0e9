"""A follower rebuilds the units of queues that have no consume-queue files from the commit log, in memory:
the writer's own units, only for flushed records, incrementally, past retention, and never for queues that
have files."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from tieredstore.errors import NotFoundError
from tieredstore.formats.consume_queue import ConsumeQueueUnit
from tieredstore.formats.message import SYSFLAG_TRANSACTION_PREPARED, SYSFLAG_TRANSACTION_ROLLBACK, MessageRecord
from tieredstore.local import HotStoreFollower, LocalMessageStore, PutRequest
from tieredstore.local.checkpoint import CLOCK_STEP_MARGIN_MS

from .conftest import FIXTURES, small_config, store_at_times, write_rocketmq_checkpoint

HOUR_MS = 3_600_000
QUEUES = (("Orders", 0), ("Orders", 1), ("Payments", 0))


def body(key: tuple[str, int], n: int) -> bytes:
    return f"{key[0]}:{key[1]}:{n}|".encode() * (1 + n % 40)


def write(store: LocalMessageStore, count: int, first: int = 0) -> None:
    store.put_messages(
        PutRequest(*key, body(key, n), keys=(f"k{n}",), tags=f"tag{n % 4}" if n % 5 else None)
        for n in range(first, first + count)
        for key in QUEUES
    )


def units_of(store: LocalMessageStore, key: tuple[str, int]) -> list[ConsumeQueueUnit]:
    return [store.cq_unit(*key, offset) for offset in range(store.min_offset(*key), store.max_offset(*key))]


def test_units_rebuilt_from_a_commit_log_are_the_writers_own(tmp_path: Path) -> None:
    with LocalMessageStore(tmp_path, config=small_config()) as writer:
        write(writer, 120)
        expected = {key: units_of(writer, key) for key in QUEUES}
    shutil.rmtree(tmp_path / "consumequeue")
    assert len(list((tmp_path / "commitlog").iterdir())) >= 3
    with capture_logs() as logs, HotStoreFollower(tmp_path) as follower:
        assert follower.queues() == sorted(QUEUES)
        for key in QUEUES:
            assert units_of(follower, key) == expected[key]
            assert follower.durable_max_offset(*key) == 120
            assert len(follower.read_batch(*key, 0, 1000, 1 << 30)) == 120
            assert [follower.get_message(*key, n).body for n in range(120)] == [body(key, n) for n in range(120)]
    rebuilt = {
        (e["topic"], e["queue_id"]) for e in logs if e["event"] == "rebuilding a queue's units from the commit log"
    }
    assert rebuilt == set(QUEUES)


def test_only_flushed_records_are_rebuilt_and_the_scan_goes_on_from_where_it_stopped(tmp_path: Path) -> None:
    stored = 1_786_727_751_000
    # A broker's appends, one a second: 40 messages, every third to queue 1.
    store_at_times(tmp_path, "Orders", [(int(n % 3 == 2), stored + n * 1000) for n in range(40)])
    shutil.rmtree(tmp_path / "consumequeue")
    (tmp_path / "checkpoint").unlink()  # the broker has not written its checkpoint yet
    follower = HotStoreFollower(tmp_path, refresh_interval=0)
    with follower:
        assert follower.queues() == [], "no checkpoint: nothing is known to be flushed"
        for flushed_until, expected in ((4, (4, 1)), (20, (14, 7)), (39, (27, 13))):
            write_rocketmq_checkpoint(tmp_path, physic_timestamp=stored + flushed_until * 1000 + CLOCK_STEP_MARGIN_MS)
            assert (follower.max_offset("Orders", 0), follower.max_offset("Orders", 1)) == expected
            assert follower.durable_max_offset("Orders", 0) == expected[0]
        assert [follower.get_message("Orders", 1, n).body for n in range(13)] == [f"1:{n}".encode() for n in range(13)]


def test_queues_with_consume_queue_files_keep_them(tmp_path: Path) -> None:
    config = small_config(consume_queue_units_per_file=1000)  # one file per queue: the writer never rolls
    with LocalMessageStore(tmp_path, config=config) as writer:
        write(writer, 10)
        writer.flush()
        shutil.rmtree(tmp_path / "consumequeue" / "Payments")  # the writer goes on writing the unlinked file
        with HotStoreFollower(tmp_path, config=config, refresh_interval=0) as follower:
            assert follower.queues() == sorted(QUEUES)
            # As RocketMQ's recovery does, the first scan starts where the other queues' units end: Orders/1's
            # record 9, after which Payments' record 9 was written; its earlier records are not dispatched.
            assert follower.min_offset("Payments", 0) == 9
            write(writer, 5, first=10)
            # A queue followed from its files sees a record once it is written; a rebuilt one once it is flushed.
            assert follower.max_offset("Orders", 0) == follower.max_offset("Orders", 1) == 15
            assert follower.max_offset("Payments", 0) == 10
            writer.flush()
            assert follower.max_offset("Payments", 0) == 15
            assert [follower.get_message("Payments", 0, n).body for n in range(9, 15)] == [
                body(("Payments", 0), n) for n in range(9, 15)
            ]


def test_a_followed_broker_is_not_scanned_below_where_its_consume_queues_end(tmp_path: Path) -> None:
    """A follower's start reads the commit log from where the consume queues end, not its whole length: a
    record before that point which does not even look like one (its magic code damaged) holds nothing up."""
    config = small_config(consume_queue_units_per_file=1000)
    with LocalMessageStore(tmp_path, config=config) as writer:
        write(writer, 10)
    shutil.rmtree(tmp_path / "consumequeue" / "Payments")
    log = tmp_path / "commitlog" / f"{0:020d}"
    content = bytearray(log.read_bytes())
    content[4] ^= 0xFF  # the magic code of the first record, Orders/0's offset 0, which its files cover
    log.write_bytes(bytes(content))
    with HotStoreFollower(tmp_path, config=config, refresh_interval=0) as follower:
        assert follower.max_offset("Orders", 1) == 10
        # Only Payments' record past the consume queues' end is rebuilt; the damaged record is never read.
        assert (follower.min_offset("Payments", 0), follower.max_offset("Payments", 0)) == (9, 10)
        assert follower.get_message("Payments", 0, 9).body == body(("Payments", 0), 9)


def test_rebuilt_queues_follow_the_writers_retention(tmp_path: Path) -> None:
    config = small_config(hot_retention_hours=1, consume_queue_units_per_file=1000)
    with LocalMessageStore(tmp_path, config=config) as writer:
        for _ in range(100):
            writer.put_message("a", 0, b"p" * 3000, tags="x")
        writer.flush()
        shutil.rmtree(tmp_path / "consumequeue")  # the writer keeps its own (unlinked) files
        with HotStoreFollower(tmp_path, config=config, refresh_interval=0) as follower:
            assert (follower.min_offset("a", 0), follower.max_offset("a", 0)) == (0, 100)
            writer.delete_expired(lambda topic, queue_id: 100, now_ms=int(time.time() * 1000) + 2 * HOUR_MS)
            new_min = writer.min_offset("a", 0)
            assert new_min > 5
            assert (follower.min_offset("a", 0), follower.max_offset("a", 0)) == (new_min, 100)
            with pytest.raises(NotFoundError):
                follower.read_messages("a", 0, 0)
            writer.put_message("a", 0, b"after retention")
            writer.flush()
            assert follower.get_message("a", 0, 100).body == b"after retention"
        # A follower that starts after retention starts its queue at the first record left.
        with HotStoreFollower(tmp_path, config=config) as late:
            assert (late.min_offset("a", 0), late.max_offset("a", 0)) == (new_min, 101)


def test_a_record_that_does_not_check_out_stops_the_rebuild_there(tmp_path: Path) -> None:
    with LocalMessageStore(tmp_path, config=small_config()) as writer:
        puts = [writer.put_message("a", 0, f"message {n}".encode() * 20) for n in range(20)]
    shutil.rmtree(tmp_path / "consumequeue")
    log = tmp_path / "commitlog" / f"{0:020d}"
    content = bytearray(log.read_bytes())
    content[puts[12].commitlog_offset + puts[12].size - 30] ^= 0x01  # inside record 12's body: its CRC fails
    log.write_bytes(bytes(content))
    with capture_logs() as logs, HotStoreFollower(tmp_path) as follower:
        assert follower.max_offset("a", 0) == 12
        assert [follower.get_message("a", 0, n).body for n in range(12)] == [
            f"message {n}".encode() * 20 for n in range(12)
        ]
    (stalled,) = [e for e in logs if e["event"].startswith("a commit-log record does not check out")]
    assert stalled["commitlog_offset"] == puts[12].commitlog_offset


def test_prepared_and_rolled_back_transaction_messages_are_not_dispatched(tmp_path: Path) -> None:
    stored = 1_786_727_751_000
    records = [
        MessageRecord("Tx", 0, b"plain", queue_offset=0, store_timestamp=stored),
        MessageRecord("Tx", 0, b"prepared", sysflag=SYSFLAG_TRANSACTION_PREPARED, store_timestamp=stored),
        MessageRecord("Tx", 0, b"committed", queue_offset=1, sysflag=0x8, store_timestamp=stored),
        MessageRecord("Tx", 0, b"rolled back", sysflag=SYSFLAG_TRANSACTION_ROLLBACK, store_timestamp=stored),
        MessageRecord("Tx", 0, b"after", queue_offset=2, store_timestamp=stored),
    ]
    data = bytearray()
    for record in records:
        data += record.with_physical_offset(len(data)).encode()
    (tmp_path / "commitlog").mkdir()
    (tmp_path / "commitlog" / f"{0:020d}").write_bytes(bytes(data) + bytes(4096 - len(data)))
    write_rocketmq_checkpoint(tmp_path, physic_timestamp=stored + CLOCK_STEP_MARGIN_MS)
    with HotStoreFollower(tmp_path) as follower:
        assert follower.max_offset("Tx", 0) == 3
        assert [follower.get_message("Tx", 0, n).body for n in range(3)] == [b"plain", b"committed", b"after"]


def test_the_java_fixture_rebuilds_as_the_read_only_store_does_and_is_left_as_it_was(tmp_path: Path) -> None:
    java = Path(shutil.copytree(Path(FIXTURES) / "java-4x-consumequeuetest", tmp_path / "java"))
    with LocalMessageStore(java, read_only=True) as reader:
        expected = units_of(reader, ("abc", 0))
        last_stamp = reader.store_timestamp("abc", 0, 46)
    before = sorted(path.name for path in java.rglob("*"))
    with HotStoreFollower(java, refresh_interval=0) as follower:
        assert follower.queues() == [], "the fixture has no checkpoint: nothing is known to be flushed"
        write_rocketmq_checkpoint(java, physic_timestamp=last_stamp + CLOCK_STEP_MARGIN_MS)
        assert follower.queues() == [("abc", 0)]
        assert units_of(follower, ("abc", 0)) == expected
        assert expected[5] == ConsumeQueueUnit(860, 172, 2567159)
        assert follower.get_message("abc", 0, 0).body == b"Once, there was a chance for me!"
    (java / "checkpoint").unlink()
    assert sorted(path.name for path in java.rglob("*")) == before
