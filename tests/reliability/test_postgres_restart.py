"""PostgreSQL restarted under a running archiver: it reconnects, keeps its leases and carries on archiving.

A producer process puts continuously (sync flush) while ``tieredstore run --hot-mode follower`` archives
to a POSIX cold tier with its metadata (and queue leases) on PostgreSQL. The PostgreSQL server itself
is restarted twice while batches are being committed; each time the archive must move on again, and
at the end the archiver catches up, stops cleanly on SIGTERM, and the checker finds every message
exactly once.

The server is shared with every other test on this machine: this is the only test that restarts it,
it waits for ``pg_isready`` after each restart and again, whatever happened, when it ends.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.archiver.processes import child_env, run_tieredstore, start_tieredstore, wait_for_text
from tests.archiver.test_crash import _settings, _unmatched_acks
from tests.fixtures.postgres import POSTGRES_HOST, POSTGRES_PORT
from tests.reliability.archiver_run import archive_state
from tests.reliability.test_crash_loop import SyncProducer
from tieredstore.config import load_config
from tieredstore.runtime import open_hot_store

# serial: restarting the server would break every PostgreSQL test running beside it in another worker.
pytestmark = [pytest.mark.reliability, pytest.mark.slow, pytest.mark.postgres, pytest.mark.serial]

RESTARTS = 2


def _cluster_version() -> str:
    versions = sorted(os.listdir("/etc/postgresql"))
    assert versions, "no PostgreSQL cluster under /etc/postgresql: this scenario needs the local server"
    return versions[-1]


def pg_ready(within: float) -> bool:
    """Whether the server accepts connections within ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        ready = subprocess.run(
            ["pg_isready", "-h", POSTGRES_HOST, "-p", str(POSTGRES_PORT), "-t", "2"], capture_output=True, check=False
        )
        if ready.returncode == 0:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


def wait_pg_ready(within: float = 60) -> None:
    if not pg_ready(within):
        pytest.fail(f"PostgreSQL is not accepting connections {within}s after a restart", pytrace=False)


METADATA_FAILURE = re.compile(r"metadata database (?:\S+ )?(?:failed|cannot be reached)")


def metadata_failures(log: Path) -> int:
    """How many metadata failures the archiver has logged so far."""
    return len(METADATA_FAILURE.findall(log.read_text()))


def _pg_ctl(action: str) -> None:
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", _cluster_version(), "main", action],
        check=True,
        capture_output=True,
        timeout=120,
    )


def restart_postgres(archiver_log: Path) -> float:
    """Stop the server (every connection is cut), keep it down until the archiver has hit the outage and
    logged it, start it again; seconds until it accepts connections again.

    A plain restart can be over between two of the archiver's transactions on a quiet machine, and its
    pool then reconnects without ever seeing the outage: waiting for the log makes the outage real.
    """
    seen = metadata_failures(archiver_log)
    started = time.monotonic()
    _pg_ctl("stop")
    try:
        deadline = time.monotonic() + 30
        while metadata_failures(archiver_log) == seen:
            assert time.monotonic() < deadline, "the archiver logged no metadata failure within 30 s of the outage"
            time.sleep(0.1)
    finally:
        _pg_ctl("start")
    wait_pg_ready()
    return time.monotonic() - started


@pytest.fixture
def postgres_back_up() -> Iterator[None]:
    """Whatever the test did, the shared server is accepting connections when it ends."""
    yield
    if not pg_ready(10):
        subprocess.run(
            ["pg_ctlcluster", "--skip-systemctl-redirect", _cluster_version(), "main", "start"],
            capture_output=True,
            timeout=120,
            check=False,
        )
        wait_pg_ready()


def archived_total(url: str) -> int:
    """Messages archived over all queues, as recorded in metadata (a fresh connection each time)."""
    conninfo = url.replace("postgresql+psycopg://", "postgresql://")
    try:
        with psycopg.connect(conninfo, connect_timeout=2) as connection:
            row = connection.execute("SELECT coalesce(sum(max_offset), 0) FROM queues").fetchone()
    except psycopg.OperationalError:
        return -1  # the server is restarting
    assert row is not None
    return int(row[0])


def wait_archived_beyond(url: str, floor: int, within: float) -> tuple[int, float]:
    """(archived total, seconds waited) once more than ``floor`` messages are archived."""
    started = time.monotonic()
    while (total := archived_total(url)) <= floor:
        assert time.monotonic() - started < within, f"archiving stuck at {total} (needs more than {floor})"
        time.sleep(0.1)
    return total, time.monotonic() - started


def test_the_archiver_reconnects_after_a_postgres_restart_and_archives_everything_once(
    tmp_path: Path,
    request: pytest.FixtureRequest,
    postgres_url: str,
    postgres_back_up: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings = _settings(tmp_path, "posix", request)
    settings |= {
        "TIEREDSTORE_METADATA_URL": postgres_url,
        "TIEREDSTORE_ARCHIVER__LEASE_DURATION": 10,
        "TIEREDSTORE_ARCHIVER__LEASE_RENEW_INTERVAL": 1,
    }
    env = child_env(settings)
    for name, value in settings.items():
        monkeypatch.setenv(name, str(value))
    upgrade = run_tieredstore(["db", "upgrade"], env)
    assert upgrade.returncode == 0, upgrade.stderr
    producer = SyncProducer(tmp_path, env, seed=int(time.time()), rate=300.0)
    producer.start()
    # The follower needs the hot store the producer creates: start it once a put is acknowledged (a CI run
    # started both at once and the archiver, first, stopped on "there is no hot store to follow").
    wait_for_text(tmp_path / "acks-0.txt", "ACK ", timeout=30)
    stderr = tmp_path / "archiver.txt"
    archiver = start_tieredstore(["--output", "json", "run", "--no-demo", "--hot-mode", "follower"], env, stderr)
    figures = []
    try:
        wait_for_text(stderr, "archiving ", timeout=60)
        before, _ = wait_archived_beyond(postgres_url, 500, within=60)
        for _ in range(RESTARTS):
            down = restart_postgres(stderr)
            back_at = archived_total(postgres_url)
            after, resumed_in = wait_archived_beyond(postgres_url, back_at, within=60)
            assert archiver.poll() is None, stderr.read_text()
            figures.append((back_at, round(down, 1), round(resumed_in, 1)))
            wait_archived_beyond(postgres_url, after + 300, within=60)  # and it keeps going
        producer.kill()
        # The producer's store is recovered, as its next start would: a follower archives only what the
        # writer's checkpoint covers, and the checkpoint that recovery writes covers what the kill left.
        with open_hot_store(load_config()) as hot:
            produced = sum(hot.max_offset(topic, queue_id) for topic, queue_id in hot.queues())
        wait_archived_beyond(postgres_url, produced - 1, within=60)
        archiver.send_signal(signal.SIGTERM)
        stdout, _ = archiver.communicate(timeout=60)
    finally:
        if archiver.poll() is None:
            archiver.kill()
            archiver.wait(timeout=10)
        if producer.process is not None and producer.process.poll() is None:
            producer.kill()
    log = stderr.read_text()
    assert archiver.returncode == 0, log
    summary = json.loads(stdout.decode().strip().splitlines()[-1])

    archived, problems = asyncio.run(archive_state(load_config(), follow=False))
    assert problems == []
    assert sum(archived.values()) == produced == archived_total(postgres_url)
    acks = producer.acknowledged()
    assert _unmatched_acks(acks) == []
    assert all(offset < archived[(topic, queue_id)] for topic, queue_id, offset in acks)
    assert summary["queues_lost"] == 0  # the restarts cost no lease
    failures = metadata_failures(stderr)
    assert failures >= RESTARTS  # each outage cut the archiver off mid-work, and it said so
    with capsys.disabled():
        print(
            f"\nfigures postgres-restart: {RESTARTS} restarts (archived when it was back, seconds it took, "
            f"seconds to the next recorded commit): {figures}; {produced:,} messages "
            f"({before:,} before the first restart) archived exactly once; "
            f"{summary['commit_failures']} commit failures, {failures} metadata errors logged, "
            f"{summary['queues_lost']} leases lost"
        )
