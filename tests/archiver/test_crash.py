"""THE crash test: a producer process and an archiver process; the archiver is SIGKILLed at random moments.

After every kill the archiver is simply started again (sometimes after the producer added more). At
the end one ``run --once`` completes the archive, and the checker must find every hot message archived
exactly once, byte-identical but for PHYSICALOFFSET, at contiguous offsets — on POSIX and on S3 (moto
over HTTP, reached by the child processes through its endpoint).
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.archiver.processes import child_env, run_producer, run_tieredstore, start_tieredstore, wait_for_text
from tests.archiver.test_run import archive_problems
from tieredstore.config import load_config

KILLS = 20
PRODUCE_EVERY = 4  # the producer runs before every 4th archiver start
MESSAGES_PER_PRODUCER_RUN = 300


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
    }
    if backend == "posix":
        settings["TIEREDSTORE_COLD_URL"] = tmp_path / "cold"
    else:
        s3 = request.getfixturevalue("s3_server")
        settings["TIEREDSTORE_COLD_URL"] = request.getfixturevalue("s3_bucket_url")
        settings["TIEREDSTORE_S3__ENDPOINT_URL"] = s3.endpoint_url
        settings["TIEREDSTORE_S3__REGION"] = s3.region
        settings["TIEREDSTORE_S3__ACCESS_KEY_ID"] = s3.access_key_id
        settings["TIEREDSTORE_S3__SECRET_ACCESS_KEY"] = s3.secret_access_key
    return settings


@pytest.mark.slow
@pytest.mark.reliability
@pytest.mark.parametrize("backend", ["posix", "s3"])
def test_sigkilled_archiver_archives_every_message_exactly_once(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = _settings(tmp_path, backend, request)
    env = child_env(settings)
    rng = random.Random()
    seed = rng.randrange(1 << 30)
    rng.seed(seed)
    kills_mid_archive = 0
    for attempt in range(KILLS):
        if attempt % PRODUCE_EVERY == 0:
            run_producer(MESSAGES_PER_PRODUCER_RUN, seed=seed + attempt, env=env)
        stderr = tmp_path / f"archiver-{attempt}.txt"
        process = start_tieredstore(["run", "--no-demo"], env, stderr)
        try:
            if rng.random() < 0.25:
                time.sleep(rng.uniform(0.0, 1.2))  # anywhere from start-up and recovery on
            else:
                wait_for_text(stderr, "archiving ", timeout=30)
                time.sleep(rng.uniform(0.0, 0.5))  # in the middle of batches
                kills_mid_archive += 1
            assert process.poll() is None, f"archiver exited early (seed {seed}):\n{stderr.read_text()}"
            process.send_signal(signal.SIGKILL)
        finally:
            process.wait(timeout=10)
        assert process.returncode == -signal.SIGKILL

    finish = run_tieredstore(["--output", "json", "run", "--once", "--no-demo"], env, timeout=120)
    assert finish.returncode == 0, f"seed {seed}: {finish.stderr}"

    for name, value in settings.items():
        monkeypatch.setenv(name, str(value))
    hot, archived, problems = asyncio.run(archive_problems(load_config()))
    expected = MESSAGES_PER_PRODUCER_RUN * len(range(0, KILLS, PRODUCE_EVERY))
    assert problems == [], f"seed {seed}"
    assert hot == expected and archived == expected, f"seed {seed}"
    assert kills_mid_archive >= KILLS // 2
