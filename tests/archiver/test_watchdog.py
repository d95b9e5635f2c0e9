"""The commit watchdog (``archiver.commit_timeout``): a hung upload is abandoned, retried and archived once.

Both tests run the archiver as ``tieredstore run`` wires it (``open_runtime``) with a one-second
timeout, one queue's upload hanging and other queues archiving beside it. On S3 the fault proxy holds
that queue's commit-log PUTs unanswered, then hands them to moto late, beside the retry; on POSIX the
test holds the queue's commit-log file lock, as another process would, so the archiver's write blocks
in the kernel in its worker thread, and its retries must not start a second one. Each waits on
conditions (queues archived, timeouts counted), never on the clock, and ends with ``verify --deep`` run
as its own process.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from tests.archiver.processes import child_env, run_tieredstore
from tests.fixtures.faultproxy import FaultProxy, HangRule
from tests.fixtures.s3 import S3Server
from tests.reliability.archiver_run import invariant_problems, s3_config, wait_for
from tieredstore.config import TieredStoreConfig
from tieredstore.dispatcher import Dispatcher, OnceResult
from tieredstore.formats.naming import FileType, queue_path, segment_key, segment_name
from tieredstore.providers.chunks import chunk_name
from tieredstore.runtime import Runtime, open_runtime

pytestmark = pytest.mark.timeout(240)

HUNG = ("Hung", 0)
STEADY = [("Steady", queue_id) for queue_id in range(3)]
MESSAGES = 40
# Retries a second or more apart: each abandoned attempt keeps a worker thread until its request is let go.
WATCHDOG = {"commit_timeout": 1.0, "retry_initial_backoff": 1.0, "retry_max_backoff": 4.0}


def produce(runtime: Runtime) -> int:
    hot = runtime.hot
    assert hot is not None
    for topic, queue_id in [HUNG, *STEADY]:
        for n in range(MESSAGES):
            hot.put_message(topic, queue_id, f"{topic}-{queue_id}-{n}".encode() * 20, keys=[f"k{n}"])
    return MESSAGES * (1 + len(STEADY))


def timeouts(runtime: Runtime) -> float:
    value = runtime.metrics.registry.get_sample_value(
        "tieredstore_commit_timeouts_total", {"topic": HUNG[0], "queue_id": str(HUNG[1])}
    )
    return value or 0.0


class SteadyWatch:
    """Notes, the first time every steady queue is archived, how far the hung queue was then."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher
        self.hung_archived_then: int | None = None

    def steady_done(self) -> bool:
        done = all(self.dispatcher.archived_offset(*key) >= MESSAGES for key in STEADY)
        if done and self.hung_archived_then is None:
            self.hung_archived_then = self.dispatcher.archived_offset(*HUNG)
        return done


async def archive_while_hung(
    runtime: Runtime, *, timeouts_seen: int, also: Callable[[], bool] = lambda: True
) -> tuple[int, SteadyWatch, asyncio.Task[OnceResult]]:
    """Produce, start ``run_once``, and return once the steady queues are archived, the hung one's attempts
    were abandoned ``timeouts_seen`` times and ``also`` holds: (messages produced, the watch, the archive)."""
    total = produce(runtime)
    watch = SteadyWatch(Dispatcher.from_runtime(runtime))
    archiving = asyncio.create_task(watch.dispatcher.run_once(max_attempts=1000))
    await wait_for(
        lambda: watch.steady_done() and timeouts(runtime) >= timeouts_seen and also(), 120, "steady queues archived"
    )
    return total, watch, archiving


@pytest.fixture
def warnings_logged() -> Iterator[list[dict[str, Any]]]:
    with structlog.testing.capture_logs() as logs:
        yield logs


def abandoned_lines(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [line for line in logs if line["event"].startswith("commit attempt abandoned after commit_timeout")]


def refused_lines(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [line for line in logs if "an earlier write to it has not returned yet" in str(line.get("error"))]


async def verify_deep(env: dict[str, Any], records: int) -> None:
    verify = await asyncio.to_thread(run_tieredstore, ["--output", "json", "verify", "--deep"], child_env(env), 120)
    assert verify.returncode == 0, verify.stderr
    report = json.loads(verify.stdout)
    assert report["problems"] == [] and report["records"] == records


async def test_a_hung_s3_upload_is_abandoned_and_retried_while_other_queues_archive(
    tmp_path: Path, s3_server: S3Server, s3_bucket_url: str, warnings_logged: list[dict[str, Any]]
) -> None:
    data_dir = tmp_path / "data"
    first_chunk = f"{HUNG[0]}/{HUNG[1]}/COMMIT_LOG/{segment_name(0)}/{chunk_name(0)}"
    async with FaultProxy(s3_server.endpoint_url).running() as proxy:
        # Every attempt at the queue's first chunk hangs until the other queues are archived.
        hang = proxy.hang(HangRule("PUT", times=1000, path_contains=first_chunk))
        config = s3_config(data_dir, s3_bucket_url, s3_server, proxy.endpoint_url, **WATCHDOG)
        async with open_runtime(config) as runtime:
            total, watch, archiving = await archive_while_hung(runtime, timeouts_seen=2)
            held = 1000 - hang.times
            hang.release()  # the held PUTs reach moto now, one after another, and the next attempt goes through
            result = await archiving
            # Every held PUT reaches moto in the end, after the client abandoned it.
            await wait_for(lambda: len(proxy.late_replies) == held, 60, "the held PUTs reaching S3")
            archived, problems = await invariant_problems(runtime)

    assert watch.hung_archived_then == 0  # the other queues were archived while the hung one waited
    assert result.failed == {} and problems == [] and archived == total
    assert timeouts(runtime) >= 2 and held >= 2
    # The held PUTs all create the same chunk, abandoned by the client long before: If-None-Match refuses
    # every one that finds it there (from the retry or an earlier held PUT), so nothing is overwritten.
    statuses = {status for _method, _path, status in proxy.late_replies}
    assert statuses <= {200, 412} and 412 in statuses
    lines = abandoned_lines(warnings_logged)
    assert lines and all((line["topic"], line["queue_id"]) == HUNG for line in lines)
    assert "made no progress for 1s" in lines[0]["error"]
    s3_env = {f"TIEREDSTORE_S3__{name.upper()}": value for name, value in s3_server.provider_options().items()}
    await verify_deep({"TIEREDSTORE_DATA_DIR": data_dir, "TIEREDSTORE_COLD_URL": s3_bucket_url, **s3_env}, total)


def posix_config(data_dir: Path) -> TieredStoreConfig:
    return TieredStoreConfig(
        data_dir=data_dir,
        hot={"commit_log_file_size": 16 << 20},
        archiver={"group_commit_count": 16, "group_commit_timeout": 0, **WATCHDOG},
    )


async def test_a_posix_write_blocked_in_the_kernel_is_abandoned_and_its_late_write_lands_nothing_twice(
    tmp_path: Path, warnings_logged: list[dict[str, Any]]
) -> None:
    data_dir = tmp_path / "data"
    config = posix_config(data_dir)
    # The hung queue's first commit-log file, locked by "another process" (an open file description of
    # ours): the archiver's commit thread blocks in flock, as on a hung file system, until it is let go.
    path = Path(config.effective_cold_url) / segment_key(
        queue_path(config.cluster, config.broker, *HUNG), FileType.COMMIT_LOG, 0
    )
    path.parent.mkdir(parents=True)
    holder = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        async with open_runtime(config) as runtime:
            # A retry while the abandoned write's thread is still blocked starts no second one: it fails at once.
            total, watch, archiving = await archive_while_hung(
                runtime, timeouts_seen=1, also=lambda: bool(refused_lines(warnings_logged))
            )
            fcntl.flock(holder, fcntl.LOCK_UN)  # the blocked write goes on now
            result = await archiving
            archived, problems = await invariant_problems(runtime)
            hot = runtime.hot
            assert hot is not None
            hung_bytes = sum(len(m.raw) for m in hot.read_messages(*HUNG, 0, MESSAGES, 1 << 30))
    finally:
        os.close(holder)

    assert watch.hung_archived_then == 0
    assert result.failed == {} and problems == [] and archived == total
    # The abandoned write landed late, and the retry after it found its bytes there: the file holds them once.
    assert path.stat().st_size == hung_bytes
    lines = abandoned_lines(warnings_logged)
    assert len(lines) == 1 and (lines[0]["topic"], lines[0]["queue_id"]) == HUNG  # one thread, one timeout
    assert all((line["topic"], line["queue_id"]) == HUNG for line in refused_lines(warnings_logged))
    await verify_deep({"TIEREDSTORE_DATA_DIR": data_dir}, total)
