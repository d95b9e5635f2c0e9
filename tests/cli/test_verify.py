"""verify: a clean archive passes; a missing object, an orphan object and a flipped bit are each found and located."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from tests.cli.helpers import Node
from tests.cli.test_restore import TOPIC, archive, produce
from tieredstore.config import TieredStoreConfig, load_config
from tieredstore.formats.naming import cluster_folder, segment_name
from tieredstore.leases import LeaseManager
from tieredstore.runtime import open_runtime

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


async def _orphan_then_recover_under_a_lease(config: TieredStoreConfig) -> int:
    """Commit-log bytes no unit references (a commit cut short), then a recovery under a lease."""
    async with open_runtime(config, hot=False) as runtime:
        flat_file = await runtime.flat.get_or_create(TOPIC, 0)
        await flat_file.commit_log.append(b"\x07" * 500, 1_700_000_000_000)
        await flat_file.commit_log.commit()
        lease = LeaseManager(runtime.metadata, owner="verify-test", lease_duration=30, renew_interval=10)
        lease.round()
        flat_file.lease = lease.hold((TOPIC, 0))
        result = await flat_file.recover()
        lease.close()
        return result.orphan_bytes_abandoned


def test_bytes_a_recovery_under_leases_left_in_place_are_a_note(node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    archived(node)
    for name, value in node.env.items():
        monkeypatch.setenv(name, value)
    config = load_config(data_dir=node.data_dir, cold_url=node.cold_url, metadata_url=node.metadata_url)
    assert asyncio.run(_orphan_then_recover_under_a_lease(config)) == 500
    for flags in ([], ["--deep"]):
        result = node("verify", TOPIC, *flags, output="json")
        assert result.exit_code == 0, result.stdout
        notes = [note for note in result.json()["notes"] if "left in place by a recovery under leases" in note]
        assert len(notes) == 1 and "500 bytes" in notes[0], result.json()["notes"]
    produce(node, 0, 50)
    archive(node)  # archiving goes on in the segment after the sealed one
    result = node("verify", TOPIC, "--deep", output="json")
    assert result.exit_code == 0, result.stdout
    read = node("read", TOPIC, "0", "--offset", "195", "--count", "10", "--tier", "cold", output="json")
    assert read.exit_code == 0, read.stderr
    assert [line["queue_offset"] for line in map(json.loads, read.stdout.splitlines())] == list(range(195, 205))
