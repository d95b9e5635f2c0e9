"""The archiver beside a producer application: it follows the hot store the application owns, and the
application deletes hot files once the archiver has recorded them."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from tests.archiver.processes import child_env, run_tieredstore
from tieredstore.config import ReadPolicy, load_config
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
