"""A follower of a hot store that has only a commit log: its queues' units are rebuilt from the commit log, and
``run --hot-mode follower`` archives every message once (as a RocketMQ broker's store copied without its
``consumequeue/`` would be)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from tests.cli.helpers import Node, hot_records
from tests.fixtures.paths import ROCKETMQ_FIXTURES as FIXTURES
from tests.local.conftest import write_rocketmq_checkpoint
from tieredstore.local import LocalMessageStore, LocalStoreConfig

TOPIC = "Orders"
COUNTS = (300, 120, 1)


def write_store(hot_dir: Path) -> None:
    """Queues of COUNTS messages, interleaved, in 64 KiB commit-log files (not the node's configured size),
    closed cleanly so that its checkpoint covers them all; then its consume queues are deleted."""
    config = LocalStoreConfig(commit_log_file_size=64 << 10, max_message_size=16 << 10, consume_queue_units_per_file=10)
    with LocalMessageStore(hot_dir, config=config) as store:
        for n in range(max(COUNTS)):
            for queue_id, count in enumerate(COUNTS):
                if n < count:
                    body = f"order {queue_id}-{n}|".encode() * (1 + n % 80)
                    store.put_message(TOPIC, queue_id, body, keys=[f"order-{queue_id}-{n}"], tags=f"t{n % 3}")
    shutil.rmtree(hot_dir / "consumequeue")


def snapshot(directory: Path) -> dict[str, str]:
    return {
        str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


def cold_records(node: Node, queue_id: int, count: int) -> list[bytes]:
    read = node(
        "read", TOPIC, str(queue_id), "--offset", "0", "--count", str(count), "--tier", "cold", "--format", "raw"
    )
    assert read.exit_code == 0, read.stderr
    return [bytes(record) for record in _split(read.stdout_bytes)]


def _split(raw: bytes) -> list[bytes]:
    records, at = [], 0
    while at < len(raw):
        size = int.from_bytes(raw[at : at + 4], "big")
        records.append(raw[at : at + size])
        at += size
    return records


def test_a_follower_of_a_store_with_only_a_commit_log_archives_every_message_once(node: Node) -> None:
    write_store(node.hot_dir)
    assert len(list((node.hot_dir / "commitlog").iterdir())) >= 2, "the messages span commit-log files"
    hot = {queue_id: hot_records(node.hot_dir, TOPIC, queue_id) for queue_id in (0, 1, 2)}
    assert [len(records) for records in hot.values()] == [300, 120, 1]
    before = {row["queue_id"]: row["lag"] for row in node("status", output="json").json()["rows"]}
    assert before == {0: 300, 1: 120, 2: 1}
    untouched = snapshot(node.hot_dir)

    run = node("run", "--once", "--hot-mode", "follower", output="json")
    assert run.exit_code == 0, run.stderr
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    assert (summary["messages"], summary["lag"]) == (421, 0)
    again = node("run", "--once", "--hot-mode", "follower", output="json")
    assert again.exit_code == 0, again.stderr
    assert json.loads(again.stdout.strip().splitlines()[-1])["messages"] == 0, "nothing is archived twice"

    deep = node("verify", "--deep", output="json")
    assert deep.exit_code == 0, deep.stdout
    assert deep.json()["problems"] == []
    after = node("status", output="json").json()["rows"]
    assert {(row["queue_id"], row["archived"], row["lag"]) for row in after} == {(0, 300, 0), (1, 120, 0), (2, 1, 0)}
    for queue_id, records in hot.items():
        # Byte for byte the hot records, in queue order, each once (the cold copy has its own PHYSICALOFFSET).
        cold = cold_records(node, queue_id, len(records) + 5)
        assert len(cold) == len(records)
        assert [c[:28] + c[36:] for c in cold] == [r[:28] + r[36:] for r in records.values()]
    assert snapshot(node.hot_dir) == untouched, "a follower writes nothing into the store it follows"


def test_the_java_fixture_which_has_only_a_commit_log_is_archived_whole(node: Node) -> None:
    # The Java broker's own files: one 8 KiB commit-log file of 47 records of abc/0, no consume queue, no
    # checkpoint. The broker's checkpoint is written as the broker would after flushing them all.
    shutil.copytree(Path(FIXTURES) / "java-4x-consumequeuetest", node.hot_dir)
    write_rocketmq_checkpoint(node.hot_dir, physic_timestamp=1551613204834 + 60_000)
    run = node("run", "--once", "--hot-mode", "follower", output="json")
    assert run.exit_code == 0, run.stderr
    assert json.loads(run.stdout.strip().splitlines()[-1])["messages"] == 47
    deep = node("verify", "--deep", output="json")
    assert deep.exit_code == 0 and deep.json()["problems"] == [], deep.stdout
    (row,) = node("status", output="json").json()["rows"]
    assert (row["topic"], row["queue_id"], row["archived"], row["lag"]) == ("abc", 0, 47, 0)
    read = node("read", "abc", "0", "--offset", "46", "--tier", "cold", output="json").json_lines()
    assert [(m["queue_offset"], m["tags"], m["body"]) for m in read] == [
        (46, "TAG1", "Once, there was a chance for me!")
    ]
