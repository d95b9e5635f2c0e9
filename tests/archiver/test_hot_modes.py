"""The archiver beside a producer application: it follows the hot store the application owns, and the
application deletes hot files once the archiver has recorded them."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.archiver.processes import child_env, run_tieredstore, start_tieredstore
from tests.local.conftest import store_at_times, write_rocketmq_checkpoint
from tieredstore.config import ReadPolicy, load_config
from tieredstore.errors import StoreLockedError, TieredStoreError
from tieredstore.local import HotStoreFollower, writer_lock_held
from tieredstore.local.checkpoint import CLOCK_STEP_MARGIN_MS
from tieredstore.metadata import MetadataStore
from tieredstore.runtime import open_hot_store
from tieredstore.store import AsyncTieredMessageStore

SETTINGS: dict[str, Any] = {
    "TIEREDSTORE_HOT__COMMIT_LOG_FILE_SIZE": 64 << 10,
    "TIEREDSTORE_HOT__MAX_MESSAGE_SIZE": 16 << 10,
    "TIEREDSTORE_HOT__CONSUME_QUEUE_UNITS_PER_FILE": 50,
    "TIEREDSTORE_HOT__HOT_RETENTION_HOURS": 0,
}


async def test_application_owns_the_hot_store_archiver_follows_and_retention_waits_for_the_archive(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    env = child_env({"TIEREDSTORE_DATA_DIR": data_dir, **SETTINGS})
    config = load_config(
        data_dir=data_dir,
        hot={
            "commit_log_file_size": 64 << 10,
            "max_message_size": 16 << 10,
            "consume_queue_units_per_file": 50,
            "hot_retention_hours": 0,
        },
    )
    commit_log = config.hot_dir / "commitlog"
    async with AsyncTieredMessageStore.open(
        config, hot_retention_interval=0.05, read_policy=ReadPolicy.NOT_IN_DISK
    ) as store:
        for n in range(120):
            await store.put_message("Orders", n % 2, f"order-{n}|".encode() * 300, keys=[f"order-{n}"], tags="new")
        files = len(os.listdir(commit_log))
        assert files >= 4
        await asyncio.sleep(0.3)
        assert len(os.listdir(commit_log)) == files, "nothing archived yet: nothing deleted"

        writer_only = await asyncio.to_thread(
            run_tieredstore, ["run", "--once", "--no-demo", "--hot-mode", "writer"], env
        )
        assert writer_only.returncode == 7, writer_only.stderr  # a configuration error: the lock is ours
        assert "already open by another writer" in writer_only.stderr

        archiver = await asyncio.to_thread(run_tieredstore, ["--output", "json", "run", "--once", "--no-demo"], env)
        assert archiver.returncode == 0, archiver.stderr
        assert "following " in archiver.stderr and "another process holds its writer lock" in archiver.stderr
        summary = json.loads(archiver.stdout.strip().splitlines()[-1])
        assert summary["messages"] == 120 and summary["lag"] == 0

        for _ in range(200):
            if len(os.listdir(commit_log)) < files:
                break
            await asyncio.sleep(0.05)
        assert len(os.listdir(commit_log)) < files, "archived and expired: the application deleted hot files"
        hot_min = await asyncio.to_thread(store.runtime.hot.min_offset, "Orders", 0)  # type: ignore[union-attr]
        assert hot_min > 0
        async with AsyncTieredMessageStore.open(config, hot=False) as reader:
            old = await reader.get_messages("Orders", 0, 0, max_count=1)
        assert [m.record.body for m in old.messages] == [b"order-0|" * 300], "the deleted messages are in cold storage"
        # Puts go on, and the archiver picks them up where it stopped.
        await store.put_message("Orders", 0, b"after retention")
        again = await asyncio.to_thread(run_tieredstore, ["--output", "json", "run", "--once", "--no-demo"], env)
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout.strip().splitlines()[-1])["messages"] == 1


async def test_a_follower_started_before_its_writer_waits_for_the_hot_store_then_archives_it(
    tmp_path: Path,
) -> None:
    # A deployment starts everything at once: the archiver may come up before the application has
    # created the hot store. It waits (saying so) instead of exiting, then archives as usual.
    data_dir = tmp_path / "data"
    env = child_env({"TIEREDSTORE_DATA_DIR": data_dir, "TIEREDSTORE_ARCHIVER__GROUP_COMMIT_TIMEOUT": 0.2, **SETTINGS})
    stderr = tmp_path / "archiver.err"
    archiver = start_tieredstore(
        ["--output", "json", "run", "--no-demo", "--hot-mode", "follower", "--duration", "60"], env, stderr
    )
    try:
        await _until(lambda: "waiting for the hot store" in stderr.read_text(), "the archiver to say it waits")
        assert archiver.poll() is None, stderr.read_text()
        config = load_config(data_dir=data_dir)
        async with AsyncTieredMessageStore.open(config, read_policy=ReadPolicy.NOT_IN_DISK) as store:
            for n in range(30):
                await store.put_message("Orders", 0, f"order-{n}".encode(), keys=[f"order-{n}"])
            await _until(lambda: _archived(config) == 30, "the archiver to archive what was put")
        archiver.send_signal(signal.SIGTERM)
        stdout, _ = archiver.communicate(timeout=30)
    finally:
        if archiver.poll() is None:
            archiver.kill()
            archiver.wait()
    assert archiver.returncode == 0, stderr.read_text()
    assert "appeared" in stderr.read_text()
    assert json.loads(stdout.decode().strip().splitlines()[-1])["messages"] == 30


def test_a_waiting_follower_stops_cleanly_on_sigterm_and_once_does_not_wait(tmp_path: Path) -> None:
    env = child_env({"TIEREDSTORE_DATA_DIR": tmp_path / "data"})
    stderr = tmp_path / "archiver.err"
    archiver = start_tieredstore(["run", "--no-demo", "--hot-mode", "follower"], env, stderr)
    try:
        deadline = time.monotonic() + 30
        while "waiting for the hot store" not in stderr.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        archiver.send_signal(signal.SIGTERM)
        archiver.wait(timeout=10)
    finally:
        if archiver.poll() is None:
            archiver.kill()
            archiver.wait()
    assert archiver.returncode == 0, stderr.read_text()
    assert "stopped before the hot store appeared" in stderr.read_text()
    once = run_tieredstore(["run", "--once", "--no-demo", "--hot-mode", "follower"], env)
    assert once.returncode != 0 and "there is no hot store to follow" in once.stderr
    assert not (tmp_path / "data" / "hot").exists()


UNTIL_SECONDS = 30


def _archived(config: Any) -> int:
    with MetadataStore(config.effective_metadata_url) as metadata:
        return sum(queue.max_offset for queue in metadata.list_queues())


async def _until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + UNTIL_SECONDS
    while time.monotonic() < deadline:
        try:
            if await asyncio.to_thread(condition):
                return
        except (FileNotFoundError, TieredStoreError):
            pass  # the file or database is not there yet
        await asyncio.sleep(0.1)
    raise AssertionError(f"not within {UNTIL_SECONDS}s: {what}")


# What a RocketMQ broker does to its store's lock file while it runs: Java's FileChannel.tryLock(0, 1, false),
# an exclusive POSIX record lock on the first byte.
_LOCK_LIKE_A_BROKER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
print("locked", flush=True)
sys.stdin.read()
"""


def _broker_starting_on(store: Path) -> subprocess.CompletedProcess[str]:
    """A broker process trying its store lock once and exiting (non-zero when the lock is taken)."""
    return subprocess.run(
        [sys.executable, "-c", _LOCK_LIKE_A_BROKER, str(store / "lock")],
        input="",
        capture_output=True,
        text=True,
        check=False,
    )


def test_auto_mode_follows_a_store_a_running_rocketmq_broker_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = load_config(
        data_dir=tmp_path / "data",
        hot={"commit_log_file_size": 64 << 10, "max_message_size": 16 << 10, "consume_queue_units_per_file": 10},
    )
    stored = 1_786_727_751_000
    store_at_times(config.hot_dir, "Orders", [(0, stored + n * 1000) for n in range(5)])
    write_rocketmq_checkpoint(config.hot_dir, physic_timestamp=stored + 2000 + CLOCK_STEP_MARGIN_MS)
    checkpoint = (config.hot_dir / "checkpoint").read_bytes()
    broker = subprocess.Popen(
        [sys.executable, "-c", _LOCK_LIKE_A_BROKER, str(config.hot_dir / "lock")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert broker.stdout is not None and broker.stdout.readline() == "locked\n"
        flocked: list[int] = []
        real_flock = fcntl.flock

        def recording_flock(fd: int, operation: int) -> None:
            flocked.append(operation)
            real_flock(fd, operation)

        monkeypatch.setattr(fcntl, "flock", recording_flock)
        with open_hot_store(config, mode="auto") as hot:
            assert isinstance(hot, HotStoreFollower), "the broker owns its store: the archiver only follows it"
            assert hot.durable_max_offset("Orders", 0) == 3
        assert flocked == [], "finding the broker's lock takes none on its lock file, not even for an instant"
        monkeypatch.undo()
        with pytest.raises(StoreLockedError, match="already open by another writer"):
            open_hot_store(config, mode="writer")
        assert (config.hot_dir / "checkpoint").read_bytes() == checkpoint, "nothing written into the broker's store"
    finally:
        assert broker.stdin is not None
        broker.stdin.close()
        broker.wait()


def test_a_broker_started_on_the_store_our_writer_holds_is_refused(tmp_path: Path) -> None:
    config = load_config(data_dir=tmp_path / "data")
    with open_hot_store(config, mode="writer") as hot:
        hot.put_message("Orders", 0, b"ours")
        broker = _broker_starting_on(config.hot_dir)
    assert broker.returncode != 0 and "locked" not in broker.stdout, "the broker's tryLock finds the store taken"
    assert "BlockingIOError" in broker.stderr or "PermissionError" in broker.stderr


def test_the_writers_broker_lock_outlives_other_descriptors_of_its_lock_file_in_the_same_process(
    tmp_path: Path,
) -> None:
    config = load_config(data_dir=tmp_path / "data")
    with open_hot_store(config, mode="writer") as hot:
        hot.put_message("Orders", 0, b"ours")
        # Each of these opens and closes the lock file in this process: a classic POSIX lock would be gone after.
        assert writer_lock_held(config.hot_dir)
        with pytest.raises(StoreLockedError):
            open_hot_store(config, mode="writer")
        broker = _broker_starting_on(config.hot_dir)
    assert broker.returncode != 0 and "locked" not in broker.stdout, "the broker still finds the store taken"
