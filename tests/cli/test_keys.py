"""Encryption keys: metadata records which key wraps each segment, ``keys list`` counts them, ``keys rotate``
re-wraps them without rewriting data, and an archiver whose keyring lacks one refuses to start.

Keys come from an environment variable of id=base64 pairs (``encryption.keyring_env``), as a deployment
passes them; every test archives zstd-compressed, encrypted segments on each backend pair.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from tests.cli.helpers import Node
from tests.cli.test_db_rebuild import UPLOAD_INDEX_AT_ONCE, drop_database
from tests.cli.test_restore import TOPIC, archive, produce
from tieredstore.cli.app import EXIT_CONFIG, EXIT_INTEGRITY
from tieredstore.config import TieredStoreConfig, load_config
from tieredstore.errors import ConfigError
from tieredstore.formats.naming import FileType, queue_path, segment_key
from tieredstore.store import AsyncTieredMessageStore

KEYS_VARIABLE = "TS_TEST_KEYRING"
MESSAGES = 150


def key(seed: int) -> str:
    return base64.b64encode(bytes([seed]) * 32).decode()


def use_keys(node: Node, active: str, **keys: str) -> None:
    """The node's keyring: ``keys`` (id = base64) through the environment, ``active`` wrapping new segments."""
    node.env.update(
        {
            "TIEREDSTORE_COLD__COMPRESSION": "zstd",
            "TIEREDSTORE_ENCRYPTION__KEYRING_ENV": KEYS_VARIABLE,
            "TIEREDSTORE_ENCRYPTION__ACTIVE_KEY": active,
            KEYS_VARIABLE: ",".join(f"{key_id}={material}" for key_id, material in keys.items()),
        }
    )


def metadata_url(node: Node) -> str:
    return node.metadata_url or f"sqlite:///{node.data_dir / 'metadata.db'}"


def key_ids(node: Node) -> dict[str, list[Any]]:
    """The key_id of every live segment row and uploaded index-file row, straight from the database."""
    engine = create_engine(metadata_url(node))
    try:
        with engine.connect() as connection:
            segments = connection.execute(
                text("SELECT key_id FROM segments WHERE status IN ('NEW', 'SEALED') ORDER BY path, base_offset")
            )
            index_files = connection.execute(text("SELECT key_id FROM index_files WHERE status = 'UPLOAD'"))
            return {"segments": [row[0] for row in segments], "index_files": [row[0] for row in index_files]}
    finally:
        engine.dispose()


def archived(node: Node) -> None:
    """Orders/0 and Orders/1 archived under the active key, several segments each, keys in uploaded index files."""
    node.env.update(UPLOAD_INDEX_AT_ONCE)
    produce(node, 0, MESSAGES)
    produce(node, 1, 40)
    archive(node)


def keys_listed(node: Node) -> dict[str, dict[str, Any]]:
    listed = node("keys", "list", output="json")
    assert listed.exit_code == 0, listed.stderr
    return {row.pop("key_id"): row for row in listed.json()["rows"]}


def one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


def test_every_encrypted_segment_records_its_key_keys_list_counts_them_and_a_wrong_key_is_refused(
    node: Node,
) -> None:
    use_keys(node, "k1", k1=key(1), k2=key(2))
    archived(node)
    recorded = key_ids(node)
    assert len(recorded["segments"]) >= 6 and set(recorded["segments"]) == {"k1"}, recorded
    assert recorded["index_files"] and set(recorded["index_files"]) == {"k1"}, recorded

    listed = keys_listed(node)
    assert listed == {
        "k1": {
            "active": True,
            "in_keyring": True,
            "segments": len(recorded["segments"]),
            "index_files": len(recorded["index_files"]),
        },
        "k2": {"active": False, "in_keyring": True, "segments": 0, "index_files": 0},
    }
    text_listing = node("keys", "list")
    assert text_listing.exit_code == 0, text_listing.stderr
    assert "k1" in text_listing.stdout and "k2" in text_listing.stdout
    for material in (key(1), key(2)):
        assert material not in text_listing.stdout + text_listing.stderr

    use_keys(node, "k1", k1=key(7), k2=key(2))  # the right id, other material
    read = node("read", TOPIC, "0", "--offset", "0", "--tier", "cold")
    assert read.exit_code == EXIT_INTEGRITY, (read.exit_code, read.stderr)
    line = one_error_line(read.stderr)
    assert "wrong key" in line and "k1" in line, line
    assert key(1) not in line and key(7) not in line


def test_rotate_refuses_an_unknown_key_rewraps_every_file_once_and_the_old_key_can_then_go(node: Node) -> None:
    use_keys(node, "k1", k1=key(1), k2=key(2))
    archived(node)
    before = key_ids(node)
    read_before = node("read", TOPIC, "0", "--offset", "0", "--tier", "cold", "--count", str(MESSAGES), output="json")
    assert read_before.exit_code == 0, read_before.stderr

    refused = node("keys", "rotate", "--to", "k9")
    assert refused.exit_code == EXIT_CONFIG, refused.stderr
    line = one_error_line(refused.stderr)
    assert "'k9' is not in the keyring (it holds k1, k2)" in line, line
    assert key_ids(node) == before

    use_keys(node, "k2", k1=key(1), k2=key(2))  # the documented order: the active key first
    rotated = node("keys", "rotate", output="json")
    assert rotated.exit_code == 0, rotated.stderr
    summary = rotated.json()
    assert (summary["key_id"], summary["segments"], summary["index_files"]) == (
        "k2",
        len(before["segments"]),
        len(before["index_files"]),
    )
    assert key_ids(node) == {key: ["k2"] * len(ids) for key, ids in before.items()}
    again = node("keys", "rotate")
    assert again.exit_code == 0, again.stderr
    assert "re-wrapped 0 segments and 0 index files under key k2" in again.stdout, again.stdout

    use_keys(node, "k2", k2=key(2))  # k1 retired: everything is readable and the archiver starts without it
    read_after = node("read", TOPIC, "0", "--offset", "0", "--tier", "cold", "--count", str(MESSAGES), output="json")
    assert read_after.exit_code == 0, read_after.stderr
    assert read_after.stdout == read_before.stdout
    assert node("verify", "--deep").exit_code == 0
    produce(node, 0, 10)
    archive(node)
    assert keys_listed(node)["k2"]["segments"] >= len(before["segments"])
    assert "k1" not in keys_listed(node)


async def archive_in_process(node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    """Open the library's store as an in-process archiver (``owns_cold``) with the node's settings."""
    for name, value in node.env.items():
        monkeypatch.setenv(name, value)
    flags = {"data_dir": node.data_dir, "cold_url": node.cold_url, "metadata_url": node.metadata_url}
    async with AsyncTieredMessageStore.open(load_config(None, **flags), owns_cold=True):
        pass


def test_the_archiver_refuses_to_start_when_the_keyring_lacks_a_key_still_in_use(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_keys(node, "k1", k1=key(1))
    archived(node)
    segments = len(key_ids(node)["segments"])
    use_keys(node, "k2", k2=key(2))
    produce(node, 0, 5)
    refused = node("run", "--once")
    assert refused.exit_code == EXIT_CONFIG, refused.stderr
    line = one_error_line(refused.stderr)
    assert f"lacks key k1, which wraps {segments} live segments" in line, line
    defaults = TieredStoreConfig()
    first = segment_key(queue_path(defaults.cluster, defaults.broker, TOPIC, 0), FileType.COMMIT_LOG, 0)
    assert first in line and "more" in line, line
    assert key(1) not in line and key(2) not in line
    listed = keys_listed(node)
    assert listed["k1"]["in_keyring"] is False and listed["k1"]["segments"] == segments
    with pytest.raises(ConfigError) as caught:
        asyncio.run(archive_in_process(node, monkeypatch))
    assert str(caught.value) == line.removeprefix("tieredstore: error: ")
    stuck = node("keys", "rotate")  # nothing can re-wrap a data key whose wrapping key is gone
    assert stuck.exit_code == EXIT_INTEGRITY, stuck.stderr
    assert "which the keyring does not hold" in one_error_line(stuck.stderr), stuck.stderr


def test_a_rebuild_from_cold_reads_each_segments_key_from_its_descriptor(node: Node) -> None:
    use_keys(node, "k1", k1=key(1), k2=key(2))
    archived(node)
    use_keys(node, "k2", k1=key(1), k2=key(2))
    produce(node, 0, 60)  # new segments under k2 beside the old ones under k1
    archive(node)
    before = key_ids(node)
    assert set(before["segments"]) == {"k1", "k2"}, before
    drop_database(node, metadata_url(node))
    rebuilt = node("db", "rebuild", "--from-cold", "--no-progress")
    assert rebuilt.exit_code == 0, rebuilt.stderr
    after = key_ids(node)
    assert sorted(map(str, after["segments"])) == sorted(map(str, before["segments"]))
    assert sorted(map(str, after["index_files"])) == sorted(map(str, before["index_files"]))
    assert keys_listed(node) == {
        key_id: {
            "active": key_id == "k2",
            "in_keyring": True,
            "segments": before["segments"].count(key_id),
            "index_files": before["index_files"].count(key_id),
        }
        for key_id in ("k1", "k2")
    }
