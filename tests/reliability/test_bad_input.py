"""Bad input at every door: config files, environment, URLs, topic names; a one-line typed error, nothing written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tieredstore.cli import main
from tieredstore.cli.app import EXIT_CONFIG, EXIT_USAGE
from tieredstore.config import load_config
from tieredstore.errors import ConfigError, InvalidTopicError
from tieredstore.flat import FlatFileStore
from tieredstore.local import LocalMessageStore, LocalStoreConfig, PutRequest
from tieredstore.metadata import MetadataStore
from tieredstore.providers.memory import MemoryProvider
from tieredstore.providers.registry import open_provider

ENTRY_POINT = Path(sys.executable).with_name("tieredstore")
BAD_TOPICS = {
    "dot-dot": "../etc",
    "nested-dot-dot": "a/../../b",
    "nul": "Topic\x00A",
    "200-chars": "T" * 200,
    "empty": "",
    "slash": "a/b",
    "trailing-newline": "Topic\n",
    "space": "my topic",
    "unicode": "тема",
}
BAD_CONFIG_FILES: dict[str, tuple[str | bytes, str]] = {
    "malformed-toml": ('data_dir = "d"\n[archiver\n', "is not valid TOML"),
    "unknown-top-level-key": ('colour = "blue"\n', "colour: unknown key"),
    "unknown-nested-key": ("[archiver]\ngroup_commit_cnt = 8\n", "archiver.group_commit_cnt: unknown key"),
    "negative-size": ("[hot]\nmax_message_size = -5\n", "hot.max_message_size"),
    "negative-segment-size": ("[segments]\ncommit_log_max_size = -1\n", "segments.commit_log_max_size"),
    "wrong-type": ('[archiver]\ngroup_commit_count = "many"\n', "archiver.group_commit_count"),
    "bad-enum": ('[read]\nread_policy = "SOMETIMES"\n', "read.read_policy"),
    "not-utf8": (b"data_dir = '\xff\xfe'\n", "is not valid TOML"),
    "topic-pattern-not-a-list": ('[archiver]\ntopics_exclude = "test-*"\n', "must be a list of glob patterns"),
    "topic-pattern-regex": ('[archiver]\ntopics_include = ["orders.*"]\n', "can never match a topic"),
    "topic-pattern-number": ("[archiver]\ntopics_exclude = [7]\n", "topics_exclude.0: Input should be a valid str"),
    "no-topic-included": ("[archiver]\ntopics_include = []\n", "at least 1 item"),
}
BAD_URLS = {
    "s3-without-bucket": ("cold_url", "s3:///prefix"),
    "s3-with-credentials": ("cold_url", "s3://AKIAEXAMPLE:hunter2@bucket/p"),
    "s3-unknown-parameter": ("cold_url", "s3://bucket/p?colour=blue"),
    "file-on-another-host": ("cold_url", "file://otherhost/data"),
    "unknown-scheme": ("cold_url", "nosuchscheme://x/y"),
    "mysql-metadata": ("metadata_url", "mysql://user@host/db"),
    "not-a-url-metadata": ("metadata_url", "::not a url::"),
}


def one_line(text: str) -> bool:
    return "\n" not in text.strip() and "Traceback" not in text


# ---- config ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", list(BAD_CONFIG_FILES), ids=list(BAD_CONFIG_FILES))
def test_bad_config_files_are_one_line_config_errors(tmp_path: Path, case: str) -> None:
    content, expected = BAD_CONFIG_FILES[case]
    path = tmp_path / "tieredstore.toml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ConfigError, match=expected) as refused:
        load_config(path)
    assert one_line(str(refused.value))


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("TIEREDSTORE_HOT__MAX_MESSAGE_SIZE", "-1", "hot.max_message_size"),
        ("TIEREDSTORE_ARCHIVER__GROUP_COMMIT_SIZE", "0", "archiver.group_commit_size"),
        ("TIEREDSTORE_READ__READ_AHEAD_CACHE_BYTES", "-4096", "read.read_ahead_cache_bytes"),
        ("TIEREDSTORE_ARCHIVER__START_FROM", "yesterday", "archiver.start_from"),
        ("TIEREDSTORE_ARCHIVER__TOPICS_EXCLUDE", "test-*", "a list is a JSON array"),
        ("TIEREDSTORE_ARCHIVER__TOPICS_INCLUDE", '["a b"]', "can never match a topic"),
    ],
)
def test_bad_environment_values_are_one_line_config_errors(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, expected: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=expected) as refused:
        load_config()
    assert one_line(str(refused.value))


def test_a_home_relative_path_in_a_file_or_variable_means_the_home_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "tieredstore.toml"
    path.write_text('data_dir = "~/tieredstore-data"\ncold_url = "~/archive"\n')
    config = load_config(path)
    assert config.data_dir == tmp_path / "home" / "tieredstore-data"
    assert config.effective_cold_url == str(tmp_path / "home" / "archive")
    assert config.effective_metadata_url == f"sqlite:///{tmp_path / 'home' / 'tieredstore-data' / 'metadata.db'}"
    monkeypatch.setenv("TIEREDSTORE_DATA_DIR", "~/elsewhere")
    assert load_config().data_dir == tmp_path / "home" / "elsewhere"
    assert load_config(cold_url="s3://bucket/~archive").cold_url == "s3://bucket/~archive"  # URLs as given
    with pytest.raises(ConfigError, match="cannot expand"):
        load_config(data_dir="~no-such-user-here/x")
    assert not (tmp_path / "~").exists()


def test_a_missing_config_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nowhere.toml")


@pytest.mark.parametrize("case", list(BAD_URLS), ids=list(BAD_URLS))
def test_bad_urls_are_config_errors_without_their_secrets(tmp_path: Path, case: str) -> None:
    field, url = BAD_URLS[case]
    config = load_config(data_dir=tmp_path, **{field: url})

    def open_it() -> object:
        if field == "cold_url":
            return open_provider(config.effective_cold_url)
        return MetadataStore.open(config.effective_metadata_url)

    with pytest.raises(ConfigError) as refused:
        open_it()
    assert one_line(str(refused.value))
    assert "hunter2" not in str(refused.value)


@pytest.mark.parametrize(
    "case", ["malformed-toml", "unknown-top-level-key", "negative-size", "topic-pattern-not-a-list"]
)
def test_the_cli_reports_bad_config_as_exit_7_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    path = tmp_path / "tieredstore.toml"
    content, expected = BAD_CONFIG_FILES[case]
    path.write_text(content if isinstance(content, str) else content.decode("latin-1"))
    assert main(["--config", str(path), "read", "Orders", "0", "--offset", "0"]) == EXIT_CONFIG
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("tieredstore: error: ") and expected in captured.err
    assert one_line(captured.err)


@pytest.mark.parametrize("case", list(BAD_URLS), ids=list(BAD_URLS))
def test_the_cli_reports_bad_urls_as_exit_7(tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str) -> None:
    data_dir = tmp_path / "data"
    store = LocalMessageStore(data_dir / "hot")
    store.close()
    MetadataStore.open(f"sqlite:///{data_dir / 'metadata.db'}").close()
    field, url = BAD_URLS[case]
    flag = "--cold-url" if field == "cold_url" else "--metadata-url"
    argv = ["--data-dir", str(data_dir), flag, url, "read", "Orders", "0", "--offset", "0", "--tier", "cold"]
    assert main(argv) == EXIT_CONFIG
    captured = capsys.readouterr()
    assert one_line(captured.err) and captured.err.startswith("tieredstore: error: ")
    assert "hunter2" not in captured.err + captured.out


# ---- topic names -------------------------------------------------------------------------------------


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("topic", list(BAD_TOPICS.values()), ids=list(BAD_TOPICS))
def test_bad_topics_are_refused_by_the_hot_store_and_nothing_is_written(tmp_path: Path, topic: str) -> None:
    root = tmp_path / "hot"
    with LocalMessageStore(root, config=LocalStoreConfig(commit_log_file_size=1 << 20, max_message_size=4096)) as store:
        before = tree(tmp_path)
        with pytest.raises(InvalidTopicError) as refused:
            store.put_message(topic, 0, b"must not land", keys=["k"])
        with pytest.raises(InvalidTopicError):
            store.put_messages([PutRequest("Good", 0, b"x"), PutRequest(topic, 0, b"y")])
        assert one_line(str(refused.value))
        assert store.queues() == []
        assert store.commitlog_max_offset == 0
        assert tree(tmp_path) == before


@pytest.mark.parametrize("topic", list(BAD_TOPICS.values()), ids=list(BAD_TOPICS))
async def test_bad_topics_are_refused_by_the_cold_store(sqlite_url: str, topic: str) -> None:
    provider = MemoryProvider("memory://bad-topics")
    try:
        with MetadataStore.open(sqlite_url) as metadata:
            store = FlatFileStore(provider, metadata, cluster="c", broker="b")
            with pytest.raises(InvalidTopicError):
                await store.get_or_create(topic, 0)
            assert metadata.list_topics() == []
    finally:
        MemoryProvider.wipe("bad-topics")


@pytest.mark.parametrize("topic", list(BAD_TOPICS.values()), ids=list(BAD_TOPICS))
@pytest.mark.parametrize("command", ["put", "read"])
def test_the_cli_refuses_bad_topics_with_exit_2_in_one_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    topic: str,
    command: str,
) -> None:
    monkeypatch.setattr(sys, "stdin", open(os.devnull))  # noqa: SIM115 - pytest closes it with the patch
    data_dir = tmp_path / "data"
    argv = ["--data-dir", str(data_dir), command, topic, "0"] + (["--offset", "0"] if command == "read" else [])
    assert main(argv) == EXIT_USAGE
    captured = capsys.readouterr()
    assert captured.err.startswith("tieredstore: error: topic name") and one_line(captured.err)
    assert not (data_dir / "hot" / "consumequeue").exists() or tree(data_dir / "hot" / "consumequeue") == set()


@pytest.mark.parametrize("topic", ["../etc", "T" * 200, ""], ids=["dot-dot", "200-chars", "empty"])
def test_the_installed_entry_point_refuses_bad_topics_without_a_traceback(tmp_path: Path, topic: str) -> None:
    result = subprocess.run(
        [str(ENTRY_POINT), "--data-dir", str(tmp_path / "data"), "put", topic, "0"],
        input=b"hello\n",
        capture_output=True,
        timeout=60,
        check=False,
    )
    stderr = result.stderr.decode()
    assert result.returncode == EXIT_USAGE, stderr
    assert stderr.startswith("tieredstore: error: topic name") and one_line(stderr)
    assert result.stdout == b""
