"""``tieredstore run`` as a user runs it: --once, the demo with --duration, SIGTERM, and the metrics endpoint."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time
from pathlib import Path

import pytest

from tests.archiver.processes import child_env, run_producer, run_tieredstore, scrape, start_tieredstore, wait_for_text
from tieredstore.config import TieredStoreConfig, load_config
from tieredstore.flat import check_queue_invariant
from tieredstore.runtime import open_runtime


def _env(data_dir: Path, **extra: object) -> dict[str, str]:
    return child_env({"TIEREDSTORE_DATA_DIR": data_dir, **extra})


async def _problems(data_dir: Path) -> tuple[int, int, list[str]]:
    return await archive_problems(load_config(data_dir=data_dir))


async def archive_problems(config: TieredStoreConfig) -> tuple[int, int, list[str]]:
    """(hot messages, archived messages, invariant problems) over every hot queue."""
    hot_total = archived_total = 0
    problems: list[str] = []
    async with open_runtime(config) as runtime:
        assert runtime.hot is not None
        for topic, queue_id in runtime.hot.queues():
            hot_max = runtime.hot.max_offset(topic, queue_id)
            hot_total += hot_max
            flat_file = runtime.flat.get(topic, queue_id)
            archived_total += flat_file.archived_offset
            reference = {m.queue_offset: m.raw for m in runtime.hot.read_messages(topic, queue_id, 0, hot_max, 1 << 40)}
            problems += [str(p) for p in await check_queue_invariant(flat_file, reference=reference)]
    return hot_total, archived_total, problems


def _summary(stdout: str) -> dict[str, object]:
    loaded = json.loads(stdout.strip().splitlines()[-1])
    assert isinstance(loaded, dict)
    return loaded


def test_once_archives_everything_then_exits(tmp_path: Path) -> None:
    env = _env(tmp_path / "data")
    run_producer(400, seed=1, env=env)
    result = run_tieredstore(["--output", "json", "run", "--once"], env)
    assert result.returncode == 0, result.stderr
    summary = _summary(result.stdout)
    assert summary["messages"] == 400 and summary["lag"] == 0
    assert "demo workload" not in result.stderr, "--once never starts the demo on its own"
    hot, archived, problems = asyncio.run(_problems(tmp_path / "data"))
    assert (hot, archived, problems) == (400, 400, [])
    again = run_tieredstore(["--output", "json", "run", "--once"], env)
    assert again.returncode == 0 and _summary(again.stdout)["messages"] == 0, "nothing is archived twice"


def test_demo_on_an_empty_hot_store_shows_messages_flowing_and_ends_after_duration(tmp_path: Path) -> None:
    env = _env(tmp_path / "data")
    result = run_tieredstore(["--output", "json", "run", "--duration", "4", "--demo-messages", "600"], env)
    assert result.returncode == 0, result.stderr
    assert "The hot store" in result.stderr and "is empty: starting a demo workload" in result.stderr
    summary = _summary(result.stdout)
    assert summary["demo_messages_produced"] == 600
    assert summary["messages"] == 600 and summary["lag"] == 0
    hot, archived, problems = asyncio.run(_problems(tmp_path / "data"))
    assert (hot, archived, problems) == (600, 600, [])
    # a second run finds messages and so starts no demo
    second = run_tieredstore(["--output", "json", "run", "--duration", "0.5"], env)
    assert second.returncode == 0 and "demo workload" not in second.stderr


@pytest.mark.slow
def test_sigterm_stops_cleanly_within_the_shutdown_timeout(tmp_path: Path) -> None:
    env = _env(tmp_path / "data", TIEREDSTORE_ARCHIVER__SHUTDOWN_TIMEOUT=10)
    stderr = tmp_path / "stderr.txt"
    process = start_tieredstore(
        ["--output", "json", "run", "--demo", "--demo-messages", "1000000", "--demo-rate", "3000"], env, stderr
    )
    try:
        wait_for_text(stderr, "archiving ", timeout=30)
        time.sleep(2.5)
        process.send_signal(signal.SIGTERM)
        started = time.monotonic()
        stdout, _ = process.communicate(timeout=15)
        took = time.monotonic() - started
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, stderr.read_text()
    assert took < 10
    assert "SIGTERM: stopping" in stderr.read_text()
    summary = _summary(stdout.decode())
    assert isinstance(summary["messages"], int) and summary["messages"] > 0
    # Whatever was in flight was finished or abandoned safely: a --once run completes the archive exactly.
    finish = run_tieredstore(["run", "--once", "--no-demo"], env)
    assert finish.returncode == 0, finish.stderr
    hot, archived, problems = asyncio.run(_problems(tmp_path / "data"))
    assert problems == [] and archived == hot > 0


DEMO_QUEUES = (("DemoOrders", 0), ("DemoOrders", 1), ("DemoOrders", 2), ("DemoOrders", 3))
DEMO_QUEUES += (("DemoPayments", 0), ("DemoPayments", 1))


@pytest.mark.slow
def test_metrics_endpoint_serves_dispatch_counters_and_lag(tmp_path: Path) -> None:
    env = _env(tmp_path / "data")
    stderr = tmp_path / "stderr.txt"
    process = start_tieredstore(
        ["run", "--demo", "--demo-messages", "500", "--metrics-port", "0", "--duration", "20"], env, stderr
    )
    try:
        text = wait_for_text(stderr, "/metrics", timeout=30)
        match = re.search(r"http://127\.0\.0\.1:(\d+)/metrics", text)
        assert match, text
        url = match.group(0)
        # The demo spreads its 500 messages over six queues that commit independently (each on its own
        # group-commit timer), so the counters grow a queue at a time: wait until every message is
        # counted, never for one queue's lag alone.
        deadline = time.monotonic() + 15
        body = scrape(url)
        while _dispatched(body) < 500 and time.monotonic() < deadline:
            time.sleep(0.3)
            body = scrape(url)
        assert _dispatched(body) == 500, body
        assert (_sample(body, "tieredstore_commit_seconds_count") or 0) > 0
        for topic, queue_id in DEMO_QUEUES:
            assert _sample(body, _lag_name(topic, queue_id)) == 0.0, (topic, queue_id, body)
        # Nothing is counted twice: once everything is archived the counters stay where they are.
        assert _dispatched(scrape(url)) == 500
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=30)
    assert process.returncode == 0
    # The counters match what a reader finds archived.
    hot, archived, problems = asyncio.run(_problems(tmp_path / "data"))
    assert (hot, archived, problems) == (500, 500, [])


def _dispatched(body: str) -> float:
    return sum(
        _sample(body, f'tieredstore_dispatched_messages_total{{topic="{topic}"}}') or 0.0
        for topic in ("DemoOrders", "DemoPayments")
    )


def _lag_name(topic: str, queue_id: int) -> str:
    return f'tieredstore_queue_lag_messages{{queue_id="{queue_id}",topic="{topic}"}}'


def _sample(body: str, name: str) -> float | None:
    for line in body.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return None
