"""The real services a benchmark starts for itself: a moto S3 server in its own process, a fresh PostgreSQL database.

The moto server runs as ``python -m moto.server`` in a child process, so its request handling competes
for the CPUs like a remote endpoint's network stack would not, but never shares our GIL.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

import psutil

MOTO_START_TIMEOUT_S = 30.0
MOTO_STOP_TIMEOUT_S = 5.0
S3_REGION = "us-east-1"
# moto accepts any credentials; these keep a developer's real AWS configuration out of the benchmark.
S3_CREDENTIALS = {"aws_access_key_id": "benchmark", "aws_secret_access_key": "benchmark"}

POSTGRES_HOST = "127.0.0.1"
POSTGRES_PORT = 5432
POSTGRES_USER = "postgres"
POSTGRES_ADMIN_DB = "postgres"


class ServiceError(RuntimeError):
    """A service the benchmark needs could not be started or reached."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class MotoServer:
    """``with MotoServer(log_dir) as s3: s3.endpoint_url`` — a moto S3 server in a child process, killed on exit."""

    def __init__(self, log_dir: Path) -> None:
        self.log_path = log_dir / "moto-server.log"
        self.port = free_port()
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        if self._process is None:
            raise ServiceError("the moto server is not running")
        return self._process.pid

    def __enter__(self) -> MotoServer:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            self._wait_until_answering()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _wait_until_answering(self) -> None:
        deadline = time.monotonic() + MOTO_START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                raise ServiceError(
                    f"the moto server exited with {self._process.returncode} at start-up: {self._log_tail()}"
                )
            try:
                with urllib.request.urlopen(f"{self.endpoint_url}/", timeout=1) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                time.sleep(0.1)
        raise ServiceError(f"the moto server did not answer on {self.endpoint_url} within {MOTO_START_TIMEOUT_S} s")

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")[-2000:]
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        # The server keeps everything in memory and nothing reads its state afterwards: a graceful shutdown
        # (about a second, waiting out its serve loop) buys nothing.
        process.kill()
        process.wait(MOTO_STOP_TIMEOUT_S)

    def client_options(self) -> dict[str, Any]:
        """Keyword arguments for a boto3 / aiobotocore S3 client talking to this server."""
        return {"endpoint_url": self.endpoint_url, "region_name": S3_REGION, **S3_CREDENTIALS}

    def create_bucket(self, name: str) -> str:
        import boto3

        boto3.client("s3", **self.client_options()).create_bucket(Bucket=name)
        return name

    def process_tree_pids(self) -> set[int]:
        """The server's pid and its descendants, to leave them out of our own RSS figures."""
        try:
            root = psutil.Process(self.pid)
            return {root.pid, *(child.pid for child in root.children(recursive=True))}
        except psutil.NoSuchProcess:
            return set()


def _postgres_admin() -> Any:
    import psycopg

    try:
        return psycopg.connect(
            host=POSTGRES_HOST,
            port=POSTGRES_PORT,
            user=POSTGRES_USER,
            dbname=POSTGRES_ADMIN_DB,
            connect_timeout=5,
            autocommit=True,
        )
    except psycopg.OperationalError as exc:
        raise ServiceError(
            f"PostgreSQL is needed by this benchmark but {POSTGRES_USER}@{POSTGRES_HOST}:{POSTGRES_PORT} "
            f"cannot be reached ({exc})"
        ) from exc


@contextmanager
def fresh_postgres_database(prefix: str = "tieredstore_bench") -> Iterator[str]:
    """A SQLAlchemy URL of a new, uniquely named database on the local server, dropped afterwards."""
    from psycopg import sql

    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with _postgres_admin() as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield f"postgresql+psycopg://{POSTGRES_USER}@{POSTGRES_HOST}:{POSTGRES_PORT}/{name}"
    finally:
        with _postgres_admin() as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def postgres_server_version() -> str:
    with _postgres_admin() as admin:
        row = admin.execute("SHOW server_version").fetchone()
        return str(row[0]) if row else "unknown"
