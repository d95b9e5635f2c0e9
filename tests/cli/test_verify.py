"""verify: a clean archive passes; a missing object, an orphan object and a flipped bit are each found and located."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.cli.helpers import Node
from tests.cli.test_restore import TOPIC, archive, produce
from tieredstore.formats.naming import cluster_folder, segment_name

BROKER_PATH = f"{cluster_folder('DefaultCluster')}/broker-a"


def segment_files(node: Node, kind: str) -> list[Path]:
    return sorted((node.data_dir / "cold" / BROKER_PATH / TOPIC / "0" / kind).iterdir())


def archived(node: Node) -> None:
    produce(node, 0, 200)
    archive(node)
    result = node("verify", output="json")
    assert result.exit_code == 0, result.stdout
    assert result.json()["ok"] is True


def test_a_missing_object_is_found_on_each_backend(node: Node, request: pytest.FixtureRequest) -> None:
    archived(node)
    segments = node("segments", TOPIC, "0", "--type", "consume_queue", output="json").json()["rows"]
    assert len(segments) >= 2
    victim = segments[0]
    if node.name == "posix-sqlite":
        (node.data_dir / "cold" / victim["key"]).unlink()
    else:
        client = request.getfixturevalue("s3_server").client()
        bucket = request.getfixturevalue("s3_bucket")
        listed = client.list_objects_v2(Bucket=bucket, Prefix=f"archive/{victim['key']}/")
        client.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": o["Key"]} for o in listed["Contents"]]})
    result = node("verify", TOPIC, output="json")
    assert result.exit_code == 5
    problems = result.json()["problems"]
    assert [(p["kind"], p["location"], p["base_offset"]) for p in problems] == [
        ("MISSING_OBJECT", victim["key"], victim["base_offset"])
    ]
    text = node("verify")
    assert text.exit_code == 5
    assert f"MISSING_OBJECT at {victim['key']}" in text.stdout
    assert "verify found 1 problems" in text.stderr


def test_orphan_objects_are_found(posix: Node) -> None:
    archived(posix)
    commit_logs = segment_files(posix, "COMMIT_LOG")
    stray = commit_logs[0].parent / segment_name(10_000_000)
    shutil.copyfile(commit_logs[0], stray)
    ghost = posix.data_dir / "cold" / BROKER_PATH / "Ghost" / "0" / "CONSUME_QUEUE"
    ghost.mkdir(parents=True)
    (ghost / segment_name(0)).write_bytes(b"\0" * 20)
    result = posix("verify", output="json")
    assert result.exit_code == 5
    found = {(p["kind"], p["location"]) for p in result.json()["problems"]}
    assert found == {
        ("ORPHAN_OBJECT", f"{BROKER_PATH}/{TOPIC}/0/COMMIT_LOG/{stray.name}"),
        ("ORPHAN_OBJECT", f"{BROKER_PATH}/Ghost/0"),
    }
    # Scoped to the topic, the other topic's orphan folder is not this topic's problem.
    assert len(posix("verify", TOPIC, output="json").json()["problems"]) == 1


def test_a_flipped_bit_is_found_by_deep_verify_only(posix: Node) -> None:
    archived(posix)
    target = next(path for path in segment_files(posix, "COMMIT_LOG") if b"order 0-101" in path.read_bytes())
    data = bytearray(target.read_bytes())
    at = data.index(b"order 0-101")
    data[at + 3] ^= 0x04
    target.write_bytes(bytes(data))
    assert posix("verify").exit_code == 0  # sizes and offsets still agree: only the CRC can tell
    deep = posix("verify", TOPIC, "--queue", "0", "--deep", output="json")
    assert deep.exit_code == 5
    (problem,) = deep.json()["problems"]
    assert problem["kind"] == "CORRUPT_RECORD"
    assert problem["queue_offset"] == 101
    assert "CRC" in problem["detail"]
    text = posix("verify", "--deep")
    assert "CORRUPT_RECORD at" in text.stdout and "queue offset 101" in text.stdout


def test_verify_of_unknown_things_is_not_found(posix: Node) -> None:
    archived(posix)
    assert posix("verify", "Nope").exit_code == 3
    assert posix("verify", TOPIC, "--queue", "9").exit_code == 3
    assert posix("verify", "--queue", "0").exit_code == 2


def test_the_key_index_is_verified_when_everything_is(posix: Node) -> None:
    # Small index files: the archive's 200 keys fill three, which are sealed and uploaded.
    posix.env.update({"TIEREDSTORE_INDEX__INDEX_MAX_ITEMS": "64", "TIEREDSTORE_INDEX__INDEX_SLOT_COUNT": "16"})
    archived(posix)
    clean = posix("verify", output="json").json()
    assert clean["ok"] is True and clean["index_files"] == 3
    index_dir = posix.data_dir / "cold" / BROKER_PATH / "rmq_sys_INDEX" / "0" / "INDEX"
    uploaded = sorted(index_dir.iterdir())
    assert len(uploaded) == clean["index_files"]
    gone = uploaded[-1]
    gone.unlink()
    shutil.copyfile(uploaded[0], index_dir / segment_name(12345))
    result = posix("verify", output="json")
    assert result.exit_code == 5
    found = sorted((p["kind"], p["file_type"], p["base_offset"]) for p in result.json()["problems"])
    assert found == [("MISSING_OBJECT", "INDEX", int(gone.name[8:])), ("ORPHAN_OBJECT", "INDEX", 12345)]
    # One topic's check leaves the key index alone.
    assert posix("verify", TOPIC, output="json").exit_code == 0
