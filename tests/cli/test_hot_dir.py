"""``hot_dir`` / ``--hot-dir``: the archiver and the read commands pointed at a broker's storePathRootDir.

A follower and the readers never write into that directory: checked against a copy they cannot write
(as root a read-only tmpfs, or a chmod a-w copy and a child without the capabilities that let root
ignore permission bits; see tests/fixtures/unwritable.py), with every file's hash, size and mtime
compared, and every attempt of this process to write there recorded by an audit hook even where the
system refused it.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.archiver.processes import REPO, TIEREDSTORE, child_env
from tests.cli.helpers import CliResult, Node
from tests.fixtures.paths import ROCKETMQ_FIXTURES
from tests.fixtures.unwritable import UnwritableCopy, WriteAudit, left_untouched, tree_state, unwritable_copy
from tieredstore.config import load_config
from tieredstore.dispatcher import Dispatcher
from tieredstore.local import LocalMessageStore, LocalStoreConfig
from tieredstore.local.follower import HotStoreFollower
from tieredstore.runtime import open_runtime

TOPIC = "Orders"
COUNT = 40  # per queue
BROKER_FILES = {"abort": b"", "lock": b"", "config/topics.json": b'{"topicConfigTable": {}}'}


def broker_store(directory: Path, node: Node) -> Path:
    """A store in RocketMQ's layout as a running broker leaves it: commit log, consume queues, index,
    checkpoint, plus its ``abort``, ``lock`` and ``config/``."""
    config = LocalStoreConfig(
        commit_log_file_size=int(node.env["TIEREDSTORE_HOT__COMMIT_LOG_FILE_SIZE"]),
        consume_queue_units_per_file=int(node.env["TIEREDSTORE_HOT__CONSUME_QUEUE_UNITS_PER_FILE"]),
        max_message_size=int(node.env["TIEREDSTORE_HOT__MAX_MESSAGE_SIZE"]),
    )
    with LocalMessageStore(directory, config=config) as writer:
        for n in range(COUNT):
            for queue_id in (0, 1):
                writer.put_message(TOPIC, queue_id, f"order {queue_id}-{n}".encode() * 40, keys=[f"k-{queue_id}-{n}"])
    for name, content in BROKER_FILES.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_bytes(content)
    return directory


Cli = Callable[..., CliResult]


def cli_for(node: Node, copy: UnwritableCopy) -> Cli:
    """The CLI run by whoever must not write ``copy``: this process, or a confined child (see UnwritableCopy)."""
    confined = copy.confined
    if confined is None:
        return node

    def in_child(*args: str, input: str | None = None, output: str | None = None) -> CliResult:
        flags = [*node.flags, *(["--output", output] if output else [])]
        done = subprocess.run(
            [*confined, *TIEREDSTORE, *flags, *args],
            input=input.encode() if input is not None else None,
            env=child_env(node.env),
            cwd=REPO,
            capture_output=True,
            timeout=120,
            check=False,
        )
        return CliResult(done.returncode, done.stdout, done.stderr.decode("utf-8", "replace"))

    return in_child


# As root where mounting is allowed, both ways of making a copy unwritable: a read-only mount, and a
# confined child on a chmod a-w copy (what a root without the right to mount gets).
MECHANISMS = pytest.mark.parametrize("mount", [True, False], ids=["read-only-mount", "confined-child"])


async def _follower_pass_with_maintenance(node: Node, hot_dir: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    """One archiving pass and one maintenance pass (hot and cold retention, index upload) in follower mode."""
    for name, value in node.env.items():
        monkeypatch.setenv(name, value)
    config = load_config(
        data_dir=node.data_dir, hot_dir=hot_dir, cold_url=node.cold_url, metadata_url=node.metadata_url
    )
    async with open_runtime(config, recover=True, hot_mode="follower") as runtime:
        assert isinstance(runtime.hot, HotStoreFollower)
        dispatcher = Dispatcher.from_runtime(
            runtime, settings=config.archiver.model_copy(update={"group_commit_timeout": 0})
        )
        await dispatcher.start()
        await dispatcher.run_once()
        await dispatcher.maintain()
        await dispatcher.shutdown()
        return sum(state.archived_offset for state in dispatcher.status())


def test_follower_and_readers_leave_a_broker_store_they_cannot_write_exactly_as_it_was(
    node: Node, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = broker_store(tmp_path / "broker", node)
    with unwritable_copy(store, tmp_path / "mounted") as copy:
        hot_dir, cli = copy.root, cli_for(node, copy)
        hot = ["--hot-dir", str(hot_dir)]
        with left_untouched(hot_dir):
            archived = cli(*hot, "run", "--hot-mode", "follower", "--once", "--no-demo", output="json")
            assert archived.exit_code == 0, archived.stderr
            assert json.loads(archived.stdout.splitlines()[-1])["messages"] == 2 * COUNT
            status = cli(*hot, "status", output="json")
            assert status.exit_code == 0, status.stderr
            assert {(r["queue_id"], r["hot_max"], r["archived"], r["lag"]) for r in status.json()["rows"]} == {
                (0, COUNT, COUNT, 0),
                (1, COUNT, COUNT, 0),
            }
            read = cli(*hot, "read", TOPIC, "1", "--offset", "37", "-n", "10", "--tier", "hot", output="json")
            assert read.exit_code == 0, read.stderr
            assert [(m["queue_offset"], m["tier"]) for m in read.json_lines()] == [
                (37, "hot"),
                (38, "hot"),
                (39, "hot"),
            ]
            found = cli(*hot, "query-key", TOPIC, "k-0-12", output="json")
            assert found.exit_code == 0, found.stderr
            assert [(m["queue_id"], m["queue_offset"]) for m in found.json_lines()] == [(0, 12)]
            for command in (("queues", TOPIC), ("tail", TOPIC, "0", "-n", "3"), ("offset-for-time", TOPIC, "1", "now")):
                assert cli(*hot, *command).exit_code == 0, command
            archived_total = asyncio.run(_follower_pass_with_maintenance(node, hot_dir, monkeypatch))
            assert archived_total == 2 * COUNT
        # The instruments work: a writer is refused, and in this process its attempt is seen.
        before = tree_state(hot_dir)
        with WriteAudit(hot_dir) as control:
            refused = cli(*hot, "put", TOPIC, "0", input="refused\n")
        assert refused.exit_code != 0 and tree_state(hot_dir) == before
        if copy.confined is None:
            assert any(attempt.startswith("open ") and attempt.endswith("/lock") for attempt in control.attempts)


@MECHANISMS
def test_readers_of_a_rocketmq_written_store_leave_it_exactly_as_it_was(
    posix: Node, tmp_path: Path, mount: bool
) -> None:
    # Written by an independent RocketMQ store (see tests/fixtures/rocketmq/README.md); its checkpoint says
    # nothing is flushed yet, so the follower archives nothing and says why, but reads serve it.
    source = tmp_path / "rust-store"
    shutil.copytree(ROCKETMQ_FIXTURES / "rust-0.9.0-writer", source)
    posix.env["TIEREDSTORE_HOT__CONSUME_QUEUE_UNITS_PER_FILE"] = "10"
    posix.env["TIEREDSTORE_HOT__INDEX_SLOT_COUNT"] = "32"  # its index file's sizes
    posix.env["TIEREDSTORE_HOT__INDEX_MAX_ITEMS"] = "128"
    del posix.env["TIEREDSTORE_HOT__COMMIT_LOG_FILE_SIZE"]
    with unwritable_copy(source, tmp_path / "mounted", mount=mount) as copy, left_untouched(copy.root):
        hot, cli = ["--hot-dir", str(copy.root)], cli_for(posix, copy)
        archived = cli(*hot, "run", "--hot-mode", "follower", "--once", "--no-demo", output="json")
        assert archived.exit_code == 0, archived.stderr
        assert json.loads(archived.stdout.splitlines()[-1])["messages"] == 0
        read = cli(*hot, "read", "V1UpgradeTopic", "0", "--offset", "0", "-n", "10", "--tier", "hot", output="json")
        assert read.exit_code == 0, read.stderr
        assert [m["body"] for m in read.json_lines()] == ["v0.9.0-message-0", "v0.9.0-message-1"]
        found = cli(*hot, "query-key", "V1UpgradeTopic", "v1-upgrade-key", output="json")
        assert found.exit_code == 0, found.stderr
        assert ("v0.9.0-message-0", "hot") in [(m["body"], m["tier"]) for m in found.json_lines()]
        status = cli(*hot, "status", output="json")
        assert status.exit_code == 0, status.stderr
        assert [(r["topic"], r["hot_max"]) for r in status.json()["rows"]] == [("V1UpgradeTopic", 2)]


# ---- a --hot-dir that is not a store: one line, the documented code, nothing created -----------------


def _one_line_error(result_stderr: str) -> str:
    lines = [line for line in result_stderr.splitlines() if line.startswith("tieredstore: error:")]
    assert len(lines) == 1, result_stderr
    return lines[0]


@pytest.mark.parametrize(
    "command",
    [
        ("status",),
        ("read", TOPIC, "0", "--offset", "0"),
        ("query-key", TOPIC, "k"),
        ("run", "--once", "--no-demo"),
        ("run", "--hot-mode", "follower", "--no-demo", "--duration", "60"),
    ],
    ids=["status", "read", "query-key", "run-auto", "run-follower"],
)
def test_a_hot_dir_that_is_a_regular_file_is_refused_at_once_and_nothing_is_created(
    posix: Node, tmp_path: Path, command: tuple[str, ...]
) -> None:
    posix.data_dir.mkdir()
    not_a_store = tmp_path / "storePathRootDir"
    not_a_store.write_text("a file, not a directory")
    result = posix("--hot-dir", str(not_a_store), *command)
    assert result.exit_code == 7, result.stderr  # bad configuration, as README's table says
    assert "is not a directory" in _one_line_error(result.stderr)
    assert list(posix.data_dir.iterdir()) == [], "nothing created in the data directory"
    assert not_a_store.read_text() == "a file, not a directory"


@pytest.mark.parametrize("command", [("status",), ("read", TOPIC, "0", "--offset", "0"), ("query-key", TOPIC, "k")])
def test_readers_refuse_a_hot_dir_that_does_not_exist_or_is_not_a_store(
    posix: Node, tmp_path: Path, command: tuple[str, ...]
) -> None:
    posix.data_dir.mkdir()
    missing = tmp_path / "no-such-broker"
    result = posix("--hot-dir", str(missing), *command)
    assert result.exit_code == 3, result.stderr  # not found
    assert "does not exist" in _one_line_error(result.stderr)
    assert not missing.exists() and list(posix.data_dir.iterdir()) == []

    elsewhere = tmp_path / "home-dir"
    (elsewhere / "Documents").mkdir(parents=True)
    result = posix("--hot-dir", str(elsewhere), *command)
    assert result.exit_code == 7, result.stderr
    assert "holds no commitlog/ directory" in _one_line_error(result.stderr)
    assert [p.name for p in elsewhere.iterdir()] == ["Documents"] and list(posix.data_dir.iterdir()) == []


def test_an_empty_hot_dir_is_a_store_nothing_was_written_to_yet(posix: Node, tmp_path: Path) -> None:
    posix.data_dir.mkdir()
    empty = tmp_path / "broker-not-started"
    empty.mkdir()
    result = posix("--hot-dir", str(empty), "status", output="json")
    assert result.exit_code == 0, result.stderr
    assert result.json()["rows"] == []
    assert list(empty.iterdir()) == []


def test_hot_dir_from_the_environment_and_a_config_file_with_home_expanded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert load_config(data_dir=tmp_path / "d").hot_dir == tmp_path / "d" / "hot"
    assert not load_config(data_dir=tmp_path / "d").hot_dir_given
    monkeypatch.setenv("TIEREDSTORE_HOT_DIR", "~/rocketmq/store")
    from_env = load_config(data_dir=tmp_path / "d")
    assert from_env.hot_dir == Path.home() / "rocketmq" / "store" and from_env.hot_dir_given
    config_file = tmp_path / "tieredstore.toml"
    config_file.write_text('hot_dir = "/var/lib/rocketmq/store"\n')
    assert load_config(config_file, data_dir=tmp_path / "d").hot_dir == Path("~/rocketmq/store").expanduser()
    monkeypatch.delenv("TIEREDSTORE_HOT_DIR")
    assert load_config(config_file).hot_dir == Path("/var/lib/rocketmq/store")
    assert load_config(config_file, hot_dir=tmp_path / "flag").hot_dir == tmp_path / "flag"


def test_a_data_dir_inside_the_hot_dir_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    # tieredstore's own index/, database and cold files go into data_dir: never among a broker's files.
    store = tmp_path / "store"
    for data_dir in (store, store / "tieredstore"):
        result = Node("inside", data_dir)("--hot-dir", str(store), "status")
        assert result.exit_code == 7, result.stderr
        assert "must not be hot_dir" in _one_line_error(result.stderr)
    assert not store.exists()
