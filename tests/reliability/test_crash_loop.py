"""Crash loop: a producer process and a follower archiver process, each SIGKILLed over and over and restarted.

The producer owns the hot store and puts continuously with ``flush_mode = sync``, printing an ACK
line for every put that returned. The archiver follows the hot store read-only (``run --hot-mode
follower``) on a POSIX cold tier. Kills of the two come in random order at random moments (during
start-up and recovery, in the middle of batches, while the other is restarting). Every few archiver
kills, with the archiver down, the archive so far is checked against the hot copy (a restart's
recovery first, as the next archiver would run it): exactly once, byte-identical but for
PHYSICALOFFSET, contiguous, and further along than at the previous check. At the end the producer
stops, one ``run --once`` finishes, every acknowledged put must be archived exactly once, and
``verify --deep`` (its own process) must find every archived record whole.

The loop runs twice: as it is, and with the cold tier compressed and encrypted (``[cold] compression =
"zstd"`` and an ``[encryption]`` keyring, from a config file in the test's directory), where a kill can
also land between a segment's ``.codec`` descriptor and its first frame, and every restart must read
the frames its killed predecessor sealed.

Scaled (see ``archiver_run.py``): 50 kills of each by default, 100 of each at full scale; the
compressed and encrypted run 20 of each (50 at full scale).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.archiver.processes import child_env, run_tieredstore, start_producer, start_tieredstore, wait_for_text
from tests.archiver.test_crash import Producer, _settings, _unmatched_acks
from tests.reliability.archiver_run import FULL_SCALE, archive_state
from tests.reliability.figures import save_figure
from tieredstore.config import load_config
from tieredstore.providers.chunks import parse_chunk_name
from tieredstore.providers.codec import DESCRIPTOR_NAME, read_header
from tieredstore.runtime import open_hot_store

pytestmark = [pytest.mark.reliability, pytest.mark.slow, pytest.mark.timeout(1800 if FULL_SCALE else 300)]

KILLS_EACH = 100 if FULL_SCALE else 50
# Fewer for the compressed and encrypted run, to stay in the suite's time; still mostly mid-archive kills.
FRAMED_KILLS_EACH = 50 if FULL_SCALE else 20
ACTIVE_KEY = "crash-loop-2"
CHECK_EVERY = 10  # archiver kills between two checks of the archive


class SyncProducer(Producer):
    """The crash test's producer, every run with ``flush_mode = sync``: an ACK means the put is on disk."""

    def start(self) -> None:
        env = dict(self.env, TIEREDSTORE_HOT__FLUSH_MODE="sync")
        self.process = start_producer(self.seed + self.runs, self.rate, env, self.tmp_path / f"acks-{self.runs}.txt")
        self.runs += 1


def framed_config(tmp_path: Path) -> Path:
    """A config file compressing and encrypting every new cold segment, with its keyring file beside it."""
    keyring = tmp_path / "keyring.toml"
    keys = {name: base64.b64encode(os.urandom(32)).decode() for name in ("crash-loop-1", ACTIVE_KEY)}
    keyring.write_text("[keys]\n" + "".join(f'{name} = "{key}"\n' for name, key in keys.items()))
    config = tmp_path / "tieredstore.toml"
    config.write_text(
        f'[cold]\ncompression = "zstd"\n\n[encryption]\nkeyring_file = "{keyring}"\nactive_key = "{ACTIVE_KEY}"\n'
    )
    return config


def framed_segments(cold: Path) -> tuple[int, int]:
    """(segments, frames) of the cold tier, asserting that every segment is a folder of encrypted zstd
    frames under the active key: nothing was written plain, not even by a run cut short."""
    segments = frames = 0
    for descriptor in cold.rglob(DESCRIPTOR_NAME):
        segments += 1
        assert json.loads(descriptor.read_bytes())["encryption"]["key_id"] == ACTIVE_KEY
        for chunk in descriptor.parent.iterdir():
            if parse_chunk_name(chunk.name) is not None:
                flags = read_header(chunk.read_bytes(), str(chunk))[1]
                assert flags == 3, f"{chunk}: frame flags {flags}, not zstd and AES-GCM"
                frames += 1
    type_folders = {p.parent for p in cold.rglob("*") if p.parent.name in ("COMMIT_LOG", "CONSUME_QUEUE", "INDEX")}
    plain = [p for folder in type_folders for p in folder.iterdir() if not (p / DESCRIPTOR_NAME).exists()]
    assert plain == [], f"segments without a codec descriptor: {plain}"
    return segments, frames


@pytest.mark.parametrize("codecs", ["plain", "zstd-aes"])
def test_archiver_and_producer_sigkilled_in_a_loop_archive_every_acknowledged_put_once(
    tmp_path: Path,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    codecs: str,
) -> None:
    settings = _settings(tmp_path, "posix", request)
    kills_each = KILLS_EACH
    if codecs == "zstd-aes":
        # The config file the children and this process read; the keyring file sits in the test's directory.
        settings["TIEREDSTORE_CONFIG"] = framed_config(tmp_path)
        kills_each = FRAMED_KILLS_EACH
    env = child_env(settings)
    for name, value in settings.items():
        monkeypatch.setenv(name, str(value))
    config = load_config()
    rng = random.Random()
    seed = rng.randrange(1 << 30)
    rng.seed(seed)
    started = time.monotonic()
    producer = SyncProducer(tmp_path, env, seed, rate=150.0)
    producer.start()
    wait_for_text(tmp_path / "acks-0.txt", "ACK ", timeout=30)
    victims = ["archiver"] * kills_each + ["producer"] * kills_each
    rng.shuffle(victims)
    archiver_runs = 0
    archiver: subprocess.Popen[bytes] | None = None
    kills_mid_archive = 0
    checks: list[int] = []
    # (seconds since the start, victim) per kill and (seconds, messages archived) per check, for the plot
    kill_times: list[tuple[float, str]] = []
    check_times: list[tuple[float, int]] = []

    def start_archiver() -> tuple[subprocess.Popen[bytes], Path]:
        nonlocal archiver_runs
        stderr = tmp_path / f"archiver-{archiver_runs}.txt"
        archiver_runs += 1
        return start_tieredstore(["run", "--no-demo", "--hot-mode", "follower"], env, stderr), stderr

    try:
        archiver, stderr = start_archiver()
        for victim in victims:
            if victim == "producer":
                time.sleep(rng.uniform(0.0, 0.8))
                producer.kill()
                kill_times.append((round(time.monotonic() - started, 3), "producer"))
                producer.start()
                continue
            if rng.random() < 0.25:
                time.sleep(rng.uniform(0.0, 1.0))  # anywhere from start-up and recovery on
            else:
                wait_for_text(stderr, "archiving ", timeout=30)
                time.sleep(rng.uniform(0.0, 0.6))  # in the middle of batches
                kills_mid_archive += 1
            assert archiver.poll() is None, f"archiver exited early (seed {seed}):\n{stderr.read_text()}"
            archiver.send_signal(signal.SIGKILL)
            archiver.wait(timeout=10)
            assert archiver.returncode == -signal.SIGKILL
            kill_times.append((round(time.monotonic() - started, 3), "archiver"))
            if archiver_runs % CHECK_EVERY == 0:
                archived, problems = asyncio.run(archive_state(config, follow=True))
                assert problems == [], f"seed {seed}, after {archiver_runs} archiver kills"
                total = sum(archived.values())
                assert not checks or total > checks[-1], f"seed {seed}: no progress since the last check"
                checks.append(total)
                check_times.append((round(time.monotonic() - started, 3), total))
            archiver, stderr = start_archiver()
        archiver.send_signal(signal.SIGKILL)
        archiver.wait(timeout=10)
    finally:
        if archiver is not None and archiver.poll() is None:
            archiver.kill()
            archiver.wait(timeout=10)
        if producer.process is not None and producer.process.poll() is None:
            producer.kill()

    finish = run_tieredstore(["--output", "json", "run", "--once", "--no-demo"], env, timeout=120)
    assert finish.returncode == 0, f"seed {seed}: {finish.stderr}"
    archived, problems = asyncio.run(archive_state(config, follow=False))
    assert problems == [], f"seed {seed}"
    acks = producer.acknowledged()
    assert _unmatched_acks(acks) == [], f"seed {seed}"
    with open_hot_store(config) as hot:
        hot_max = {(topic, queue_id): hot.max_offset(topic, queue_id) for topic, queue_id in hot.queues()}
    assert archived == hot_max, f"seed {seed}"  # per queue: everything the hot store holds is archived
    assert all(offset < archived[(topic, queue_id)] for topic, queue_id, offset in acks)
    assert producer.runs == 1 + kills_each and archiver_runs == 1 + kills_each
    assert kills_mid_archive >= kills_each // 2 and len(checks) == kills_each // CHECK_EVERY
    deep = run_tieredstore(["--output", "json", "verify", "--deep"], env, timeout=120)
    assert deep.returncode == 0, f"seed {seed}: {deep.stderr}"
    report = json.loads(deep.stdout)
    assert report["problems"] == [] and report["records"] == sum(archived.values()), f"seed {seed}: {report}"
    framed = ""
    if codecs == "zstd-aes":
        segments, frames = framed_segments(tmp_path / "cold")
        assert segments and frames
        framed = f", {segments} segments of {frames} zstd + AES-GCM frames"
    else:
        save_figure(
            "crash-loop",
            {"seed": seed, "kills": kill_times, "checks": check_times, "acknowledged": len(acks),
             "archived": sum(archived.values()), "seconds": round(time.monotonic() - started, 3)},
        )  # fmt: skip
    with capsys.disabled():
        print(
            f"\nfigures crash-loop ({codecs}): seed {seed}, {kills_each} archiver + {kills_each} producer SIGKILLs "
            f"in {time.monotonic() - started:.0f}s ({kills_mid_archive} mid-archive), {len(checks)} checks "
            f"(archived {checks}), {len(acks):,} acknowledged puts, {sum(archived.values()):,} messages "
            f"archived exactly once, 0 problems, verify --deep clean{framed}"
        )
