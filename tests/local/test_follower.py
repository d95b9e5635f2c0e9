"""HotStoreFollower: a second process's view of a hot store, following its writer without ever writing."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tieredstore.config import TieredStoreConfig
from tieredstore.errors import NotFoundError, ValidationError
from tieredstore.formats.message import decode
from tieredstore.local import HotReader, LocalMessageStore, PutRequest, hot_writer
from tieredstore.local import follower as follower_module
from tieredstore.local.follower import HotStoreFollower
from tieredstore.local.store_lock import writer_lock_held
from tieredstore.runtime import local_store_config, open_runtime
from tieredstore.store import AsyncTieredMessageStore

from .conftest import abandon, mapped_rss, small_config

HOUR_MS = 3_600_000

# A writer process: puts into queues 0..2 of "follow", and from its 300th message on also into a
# new topic, printing "ACK topic queue offset n" after each put returns.
WRITER = """
import sys
import structlog
structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
from tieredstore.local import LocalMessageStore, LocalStoreConfig

config = LocalStoreConfig(commit_log_file_size=64 << 10, max_message_size=16 << 10,
                          consume_queue_units_per_file=50, flush_interval=0.05)
store = LocalMessageStore(sys.argv[1], config=config)
round_, limit = sys.argv[2], int(sys.argv[3])
n = 0
while limit < 0 or n < limit:
    topic = "late" if n >= 300 and n % 4 == 0 else "follow"
    queue_id = n % 3
    body = f"{round_}:{n}|".encode() * (1 + n % 60)
    result = store.put_message(topic, queue_id, body, keys=[f"k{n}"], tags=f"t{n % 3}")
    sys.stdout.write(f"ACK {topic} {queue_id} {result.queue_offset} {n}\\n")
    sys.stdout.flush()
    n += 1
store.close()
"""


def expected_body(round_: int, n: int) -> bytes:
    return f"{round_}:{n}|".encode() * (1 + n % 60)


def start_writer(directory: Path, round_: int, limit: int = -1) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(directory), str(round_), str(limit)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def read_acks(writer: subprocess.Popen[str], count: int) -> dict[tuple[str, int, int], int]:
    """(topic, queue, offset) -> n of the next ``count`` acknowledged puts."""
    assert writer.stdout is not None
    acks: dict[tuple[str, int, int], int] = {}
    while len(acks) < count:
        line = writer.stdout.readline()
        assert line, f"writer exited early with {writer.poll()}"
        _, topic, queue_id, offset, n = line.split()
        acks[(topic, int(queue_id), int(offset))] = int(n)
    return acks


def kill(writer: subprocess.Popen[str]) -> None:
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait()


def served(follower: HotStoreFollower, topic: str, queue_id: int, start: int = 0) -> list[bytes]:
    """Every body the follower serves for the queue from ``start``, each decoded with its CRC checked."""
    bodies: list[bytes] = []
    offset = start
    while batch := follower.read_messages(topic, queue_id, offset, max_count=64):
        for message in batch:
            record = decode(message.raw)
            assert (record.topic, record.queue_id, record.queue_offset) == (topic, queue_id, message.queue_offset)
            assert record.physical_offset == message.unit.commitlog_offset
            bodies.append(record.body)
        offset = batch[-1].queue_offset + 1
    assert offset <= follower.max_offset(topic, queue_id)
    return bodies


def snapshot(directory: Path) -> dict[str, str]:
    return {
        str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


def test_follower_sees_new_messages_new_files_and_new_queues_while_a_writer_process_appends(tmp_path: Path) -> None:
    writer = start_writer(tmp_path, 0)
    try:
        read_acks(writer, 5)
        follower = HotStoreFollower(tmp_path, config=small_config(consume_queue_units_per_file=50))
        with follower:
            assert writer_lock_held(tmp_path), "the writer keeps its lock; the follower never takes it"
            first_seen = follower.max_offset("follow", 0)
            assert first_seen >= 1 and follower.queues() == [("follow", 0), ("follow", 1), ("follow", 2)]
            acks = read_acks(writer, 1500)
            # Give the follower's listing interval a chance to find the new topic's directory.
            deadline = time.monotonic() + 5
            while ("late", 0) not in follower.queues() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert ("late", 0) in follower.queues()
            for (topic, queue_id, offset), n in acks.items():
                assert follower.max_offset(topic, queue_id) > offset  # acknowledged means visible
                assert follower.get_message(topic, queue_id, offset).body == expected_body(0, n)
            assert follower.max_offset("follow", 0) > first_seen
            assert len(os.listdir(tmp_path / "commitlog")) > 3, "the follower crossed commit-log files"
            assert len(os.listdir(tmp_path / "consumequeue" / "follow" / "0")) > 2
    finally:
        kill(writer)


@pytest.mark.reliability
def test_follower_never_serves_a_torn_record_across_writer_kills_and_restarts(tmp_path: Path) -> None:
    config = small_config(consume_queue_units_per_file=50)
    acknowledged: dict[tuple[str, int, int], bytes] = {}
    follower: HotStoreFollower | None = None
    try:
        for round_ in range(3):
            writer = start_writer(tmp_path, round_)
            try:
                for key, n in read_acks(writer, 400).items():
                    acknowledged[key] = expected_body(round_, n)
                if follower is None:
                    follower = HotStoreFollower(tmp_path, config=config, refresh_interval=0.01)
                # Read while the writer is mid-stream, then kill it mid-put.
                for queue_id in range(3):
                    served(follower, "follow", queue_id)
            finally:
                kill(writer)
            assert follower is not None
            for topic, queue_id in follower.queues():
                bodies = served(follower, topic, queue_id)
                for offset, body in enumerate(bodies):
                    if (topic, queue_id, offset) in acknowledged:
                        assert body == acknowledged[(topic, queue_id, offset)]
            for topic, queue_id, offset in acknowledged:
                assert follower.max_offset(topic, queue_id) > offset
        # The last writer recovers the store; whatever the follower served is what the writer kept.
        assert follower is not None
        with LocalMessageStore(tmp_path, config=config) as recovered:
            time.sleep(0.05)
            for topic, queue_id in follower.queues():
                assert follower.max_offset(topic, queue_id) == recovered.max_offset(topic, queue_id)
                for offset, body in enumerate(served(follower, topic, queue_id)):
                    assert recovered.get_message(topic, queue_id, offset).body == body
    finally:
        if follower is not None:
            follower.close()


def written_store(directory: Path, count: int) -> list[tuple[int, int]]:
    """A closed store of ``count`` tagged messages in queue t/0; (commit-log offset, size) of each."""
    with LocalMessageStore(directory, config=small_config()) as store:
        results = store.put_messages(
            PutRequest("t", 0, bytes([n % 250 + 1]) * (100 + n * 37), keys=(f"k{n}",), tags=f"tag{n}")
            for n in range(count)
        )
    return [(r.commitlog_offset, r.size) for r in results]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[tuple[int, int]]]:
    directory = tmp_path_factory.mktemp("pristine")
    return directory, written_store(directory, 12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_record_not_fully_written_ends_the_queue_for_now(
    pristine: tuple[Path, list[tuple[int, int]]], tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    """The unit is in place but its record's bytes are not (zeros from any byte on, or one flipped byte)."""
    source, records = pristine
    directory = Path(shutil.copytree(source, tmp_path_factory.mktemp("torn") / "store"))
    victim = data.draw(st.integers(min_value=len(records) - 4, max_value=len(records) - 1), label="record")
    offset, size = records[victim]
    position = data.draw(st.integers(min_value=0, max_value=size - 1), label="byte")
    flip = data.draw(st.booleans(), label="flip instead of zeros")
    path = directory / "commitlog" / f"{0:020d}"
    content = bytearray(path.read_bytes())
    if flip:
        # Bytes a record vouches for: size, magic, CRC, queue id and offsets, body length, body, topic.
        body_end = 88 + 100 + victim * 37
        checked = [*range(0, 16), *range(20, 36), *range(84, body_end + 4)]
        position = checked[position % len(checked)]
        content[offset + position] ^= 0x5A
    else:
        content[offset + position : offset + size] = bytes(size - position)
    if content == path.read_bytes():
        return  # zeros over the last zero bytes: the record is whole after all
    path.write_bytes(content)
    with HotStoreFollower(directory, config=small_config()) as follower:
        assert follower.max_offset("t", 0) == victim
        assert [m.queue_offset for m in follower.read_messages("t", 0, 0, 100)] == list(range(victim))
        with pytest.raises(NotFoundError):
            follower.cq_unit("t", 0, victim)


def test_a_queue_whose_first_file_holds_no_unit_yet_is_empty_until_its_first_unit_lands(tmp_path: Path) -> None:
    """The writer sizes a consume-queue file before it writes a unit into it (and its recovery zeroes the
    units it rebuilds): a first file of zeros is an empty queue at the file's first slot, never a queue
    whose messages below the file's end are gone (which would make an archiver record them as lost)."""
    config = small_config()
    with LocalMessageStore(tmp_path, config=config) as writer:
        writer.put_message("a", 0, b"first", tags="x")
        # Queue b/0's first file as the writer creates it: sized, every slot still zero.
        sized = tmp_path / "consumequeue" / "b" / "0" / f"{0:020d}"
        sized.parent.mkdir(parents=True)
        sized.write_bytes(bytes(config.consume_queue_file_size))
        with HotStoreFollower(tmp_path, config=config, refresh_interval=0) as follower:
            assert follower.queues() == [("a", 0)]
            assert (follower.min_offset("b", 0), follower.max_offset("b", 0)) == (0, 0)
            assert follower.read_messages("b", 0, 0) == []
            # The writer maps that file and writes the queue's first unit into it.
            assert writer.put_message("b", 0, b"late but whole", tags="y").queue_offset == 0
            assert follower.queues() == [("a", 0), ("b", 0)]
            assert (follower.min_offset("b", 0), follower.max_offset("b", 0)) == (0, 1)
            assert [decode(m.raw).body for m in follower.read_messages("b", 0, 0)] == [b"late but whole"]


def test_follower_follows_retention_and_never_crashes_on_a_vanished_file(tmp_path: Path) -> None:
    config = small_config(hot_retention_hours=1)
    with LocalMessageStore(tmp_path, config=config) as writer:
        for _ in range(100):
            writer.put_message("a", 0, b"p" * 3000, tags="x")
        with HotStoreFollower(tmp_path, config=config, refresh_interval=0) as follower:
            assert (follower.min_offset("a", 0), follower.max_offset("a", 0)) == (0, 100)
            held = follower.read_messages("a", 0, 0, max_count=5)
            in_old_file = follower.cq_unit("a", 0, 3)
            report = writer.delete_expired(lambda topic, queue_id: 100, now_ms=int(time.time() * 1000) + 2 * HOUR_MS)
            assert len(report.commit_log_files) >= 2
            new_min = writer.min_offset("a", 0)
            assert new_min > 5
            assert follower.min_offset("a", 0) == new_min
            assert follower.commitlog_min_offset == writer.commitlog_min_offset > 0
            assert len(held) == 5 and decode(held[0].raw).body == b"p" * 3000  # copies stay valid
            with pytest.raises(NotFoundError):
                follower.read_messages("a", 0, 0)
            with pytest.raises(NotFoundError):
                follower.read_record(in_old_file)
            with pytest.raises(NotFoundError):
                follower.cq_unit("a", 0, new_min - 1)
            assert [m.queue_offset for m in follower.read_messages("a", 0, new_min, 3)] == [
                new_min,
                new_min + 1,
                new_min + 2,
            ]
            writer.put_message("a", 0, b"after retention")
            assert follower.get_message("a", 0, 100).body == b"after retention"
            assert follower.offset_for_timestamp("a", 0, 0) == new_min
        # A follower that starts after retention skips the units whose records are gone.
        with HotStoreFollower(tmp_path, config=config) as late:
            assert (late.min_offset("a", 0), late.max_offset("a", 0)) == (new_min, 101)
            assert late.get_message("a", 0, 100).body == b"after retention"


def test_follower_writes_nothing_takes_no_lock_and_refuses_every_write(tmp_path: Path) -> None:
    """A follower is a HotReader only: it has no writing method, and ``hot_writer`` (what the facade's
    puts and hot retention and ``run --demo`` go through) refuses it with the error a write always got."""
    config = small_config()
    with LocalMessageStore(tmp_path, config=config) as writer:
        writer.put_message("a", 0, b"one", keys=["k1"], tags="t")
    with HotStoreFollower(tmp_path, config=config) as follower:
        assert not writer_lock_held(tmp_path)
        with LocalMessageStore(tmp_path, config=config) as writer:  # the lock is free for a writer
            writer.put_message("a", 0, b"two")
            assert follower.max_offset("a", 0) == 2
            assert [decode(m.raw).body for m in follower.read_messages("a", 0, 0)] == [b"one", b"two"]
        before = snapshot(tmp_path)
        assert isinstance(follower, HotReader) and not isinstance(follower, LocalMessageStore)
        assert isinstance(writer, HotReader) and hot_writer(writer, "puts") is writer
        for name in ("put_message", "put_messages", "restore_messages", "delete_expired", "flush"):
            assert not hasattr(follower, name)
        for write in (
            lambda: hot_writer(follower, "puts").put_message("a", 0, b"x"),
            lambda: hot_writer(follower, "puts").put_messages([PutRequest("a", 0, b"x")]),
            lambda: hot_writer(follower, "restores").restore_messages("a", 0, [b"x"]),
            lambda: hot_writer(follower, "hot retention deletes").delete_expired(lambda topic, queue_id: 10**9),
        ):
            with pytest.raises(ValidationError, match="followed, not owned"):
                write()
        assert follower.read_only
        assert follower.store_timestamp("a", 0, 1) >= follower.store_timestamp("a", 0, 0)
        assert follower.commitlog_max_offset >= follower.cq_unit("a", 0, 1).commitlog_offset
    assert snapshot(tmp_path) == before


def test_follower_of_a_store_not_written_yet_picks_it_up(tmp_path: Path) -> None:
    config = small_config()
    with HotStoreFollower(tmp_path, config=config, refresh_interval=0) as follower:
        assert follower.queues() == [] and follower.max_offset("a", 0) == 0
        assert follower.read_messages("a", 0, 0) == []
        with LocalMessageStore(tmp_path, config=config) as writer:
            writer.put_message("a", 0, b"first")
            assert follower.queues() == [("a", 0)]
            assert follower.get_message("a", 0, 0).body == b"first"
    with pytest.raises(NotFoundError):
        HotStoreFollower(tmp_path / "missing", config=config)


def test_follower_sees_a_writer_recovery_replace_consume_queue_files(tmp_path: Path) -> None:
    config = small_config()
    writer = LocalMessageStore(tmp_path, config=config)
    for n in range(30):
        writer.put_message("a", 0, f"m{n}".encode())
    writer.flush()  # checkpoint here: recovery rebuilds the queue files written after it
    for n in range(30, 45):
        writer.put_message("a", 0, f"m{n}".encode())
    abandon(writer)
    with HotStoreFollower(tmp_path, config=config, refresh_interval=0) as follower:
        assert follower.max_offset("a", 0) == 45
        with LocalMessageStore(tmp_path, config=config) as recovered:
            assert not recovered.recovery.clean
            for n in range(45, 60):
                recovered.put_message("a", 0, f"m{n}".encode())
            assert follower.max_offset("a", 0) == 60
            bodies = [decode(m.raw).body for m in follower.read_messages("a", 0, 0, max_count=100)]
            assert bodies == [f"m{n}".encode() for n in range(60)]


def test_a_new_follower_does_not_keep_the_whole_hot_store_mapped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Following a queue checks each of its records through the mapping; the pages it moved past are
    unmapped again as it goes, or a follower's RSS would start at the size of the hot store."""
    monkeypatch.setattr(follower_module, "GROW_RELEASE_BYTES", 256 << 10)
    config = small_config(commit_log_file_size=1 << 20, consume_queue_units_per_file=500)
    body = os.urandom(4000)
    with LocalMessageStore(tmp_path, config=config) as store:
        for _ in range(800):  # 4 queues interleaved: every commit-log page holds records of each
            store.put_messages(PutRequest("big", queue_id, body) for queue_id in range(4))
    log_bytes = sum(path.stat().st_size for path in (tmp_path / "commitlog").iterdir())
    assert log_bytes >= 12 << 20
    with HotStoreFollower(tmp_path, config=config) as follower:
        assert [follower.max_offset("big", queue_id) for queue_id in range(4)] == [800] * 4
        assert mapped_rss(tmp_path / "commitlog") <= 2 << 20
        # Unmapped is not gone: every record reads back whole.
        messages = follower.read_messages("big", 2, 0, 1000, 1 << 30)
        assert [decode(m.raw).body for m in messages] == [body] * 800


async def test_the_facade_over_a_followed_hot_store_refuses_puts_and_hot_retention(tmp_path: Path) -> None:
    """What a put into a followed store always answered, the facade still answers: it is the writer's."""
    config = TieredStoreConfig.model_validate({"data_dir": tmp_path / "data"})
    with LocalMessageStore(config.hot_dir, config=local_store_config(config)) as writer:
        writer.put_message("a", 0, b"one")
        writer.flush()
        async with open_runtime(config, hot_mode="auto", recover=False, cold_owner=False) as runtime:
            assert isinstance(runtime.hot, HotStoreFollower)
            store = AsyncTieredMessageStore(runtime)
            try:
                with pytest.raises(ValidationError, match="followed, not owned: puts"):
                    await store.put_message("a", 0, b"two")
                with pytest.raises(ValidationError, match="followed, not owned: hot retention"):
                    await store.delete_expired_hot()
                assert runtime.hot.max_offset("a", 0) == 1
            finally:
                await store.aclose()
