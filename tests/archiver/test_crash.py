"""THE crash test: a producer process and an archiver process run at the same time, and both get SIGKILLed.

The producer owns the hot store and puts continuously (sync flush on some runs, async on others); it
is killed and restarted a few times, so the archiver also follows the producer's crash recovery. The
archiver follows the hot store read-only (``run --hot-mode follower``) and is SIGKILLed at random
moments, from start-up and recovery to the middle of batches, at least 20 times, each time started
again. Then the producer stops, one ``run --once`` (the writer lock is free again, so it owns the
store) completes the archive, and the checker must find every hot message archived exactly once,
byte-identical but for PHYSICALOFFSET, at contiguous offsets, with every acknowledged put among
them — on POSIX and on S3 (moto over HTTP, reached by the child processes through its endpoint), and
on POSIX with PostgreSQL and queue leases, where every restart recovers its queues under the epoch
fence: it finishes a commit a kill cut short, or abandons what it cannot use in place.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import subprocess
import time
import zlib
from pathlib import Path
from typing import Any

import pytest

from tests.archiver.processes import child_env, run_tieredstore, start_producer, start_tieredstore, wait_for_text
from tests.archiver.test_run import archive_problems
from tieredstore.config import load_config
from tieredstore.metadata import upgrade
from tieredstore.runtime import open_hot_store

KILLS = 20
PRODUCER_KILL_EVERY = 5  # the producer is SIGKILLed and restarted during every 5th archiver run


def _settings(tmp_path: Path, backend: str, request: pytest.FixtureRequest) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "TIEREDSTORE_DATA_DIR": tmp_path / "data",
        # Small batches and segments: many commits and segment rolls for a kill to land in.
        "TIEREDSTORE_ARCHIVER__GROUP_COMMIT_COUNT": 8,
        "TIEREDSTORE_ARCHIVER__GROUP_COMMIT_SIZE": 48 << 10,
        "TIEREDSTORE_ARCHIVER__GROUP_COMMIT_TIMEOUT": 0,
        "TIEREDSTORE_ARCHIVER__SCAN_INTERVAL": 0.05,
        "TIEREDSTORE_ARCHIVER__MAX_PENDING_COMMITS": 3,
        "TIEREDSTORE_SEGMENTS__COMMIT_LOG_MAX_SIZE": 128 << 10,
        "TIEREDSTORE_SEGMENTS__CONSUME_QUEUE_MAX_SIZE": 40 * 20,
        # Small hot files: the follower crosses commit-log and consume-queue files while they are written.
        "TIEREDSTORE_HOT__COMMIT_LOG_FILE_SIZE": 1 << 20,
        "TIEREDSTORE_HOT__MAX_MESSAGE_SIZE": 128 << 10,
        "TIEREDSTORE_HOT__CONSUME_QUEUE_UNITS_PER_FILE": 100,
    }
    if backend.startswith("posix"):
        settings["TIEREDSTORE_COLD_URL"] = tmp_path / "cold"
    else:
        settings["TIEREDSTORE_COLD_URL"] = request.getfixturevalue("s3_bucket_url")
        settings.update(request.getfixturevalue("s3_server").settings())
    if backend.endswith("leases"):
        # PostgreSQL and queue leases, so every restart recovers its queues under the epoch fence (where a
        # cut abandons bytes instead of deleting them). One owner id for all runs: a restarted archiver
        # renews the leases its killed predecessor held instead of waiting for them to expire.
        url = request.getfixturevalue("postgres_url")
        upgrade(url)
        settings["TIEREDSTORE_METADATA_URL"] = url
        settings["TIEREDSTORE_ARCHIVER__LEASES"] = "true"
        settings["TIEREDSTORE_ARCHIVER__OWNER_ID"] = "crash-loop"
        settings["TIEREDSTORE_ARCHIVER__LEASE_DURATION"] = 3.0
        settings["TIEREDSTORE_ARCHIVER__LEASE_RENEW_INTERVAL"] = 1.0
    return settings


class Producer:
    """The producer process, restarted after each kill with a new seed; every run's ACK lines are kept."""

    def __init__(self, tmp_path: Path, env: dict[str, str], seed: int, rate: float) -> None:
        self.tmp_path = tmp_path
        self.env = env
        self.seed = seed
        self.rate = rate
        self.runs = 0
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = dict(self.env, TIEREDSTORE_HOT__FLUSH_MODE="sync" if self.runs % 2 == 0 else "async")
        self.process = start_producer(self.seed + self.runs, self.rate, env, self.tmp_path / f"acks-{self.runs}.txt")
        self.runs += 1

    def kill(self) -> None:
        assert self.process is not None
        assert self.process.poll() is None, f"producer run {self.runs - 1} exited early"
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def acknowledged(self) -> dict[tuple[str, int, int], int]:
        """(topic, queue id, queue offset) -> body CRC of every put a producer saw return."""
        acks: dict[tuple[str, int, int], int] = {}
        for run in range(self.runs):
            text = (self.tmp_path / f"acks-{run}.txt").read_text()
            for line in text.splitlines(keepends=True):
                if not line.startswith("ACK ") or not line.endswith("\n"):
                    continue  # a log line, or cut off by the kill
                _, topic, queue_id, queue_offset, crc = line.split()
                acks[(topic, int(queue_id), int(queue_offset))] = int(crc)
        return acks


def _unmatched_acks(acks: dict[tuple[str, int, int], int]) -> list[str]:
    """Acknowledged puts that the hot store does not hold with the same body."""
    problems = []
    with open_hot_store(load_config()) as hot:
        for (topic, queue_id, offset), crc in sorted(acks.items()):
            if offset >= hot.max_offset(topic, queue_id):
                problems.append(f"{topic}/{queue_id}@{offset} acknowledged but missing")
            elif zlib.crc32(hot.get_message(topic, queue_id, offset).body) != crc:
                problems.append(f"{topic}/{queue_id}@{offset} acknowledged with another body")
    return problems


@pytest.mark.slow
@pytest.mark.reliability
@pytest.mark.parametrize("backend", ["posix", "s3", pytest.param("posix-leases", marks=pytest.mark.postgres)])
def test_concurrent_producer_and_sigkilled_archiver_archive_every_message_exactly_once(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = _settings(tmp_path, backend, request)
    env = child_env(settings)
    rng = random.Random()
    seed = rng.randrange(1 << 30)
    rng.seed(seed)
    # S3 commits are slower (moto): a lower rate keeps the final --once and the check short.
    producer = Producer(tmp_path, env, seed, rate=150.0 if backend == "posix" else 30.0)
    producer.start()
    wait_for_text(tmp_path / "acks-0.txt", "ACK ", timeout=30)
    kills_mid_archive = 0
    # A quarter of the kills land anywhere from start-up and recovery on, the rest in the middle of
    # batches: chosen up front, so that a run never ends up with few mid-archive kills by chance.
    anywhere = set(rng.sample(range(KILLS), KILLS // 4))
    try:
        for attempt in range(KILLS):
            stderr = tmp_path / f"archiver-{attempt}.txt"
            process = start_tieredstore(["--log-json", "run", "--no-demo", "--hot-mode", "follower"], env, stderr)
            try:
                if attempt % PRODUCER_KILL_EVERY == PRODUCER_KILL_EVERY - 1:
                    # The producer dies while the archiver starts; its restart recovers the hot store under it.
                    time.sleep(rng.uniform(0.0, 1.0))
                    producer.kill()
                    producer.start()
                if attempt in anywhere:
                    time.sleep(rng.uniform(0.0, 1.2))  # anywhere from start-up and recovery on
                else:
                    wait_for_text(stderr, "archiving ", timeout=30)
                    time.sleep(rng.uniform(0.0, 0.6))  # in the middle of batches
                    kills_mid_archive += 1
                assert process.poll() is None, f"archiver exited early (seed {seed}):\n{stderr.read_text()}"
                process.send_signal(signal.SIGKILL)
            finally:
                process.wait(timeout=10)
            assert process.returncode == -signal.SIGKILL
        followed = sum("following " in (tmp_path / f"archiver-{n}.txt").read_text() for n in range(KILLS))
        assert followed >= kills_mid_archive, "every archiver that got going said it follows the hot store"
    finally:
        producer.kill()

    finish = run_tieredstore(["--output", "json", "run", "--once", "--no-demo"], env, timeout=120)
    assert finish.returncode == 0, f"seed {seed}: {finish.stderr}"
    assert "following " not in finish.stderr, "with the producer gone, --once owns the hot store"

    for name, value in settings.items():
        monkeypatch.setenv(name, str(value))
    hot, archived, problems = asyncio.run(archive_problems(load_config()))
    assert problems == [], f"seed {seed}"
    acks = producer.acknowledged()
    assert _unmatched_acks(acks) == [], f"seed {seed}"
    assert hot == archived >= len(acks) > 300, f"seed {seed}"
    assert producer.runs >= 1 + KILLS // PRODUCER_KILL_EVERY
    cuts = [
        event
        for n in range(KILLS)
        for line in (tmp_path / f"archiver-{n}.txt").read_text().splitlines()
        if line.startswith("{") and (event := json.loads(line))["event"] == "cold queue recovered"
    ]
    removed = sum(event["orphan_bytes_removed"] > 0 for event in cuts)
    abandoned = sum(event["orphan_bytes_abandoned"] > 0 for event in cuts)
    completed = sum(event["records_completed"] > 0 for event in cuts)
    print(
        f"figures crash-loop {backend}: {len(cuts)} restarts repaired what a kill left in a queue: "
        f"{completed} finished a commit cut short, {removed} removed orphan bytes, {abandoned} abandoned them"
    )
