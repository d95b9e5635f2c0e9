"""One line and a distinct exit code per error class; no traceback without --debug; every --help has an example."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.helpers import Node, invoke
from tests.cli.test_restore import TOPIC, archive, produce
from tieredstore.cli import app
from tieredstore.cli.app import _register_commands
from tieredstore.cli.common import run
from tieredstore.local.store import LocalMessageStore

ENTRY_POINT = str(Path(sys.executable).with_name("tieredstore"))


def one_line_error(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


def test_an_invalid_topic_is_a_usage_error(posix: Node) -> None:
    for args in (("read", "../x", "0", "--offset", "0"), ("put", "../x", "0"), ("restore", "a/b", "--to-dir", "x")):
        result = posix(*args, input="body\n")
        assert result.exit_code == 2, args
        assert "may only contain letters" in one_line_error(result.stderr)
    assert not (posix.data_dir / "hot" / "consumequeue" / ".." / "x").exists()


def test_missing_options_and_bad_values_are_usage_errors(posix: Node) -> None:
    assert posix("read", TOPIC, "0").exit_code == 2
    assert posix("segments", TOPIC, "0", "--type", "index").exit_code == 2
    assert posix("no-such-command").exit_code == 2
    assert posix("read", TOPIC, "-1", "--offset", "0").exit_code == 2


def test_unknown_things_are_not_found(posix: Node) -> None:
    produce(posix, 0, 3)
    archive(posix)
    for args in (("queues", "Nope"), ("segments", TOPIC, "5"), ("read", TOPIC, "5", "--offset", "0")):
        result = posix(*args)
        assert result.exit_code == 3, args
        one_line_error(result.stderr)
    assert posix("read", TOPIC, "0", "--offset", "0", "--tier", "cold", "--count", "1").exit_code == 0
    missing = invoke(["--data-dir", str(posix.data_dir / "typo"), "status"])
    assert missing.exit_code == 3 and "check --data-dir" in missing.stderr


def test_a_schema_from_another_version_is_exit_6(posix: Node) -> None:
    produce(posix, 0, 3)
    archive(posix)
    with sqlite3.connect(posix.data_dir / "metadata.db") as connection:
        connection.execute("UPDATE alembic_version SET version_num = 'f00dfeed'")
    for args in (("status",), ("verify",), ("read", TOPIC, "0", "--offset", "0")):
        result = posix(*args)
        assert result.exit_code == 6, (args, result.stderr)
        one_line_error(result.stderr)
    # The diagnostic command itself answers, saying what is wrong.
    current = posix("db", "current", output="json")
    assert current.exit_code == 0
    assert (current.json()["current"], current.json()["up_to_date"]) == ("f00dfeed", False)


def test_a_metadata_file_that_is_not_a_database_or_is_damaged_is_exit_5_and_left_as_it_was(posix: Node) -> None:
    produce(posix, 0, 3)
    archive(posix)
    database = posix.data_dir / "metadata.db"
    good = database.read_bytes()
    assert len(good) > 12288 and not database.with_name("metadata.db-wal").exists()
    damaged = bytearray(good)
    damaged[4096:12288] = bytes(range(256)) * 32  # the pages after the schema's: tables' rows
    commands = (
        ("status",),
        ("verify",),
        ("read", TOPIC, "0", "--offset", "0", "--tier", "cold"),
        ("run", "--once"),
        ("db", "current"),
        ("db", "upgrade"),
    )
    for content, reason in (
        (b"these are not the tables you are looking for\n" * 200, "file is not a database"),
        (bytes(damaged), "database disk image is malformed"),
    ):
        database.write_bytes(content)
        for args in commands:
            result = posix(*args)
            assert result.exit_code == 5, (args, result.stderr)
            line = one_line_error(result.stderr)
            assert f"is not a usable SQLite database ({reason})" in line, line
            assert database.read_bytes() == content, f"{args} rewrote the file"
    database.write_bytes(good)
    assert posix("verify").exit_code == 0


def test_unusable_directories_and_inverted_ranges_are_one_line_errors_that_write_nothing(
    posix: Node, tmp_path: Path
) -> None:
    produce(posix, 0, 3)
    archive(posix)
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    beside = Node("file-as-data-dir", a_file)
    for args in (("run", "--once"), ("put", TOPIC, "0")):
        result = beside(*args, input="body\n")
        assert result.exit_code == 7, (args, result.stderr)
        assert "not a directory" in one_line_error(result.stderr).lower()

    to_file = posix("restore", TOPIC, "--to-dir", str(a_file))
    assert to_file.exit_code == 2 and f"--to-dir {a_file} is not a directory" in one_line_error(to_file.stderr)
    into_file = posix("restore", TOPIC, "--to-store", str(a_file))
    assert into_file.exit_code == 7
    assert "the hot store's directory, is not a directory" in one_line_error(into_file.stderr)
    assert "tieredstore run" not in into_file.stderr  # the lock hint is for a store that is in use only
    unwritable = posix("restore", TOPIC, "--to-dir", "/proc/tieredstore-export")
    assert unwritable.exit_code == 4
    assert "cannot write /proc/tieredstore-export: No such file or directory" in one_line_error(unwritable.stderr)
    assert a_file.read_text() == "not a directory"

    with LocalMessageStore(tmp_path / "in-use"):
        locked = posix("restore", TOPIC, "--to-store", str(tmp_path / "in-use"))
    assert locked.exit_code == 7
    assert (
        "already open by another writer" in one_line_error(locked.stderr) and "stop `tieredstore run`" in locked.stderr
    )

    export = tmp_path / "export"
    for args in (("--from-offset", "2", "--to-offset", "1"), ("--since", "1h", "--until", "2h")):
        inverted = posix("restore", TOPIC, *args, "--to-dir", str(export))
        assert inverted.exit_code == 2, (args, inverted.stderr)
        assert "is after" in one_line_error(inverted.stderr)
    assert not export.exists()
    assert posix("restore", TOPIC, "--to-dir", str(export)).exit_code == 0
    assert len((export / TOPIC / "0.jsonl").read_text().splitlines()) == 3


def test_postgres_needs_db_upgrade_first(postgres_url: str, tmp_path: Path) -> None:
    node = Node("postgres", tmp_path, metadata_url=postgres_url)
    refused = node("topics")
    assert refused.exit_code == 6 and "db upgrade" in refused.stderr
    assert node("db", "upgrade").exit_code == 0
    current = node("db", "current", output="json").json()
    assert current["up_to_date"] is True and current["current"] == current["head"]
    assert node("topics", output="json").json() == {"title": "topics", "rows": []}


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_unreachable_s3_is_exit_4(tmp_path: Path) -> None:
    node = Node(
        "s3-closed",
        tmp_path,
        cold_url="s3://bucket/archive",
        env={
            "TIEREDSTORE_S3__ENDPOINT_URL": f"http://127.0.0.1:{_closed_port()}",
            "TIEREDSTORE_S3__REGION": "us-east-1",
            "TIEREDSTORE_S3__ACCESS_KEY_ID": "key",
            "TIEREDSTORE_S3__SECRET_ACCESS_KEY": "secret",
            "TIEREDSTORE_S3__MAX_ATTEMPTS": "1",
        },
    )
    tmp_path.mkdir(exist_ok=True)
    result = node("verify")
    assert result.exit_code == 4, result.stderr
    assert "secret" not in one_line_error(result.stderr)


def test_an_unreachable_fsspec_server_is_exit_4_in_one_line(posix: Node) -> None:
    produce(posix, 0, 3)
    archive(posix)
    cold = f"ftp://127.0.0.1:{_closed_port()}/archive"
    node = Node("ftp-closed", posix.data_dir, cold_url=cold)
    for args in (("read", TOPIC, "0", "--offset", "0", "--tier", "cold"), ("verify",)):
        result = node(*args)
        assert result.exit_code == 4, (args, result.stderr)
        assert f"connect {cold}: errno 111 (Connection refused)" in one_line_error(result.stderr)
    # The archiver logs each retry, then ends with the error line.
    run = node("run", "--once")
    assert run.exit_code == 4, run.stderr
    assert f"connect {cold}: errno 111 (Connection refused)" in run.stderr and "Traceback" not in run.stderr
    assert run.stderr.splitlines()[-1] == f"tieredstore: error: 1 queues could not be archived: {TOPIC}/0"


def test_a_metrics_address_that_cannot_be_served_is_a_config_error(posix: Node) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = posix("run", "--once", "--metrics-port", str(port))
    assert result.exit_code == 7, result.stderr
    assert result.stderr.splitlines()[-1] == (
        f"tieredstore: error: cannot serve metrics on 127.0.0.1:{port}: Address already in use"
    )
    assert "Traceback" not in result.stderr


def test_an_unreachable_metadata_database_is_exit_4_in_one_line(tmp_path: Path) -> None:
    port = _closed_port()
    url = f"postgresql+psycopg://postgres:hunter2@127.0.0.1:{port}/tieredstore?connect_timeout=2"
    node = Node("postgres-closed", tmp_path, metadata_url=url)
    for command in (("db", "upgrade"), ("db", "current"), ("status",), ("topics",), ("verify",), ("run", "--once")):
        result = node(*command)
        assert result.exit_code == 4, (command, result.stderr)
        line = one_line_error(result.stderr)
        assert f"metadata database postgresql+psycopg://postgres:***@127.0.0.1:{port}/tieredstore" in line, line
        assert "cannot be reached" in line and "Connection refused" in line, line
        assert "hunter2" not in line and "sqlalche.me" not in line, line


def test_debug_shows_the_traceback(posix: Node) -> None:
    with pytest.raises(Exception, match="may only contain"):
        posix("--debug", "read", "../x", "0", "--offset", "0")


def test_an_os_error_no_layer_types_is_one_line_and_its_traceback_needs_debug(
    posix: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(*_args: object, **_kwargs: object) -> None:
        raise PermissionError(13, "Permission denied", "/srv/tieredstore")

    monkeypatch.setattr("tieredstore.cli.inspect.open_read_node", refused)
    result = posix("status")
    assert result.exit_code == 1
    assert one_line_error(result.stderr) == "tieredstore: error: Permission denied: /srv/tieredstore"
    with pytest.raises(PermissionError):
        posix("--debug", "status")


def test_the_installed_entry_point_maps_exit_codes(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [ENTRY_POINT, "--data-dir", str(tmp_path), *args], capture_output=True, text=True, timeout=60, check=False
        )

    bad = run("read", "../x", "0", "--offset", "0")
    assert bad.returncode == 2
    assert bad.stderr.startswith("tieredstore: error: topic name '../x'") and bad.stderr.count("\n") == 1
    current = run("--output", "json", "db", "current")
    assert current.returncode == 0 and '"up_to_date"' in current.stdout


def test_ctrl_c_is_exit_130_not_success(posix: Node) -> None:
    """A restore or a watch stopped with Ctrl-C must not look to a script like one that finished."""
    produce(posix, 0, 3)
    for command in (
        ("tail", TOPIC, "0", "--follow", "--interval", "0.1"),
        ("-o", "json", "status", "--watch", "--interval", "0.1"),
    ):
        process = subprocess.Popen(
            [ENTRY_POINT, "--data-dir", str(posix.data_dir), *command],  # JSON: a text watch draws at its end
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},  # its first line arrives while it still runs
        )
        try:
            assert process.stdout is not None
            assert process.stdout.readline(), "the command printed nothing before the signal"
            process.send_signal(signal.SIGINT)
            _, stderr = process.communicate(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
        assert process.returncode == 130, (command, stderr)
        assert stderr.strip().splitlines()[-1] == "tieredstore: interrupted"


def test_ctrl_c_ends_the_command_even_when_the_step_it_interrupts_swallows_the_cancellation() -> None:
    """A poll that catches its cancellation and returns must not turn a Ctrl-C into a command that goes on."""
    polls_after_the_signal: list[str] = []

    async def poll() -> str:
        try:
            signal.raise_signal(signal.SIGINT)
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            polls_after_the_signal.append("cancelled")
        return "polled"

    with pytest.raises(KeyboardInterrupt):
        run(poll())
    assert polls_after_the_signal == ["cancelled"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the next Ctrl-C is Python's again


def test_every_command_documents_an_example() -> None:
    _register_commands()
    import click

    root = typer_command()
    names: list[list[str]] = []

    def walk(command: click.Command | object, path: list[str]) -> None:
        commands = getattr(command, "commands", None)
        if commands:
            for name, sub in commands.items():
                walk(sub, [*path, name])
        else:
            names.append(path)

    walk(root, [])
    assert {" ".join(n) for n in names} >= {
        "status",
        "topics",
        "queues",
        "segments",
        "read",
        "tail",
        "query-key",
        "offset-for-time",
        "verify",
        "restore",
        "retention",
        "topic set-retention",
        "topic delete",
        "db upgrade",
        "db current",
        "put",
        "run",
    }
    for path in names:
        result = invoke([*path, "--help"])
        assert result.exit_code == 0, path
        assert "Example" in result.stdout, path


def typer_command() -> object:
    import typer.main

    return typer.main.get_command(app)
