"""Running ``tieredstore`` and the test producer as child processes with a given environment."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TIEREDSTORE = [sys.executable, "-c", "from tieredstore.cli import run_main; run_main()"]


def child_env(values: dict[str, Any]) -> dict[str, str]:
    """The test process's environment (already free of the developer's TIEREDSTORE_*) plus ``values``."""
    env = dict(os.environ)
    env.update({k: str(v) for k, v in values.items()})
    env["PYTHONPATH"] = str(REPO)
    return env


def start_tieredstore(args: list[str], env: dict[str, str], stderr_path: Path) -> subprocess.Popen[bytes]:
    with stderr_path.open("wb") as stderr:
        return subprocess.Popen(
            [*TIEREDSTORE, *args], env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=stderr, start_new_session=True
        )


def run_tieredstore(args: list[str], env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*TIEREDSTORE, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False
    )


def run_producer(count: int, seed: int, env: dict[str, str]) -> None:
    subprocess.run(
        [sys.executable, "-m", "tests.archiver.producer", str(count), str(seed)],
        env=env,
        cwd=REPO,
        check=True,
        timeout=60,
    )


def wait_for_text(path: Path, text: str, timeout: float) -> str:
    """The file's content once it contains ``text``; AssertionError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        content = path.read_text(errors="replace") if path.exists() else ""
        if text in content:
            return content
        time.sleep(0.02)
    raise AssertionError(f"{text!r} did not appear in {path} within {timeout}s:\n{path.read_text(errors='replace')}")


def start_producer(seed: int, rate: float, env: dict[str, str], stdout_path: Path) -> subprocess.Popen[bytes]:
    """A producer putting until killed, about ``rate`` messages a second, its ACK lines going to ``stdout_path``."""
    with stdout_path.open("wb") as stdout:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.archiver.producer", "-1", str(seed), str(rate)],
            env=env,
            cwd=REPO,
            stdout=stdout,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )


def start_broker_writer(
    store_dir: Path, seconds: float, rate: float, retention: float, env: dict[str, str], stdout_path: Path
) -> subprocess.Popen[bytes]:
    """The broker-like writer (tests.archiver.broker_writer) putting into ``store_dir`` for ``seconds``, its
    event lines going to ``stdout_path`` and its log to ``stdout_path`` with the suffix ``.err``."""
    with stdout_path.open("wb") as stdout, stdout_path.with_suffix(".err").open("wb") as stderr:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.archiver.broker_writer",
                str(store_dir),
                str(seconds),
                str(rate),
                str(retention),
            ],
            env=env,
            cwd=REPO,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )


def scrape(url: str) -> str:
    """The body of an HTTP GET of ``url`` (a /metrics endpoint), as text."""
    with urllib.request.urlopen(url, timeout=5) as response:
        body: str = response.read().decode()
    return body
