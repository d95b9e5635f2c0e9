"""A framed archive read with a wrong or missing key, or with a changed byte, is an integrity error (exit 5,
one line), never garbage: on POSIX and S3 with SQLite and PostgreSQL."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.cli.framed import (
    DIAGONAL_PAIRS,
    KEY_ID,
    backend_node,
    codec_env,
    cold_objects,
    framed_node_on,
    produce_json,
    use_codec,
    write_keyring,
)
from tests.cli.helpers import CliResult, Node
from tests.cli.test_db_rebuild import drop_database
from tests.cli.test_framed_readers import INDEX_DIR, config_of
from tests.cli.test_restore import TOPIC, archive
from tieredstore.config import ReadPolicy
from tieredstore.errors import IntegrityError
from tieredstore.providers.codec import HEADER_SIZE
from tieredstore.store import TieredMessageStore

MESSAGES = 200
INTEGRITY_EXIT = 5


@pytest.fixture(params=DIAGONAL_PAIRS)
def framed_node(request: pytest.FixtureRequest, tmp_path: Path) -> Node:
    return framed_node_on(request.param, request, tmp_path)


def orders(result: CliResult) -> list[int]:
    return [json.loads(line["body"])["order"] for line in result.json_lines()]


def assert_one_line_integrity_error(result: CliResult, *words: str) -> None:
    assert result.exit_code == INTEGRITY_EXIT, (result.exit_code, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert all(word in lines[0] for word in words), lines[0]


def read_cold(node: Node, offset: int = 0, count: int = MESSAGES) -> CliResult:
    return node("read", TOPIC, "0", "--offset", str(offset), "--count", str(count), "--tier", "cold", output="json")


def test_a_keyring_without_the_key_or_with_other_material_under_its_id_is_an_integrity_error(
    framed_node: Node, tmp_path: Path
) -> None:
    node = framed_node
    produce_json(node, 0, MESSAGES)
    archive(node)
    assert orders(read_cold(node)) == list(range(MESSAGES))

    other = write_keyring(tmp_path / "other.toml", {"another-key": os.urandom(32)})
    use_codec(node, codec_env("zstd", other))
    missing = read_cold(node)
    assert_one_line_integrity_error(missing, repr(KEY_ID))
    assert missing.stdout == ""
    assert_one_line_integrity_error(node("restore", TOPIC, "--to-dir", str(tmp_path / "out")), repr(KEY_ID))
    assert_verify_names_the_key(node("verify", "--deep"))

    impostor = write_keyring(tmp_path / "impostor.toml", {KEY_ID: os.urandom(32)})
    use_codec(node, codec_env("zstd", impostor))
    wrong = read_cold(node)
    assert_one_line_integrity_error(wrong, repr(KEY_ID))
    assert wrong.stdout == ""
    assert_verify_names_the_key(node("verify", "--deep"))

    # The metadata lost too: a rebuild from cold storage refuses with the same one line and writes nothing,
    # so it runs again once the right keyring is back.
    drop_database(node, node.metadata_url or "")
    for keyring in (other, impostor):
        use_codec(node, codec_env("zstd", keyring))
        assert_one_line_integrity_error(node("db", "rebuild", "--from-cold"), repr(KEY_ID))
    use_codec(node, codec_env("zstd", tmp_path / "keyring.toml", KEY_ID))  # the node's own keyring
    rebuilt = node("db", "rebuild", "--from-cold", output="json")
    assert rebuilt.exit_code == 0, rebuilt.stderr
    assert orders(read_cold(node)) == list(range(MESSAGES))


def assert_verify_names_the_key(result: CliResult) -> None:
    """Sizes need no key, so verify walks on: each queue it cannot read is a READ_FAILED naming the key."""
    assert result.exit_code == INTEGRITY_EXIT, (result.exit_code, result.stderr)
    failed = [line for line in result.stdout.splitlines() if line.startswith("READ_FAILED")]
    assert failed and all(repr(KEY_ID) in line for line in failed), result.stdout
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr, result.stderr


def flip_inside_a_frame(node: Node, request: pytest.FixtureRequest, sizes: list[int]) -> tuple[str, int]:
    """Change one byte in the payload of a frame of a sealed commit-log segment past the first, where it is
    stored (file or object); return the segment's key and the queue offset of the first message the frame holds."""
    rows = node("segments", TOPIC, "0", "--type", "commit_log", output="json").json()["rows"]
    sealed = next(row for row in rows if row["status"] == "SEALED" and row["base_offset"] > 0)
    objects = cold_objects(node, request)
    chunk = objects.chunks(sealed["key"])[-1]
    data = bytearray(objects.read(chunk))
    data[HEADER_SIZE + (len(data) - HEADER_SIZE) // 2] ^= 0x10
    objects.write(chunk, bytes(data))
    start = sealed["base_offset"] + int(chunk.rsplit("/", 1)[1])
    # The cold commit log holds the queue's records (of ``sizes``) back to back: a record's place is the sum
    # of the sizes before it.
    return sealed["key"], next(n for n in range(MESSAGES) if sum(sizes[:n]) == start)


def assert_flip_is_found(node: Node, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    produce_json(node, 0, MESSAGES)
    archive(node)
    assert node("verify", "--deep").exit_code == 0
    expected = read_cold(node)
    sealed_key, first_changed = flip_inside_a_frame(node, request, [line["size"] for line in expected.json_lines()])
    assert first_changed > 0

    deep = node("verify", TOPIC, "--deep", output="json")
    assert deep.exit_code == INTEGRITY_EXIT, deep.stdout
    (problem,) = deep.json()["problems"]
    assert problem["kind"] == "CORRUPT_FRAME" and problem["queue_id"] == 0, problem
    assert problem["detail"].startswith(f"{sealed_key}: frame at "), problem

    read = read_cold(node, first_changed, 5)
    assert_one_line_integrity_error(read, TOPIC)
    assert read.stdout == ""
    # What lies before the changed frame still reads, and only what is right.
    before = read_cold(node, 0, first_changed)
    assert before.exit_code == 0, before.stderr
    assert orders(before) == orders(expected)[:first_changed] == list(range(first_changed))

    # The library: cold storage alone raises; beside a hot store that still holds them, the right messages
    # come from there (a failed cold read falls back to the other tier, with a warning).
    config = config_of(node, monkeypatch)
    with (
        TieredMessageStore(config, read_policy=ReadPolicy.FORCE, hot=False) as cold_only,
        pytest.raises(IntegrityError, match="frame at"),
    ):
        cold_only.get_messages(TOPIC, 0, first_changed, 5)
    with TieredMessageStore(config, read_policy=ReadPolicy.FORCE) as store:
        served = store.get_messages(TOPIC, 0, first_changed, 5).messages
    assert [(m.tier, json.loads(m.body)["order"]) for m in served] == [
        ("hot", n) for n in range(first_changed, first_changed + 5)
    ]


def test_a_flipped_byte_in_a_sealed_frame_is_found_by_verify_and_refused_by_read(
    framed_node: Node, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert_flip_is_found(framed_node, request, monkeypatch)


@pytest.mark.parametrize("pair", DIAGONAL_PAIRS)
def test_a_flipped_byte_in_a_compressed_only_frame_is_caught_by_its_checksum(
    pair: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = backend_node(pair, request, tmp_path / "node")
    use_codec(node, codec_env("zstd"))
    assert_flip_is_found(node, request, monkeypatch)


def test_a_flipped_byte_in_an_uploaded_key_index_file_is_found_by_deep_verify_and_query_key(
    framed_node: Node, request: pytest.FixtureRequest
) -> None:
    node = framed_node
    produce_json(node, 0, MESSAGES)
    archive(node)
    objects = cold_objects(node, request)
    index_files = sorted({key.rsplit("/", 1)[0] for key in objects.listed() if key.startswith(INDEX_DIR)})
    assert len(index_files) >= 3 and all(objects.is_framed(key) for key in index_files)
    assert node("verify", "--deep").exit_code == 0
    for index_file in index_files:
        chunk = objects.chunks(index_file)[-1]
        data = bytearray(objects.read(chunk))
        data[-1] ^= 0x01  # the GCM tag (or zstd's checksum): nothing but authentication covers it
        objects.write(chunk, bytes(data))

    assert node("verify").exit_code == 0  # sizes still agree: only reading the frames can tell
    deep = node("verify", "--deep", output="json")
    assert deep.exit_code == INTEGRITY_EXIT, deep.stdout
    problems = deep.json()["problems"]
    assert sorted((p["kind"], p["file_type"], p["location"]) for p in problems) == [
        ("CORRUPT_FRAME", "INDEX", key) for key in index_files
    ]
    node.hot_dir.rename(node.data_dir / "hot-away")  # the hot store's own key index would answer first
    assert_one_line_integrity_error(node("query-key", TOPIC, "order-0-7", output="json"), "fails authentication")
