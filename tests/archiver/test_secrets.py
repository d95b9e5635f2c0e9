"""Credentials never leave the archiver: not in /metrics, not in its logs, not in what the CLI prints.

The archiver runs as a user deploys it (S3 over HTTP on the moto server, PostgreSQL metadata) with a
recognisable S3 secret key, a database password in its metadata URL (the server's trust auth
accepts any password) and an encryption key from an environment variable, at the most talkative settings
the CLI has (``--debug --log-json``). Every byte it serves on /metrics and writes to stderr is then searched
for all of them, the key both as the base64 text it was given as and as its raw bytes (printable, so that
a raw copy shows in text). So is what ``status`` and ``keys list`` and ``keys rotate`` print, every row of
the metadata database, the one-line error a user gets when the database with that password in its URL
cannot be reached, and the one a read gets from a wrong key under the same id.
"""

from __future__ import annotations

import base64
import json
import re
import signal
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, text

from tests.archiver.processes import child_env, run_tieredstore, scrape, start_tieredstore, wait_for_text
from tests.fixtures.s3 import S3Server
from tieredstore.cli.app import EXIT_INTEGRITY, EXIT_STORAGE

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

SECRET_KEY = "SecretKeySentinel-7f3a9c"
PASSWORD = "DbPasswordSentinel-41d2e8"
KEY_BYTES = b"RawKeyBytesSentinel-5c07e1b93a4d"  # 32 bytes, an AES-256 key
OTHER_KEY_BYTES = b"OtherKeyBytesSentinel-8e2f6a0d7b"
KEY_TEXTS = [
    text
    for raw in (KEY_BYTES, OTHER_KEY_BYTES)
    for text in (base64.b64encode(raw).decode(), raw.decode(), raw.hex(), repr(raw))
]
KEYRING_VARIABLE = "TS_SECRETS_KEYRING"
MESSAGES = 300


def _with_password(url: str) -> str:
    """``postgresql+psycopg://postgres@host/db`` with PASSWORD put in after the user."""
    with_password, replaced = re.subn(r"://([^@/:]+)@", rf"://\1:{PASSWORD}@", url, count=1)
    assert replaced == 1, url
    return with_password


def _environment(data_dir: Path, s3_server: S3Server, bucket: str, metadata_url: str) -> dict[str, str]:
    return child_env(
        {
            "TIEREDSTORE_DATA_DIR": data_dir,
            "TIEREDSTORE_COLD_URL": f"s3://{bucket}/archive",
            "TIEREDSTORE_METADATA_URL": metadata_url,
            "TIEREDSTORE_S3__ENDPOINT_URL": s3_server.endpoint_url,
            "TIEREDSTORE_S3__REGION": s3_server.region,
            "TIEREDSTORE_S3__ACCESS_KEY_ID": s3_server.access_key_id,
            "TIEREDSTORE_S3__SECRET_ACCESS_KEY": SECRET_KEY,
            "TIEREDSTORE_ENCRYPTION__KEYRING_ENV": KEYRING_VARIABLE,
            "TIEREDSTORE_ENCRYPTION__ACTIVE_KEY": "k1",
            KEYRING_VARIABLE: f"k1={base64.b64encode(KEY_BYTES).decode()}",
        }
    )


def _leaks(text: str) -> list[str]:
    return [secret for secret in (SECRET_KEY, PASSWORD, *KEY_TEXTS) if secret in text]


def _rows(url: str) -> str:
    """Every row of every table of the metadata database, as text."""
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            tables = inspect(connection).get_table_names()
            return "\n".join(
                repr(tuple(row)) for table in tables for row in connection.execute(text(f'SELECT * FROM "{table}"'))
            )
    finally:
        engine.dispose()


def _dispatched(body: str) -> float:
    return sum(float(v) for v in re.findall(r"^tieredstore_dispatched_messages_total\{[^}]*\} (\S+)$", body, re.M))


def test_no_credential_reaches_metrics_logs_or_status(
    tmp_path: Path, s3_server: S3Server, s3_bucket: str, postgres_url: str
) -> None:
    env = _environment(tmp_path / "data", s3_server, s3_bucket, _with_password(postgres_url))
    upgrade = run_tieredstore(["db", "upgrade"], env)
    assert upgrade.returncode == 0, upgrade.stderr
    assert _leaks(upgrade.stdout + upgrade.stderr) == [], "a credential is in what db upgrade prints"
    stderr = tmp_path / "stderr.txt"
    process = start_tieredstore(
        [
            "--debug",
            "--log-json",
            "run",
            "--demo",
            "--demo-messages",
            str(MESSAGES),
            "--metrics-port",
            "0",
            "--duration",
            "30",
        ],
        env,
        stderr,
    )
    try:
        text = wait_for_text(stderr, "/metrics", timeout=60)
        match = re.search(r"http://127\.0\.0\.1:\d+/metrics", text)
        assert match, text
        deadline = time.monotonic() + 30
        body = scrape(match.group(0))
        while _dispatched(body) < MESSAGES and time.monotonic() < deadline:
            time.sleep(0.3)
            body = scrape(match.group(0))
        # The archiver really ran against S3 and PostgreSQL with these credentials.
        assert _dispatched(body) == MESSAGES, body
        assert _leaks(body) == [], "a credential is in /metrics"
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=60)
    assert process.returncode == 0, stderr.read_text()
    logs = stderr.read_text()
    # The run names its metadata database, with the password masked, and logged its work.
    assert re.search(r"metadata: postgresql\+psycopg://postgres:\*\*\*@", logs), logs
    assert '"event": "archiving a new queue"' in logs, logs
    assert _leaks(logs) == [], "a credential is in the archiver's logs"

    status = run_tieredstore(["--debug", "-o", "json", "status"], env)
    assert status.returncode == 0, status.stderr
    rows = json.loads(status.stdout)["rows"]
    assert sum(row["archived"] for row in rows) == MESSAGES, rows
    assert _leaks(status.stdout + status.stderr) == [], "a credential is in what status prints"

    keys = run_tieredstore(["--debug", "-o", "json", "keys", "list"], env)
    assert keys.returncode == 0, keys.stderr
    (listed,) = json.loads(keys.stdout)["rows"]
    assert (listed["key_id"], listed["active"]) == ("k1", True) and listed["segments"] > 0, listed  # really encrypted
    for output in ("text", "json"):
        for command in (["keys", "list"], ["keys", "rotate", "--progress"]):
            shown = run_tieredstore(["--debug", "-o", output, *command], env)
            assert shown.returncode == 0, shown.stderr
            assert _leaks(shown.stdout + shown.stderr) == [], f"a key is in what {' '.join(command)} prints"
    assert _leaks(_rows(postgres_url)) == [], "a key or credential is in a metadata row"

    wrong = dict(env, **{KEYRING_VARIABLE: f"k1={base64.b64encode(OTHER_KEY_BYTES).decode()}"})
    read = run_tieredstore(["read", "DemoOrders", "0", "--offset", "0", "--tier", "cold"], wrong)
    assert read.returncode == EXIT_INTEGRITY, (read.returncode, read.stderr)
    assert "wrong key" in read.stderr and _leaks(read.stdout + read.stderr) == [], read.stderr


def test_an_unreachable_database_is_named_without_its_password(tmp_path: Path) -> None:
    url = f"postgresql+psycopg://postgres:{PASSWORD}@127.0.0.1:1/tieredstore?connect_timeout=2"
    result = run_tieredstore(
        ["--data-dir", str(tmp_path / "data"), "--metadata-url", url, "status"], child_env({}), timeout=60
    )
    assert result.returncode == EXIT_STORAGE, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "127.0.0.1" in lines[0], lines[0]
    assert _leaks(result.stdout + result.stderr) == [], lines[0]
