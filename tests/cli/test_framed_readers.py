"""Every reader reads a framed archive (zstd + AES-256-GCM) as it reads an unframed one of the same messages:
the fetcher, restore to files and to a hot store, verify --deep, scrub, the cold key index and db rebuild, on
POSIX and S3 with SQLite and PostgreSQL; and a topic switched from none to zstd and back reads back whole."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

import pytest

from tests.cli.framed import (
    BACKEND_PAIRS,
    KEY_ID,
    ColdObjects,
    codec_env,
    cold_objects,
    framed_node_on,
    plain_twin,
    produce_json,
    segment_keys,
    use_codec,
)
from tests.cli.helpers import Node, hot_records, without_physical_offset
from tests.cli.test_db_rebuild import drop_database
from tests.cli.test_restore import TOPIC, archive
from tests.cli.test_scrub import wait_past
from tieredstore.config import ReadPolicy, TieredStoreConfig, load_config
from tieredstore.fetcher import GetMessageStatus
from tieredstore.formats.message import POS_PHYSICAL_OFFSET
from tieredstore.formats.naming import index_path, segment_name
from tieredstore.read.results import FetchedMessage
from tieredstore.store import TieredMessageStore

COUNTS = {0: 300, 1: 60}
INDEX_DIR = f"{index_path('DefaultCluster', 'broker-a')}/INDEX/"


@pytest.fixture(params=BACKEND_PAIRS)
def framed_node(request: pytest.FixtureRequest, tmp_path: Path) -> Node:
    return framed_node_on(request.param, request, tmp_path)


def config_of(node: Node, monkeypatch: pytest.MonkeyPatch) -> TieredStoreConfig:
    """The node's configuration as a library user loads it: its environment only, nobody else's."""
    for name in [n for n in os.environ if n.startswith("TIEREDSTORE_")]:
        monkeypatch.delenv(name)
    for name, value in node.env.items():
        monkeypatch.setenv(name, value)
    return load_config(data_dir=node.data_dir, cold_url=node.cold_url, metadata_url=node.metadata_url)


def cold_messages(node: Node, monkeypatch: pytest.MonkeyPatch, queue_id: int) -> list[FetchedMessage]:
    """Every message of a queue as the fetcher serves it under read policy FORCE (cold always)."""
    messages: list[FetchedMessage] = []
    with TieredMessageStore(config_of(node, monkeypatch), read_policy=ReadPolicy.FORCE) as store:
        offset = 0
        while offset < COUNTS[queue_id]:
            result = store.get_messages(TOPIC, queue_id, offset, 64)
            assert result.status is GetMessageStatus.FOUND, (offset, result.status)
            messages += result.messages
            offset = result.next_begin_offset
        assert store.get_messages(TOPIC, queue_id, offset, 1).status is GetMessageStatus.OFFSET_OVERFLOW_ONE
        # A cold record's PHYSICALOFFSET names its place in the cold commit log, uncompressed: it finds it again.
        last = messages[-1]
        physical = int.from_bytes(last.raw[POS_PHYSICAL_OFFSET : POS_PHYSICAL_OFFSET + 8], "big")
        assert store.look_message_by_offset(physical, topic=TOPIC, queue_id=queue_id).raw == last.raw
    return messages


def archived(node: Node) -> None:
    for queue_id, count in COUNTS.items():
        produce_json(node, queue_id, count)
    archive(node)


def assert_framed(node: Node, objects: ColdObjects) -> None:
    """Every segment of both queues and every uploaded key-index file is framed, and nothing stored shows
    a message's text."""
    keys = [key for queue_id in COUNTS for keys in segment_keys(node, queue_id).values() for key in keys]
    stored = objects.listed()
    index_files = {key.rsplit("/", 1)[0] for key in stored if key.startswith(INDEX_DIR)}
    assert len(keys) >= 6 and len(index_files) >= 4
    assert all(objects.is_framed(key) for key in [*keys, *index_files])
    assert not [key for key in stored if b"widget-" in objects.read(key) or b"order-0-" in objects.read(key)]


def segment_rows(node: Node, queue_ids: Iterable[int] = COUNTS) -> list[tuple[str, int, int, str]]:
    """The queues' segment rows as a rebuild can tell them: key, base offset, size and status."""
    rows = [
        row for queue_id in queue_ids for row in node("segments", TOPIC, str(queue_id), output="json").json()["rows"]
    ]
    return sorted((row["key"], row["base_offset"], row["size"], row["status"]) for row in rows)


def plant_stray_copy(node: Node, objects: ColdObjects) -> str:
    """A copy of queue 0's first commit-log segment, objects and all, at a base offset no row records."""
    original = segment_keys(node)["COMMIT_LOG"][0]
    stray = original.rsplit("/", 1)[0] + "/" + segment_name(10_000_000)
    for key in objects.listed():
        if key.startswith(original + "/"):
            objects.write(stray + key.removeprefix(original), objects.read(key))
    return stray


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_the_fetcher_and_restore_return_what_an_unframed_archive_of_the_same_messages_does(
    framed_node: Node, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    node = framed_node
    for queue_id, count in COUNTS.items():
        produce_json(node, queue_id, count)
    twin = plain_twin(node, tmp_path)
    archive(node)
    archive(twin)
    assert_framed(node, cold_objects(node, request))
    assert not any(key.endswith(".codec") for key in cold_objects(twin, request).listed())

    for queue_id, count in COUNTS.items():
        hot = hot_records(node.hot_dir, TOPIC, queue_id)
        framed = cold_messages(node, monkeypatch, queue_id)
        plain = cold_messages(twin, monkeypatch, queue_id)
        assert [m.queue_offset for m in framed] == list(range(count))
        assert all(m.tier == "cold" for m in framed)
        # Byte-identical to the unframed archive, PHYSICALOFFSET included: positions stay logical.
        assert [m.raw for m in framed] == [m.raw for m in plain]
        assert [without_physical_offset(m.raw) for m in framed] == [without_physical_offset(hot[o]) for o in hot]
        assert framed[7].record.keys == [f"order-{queue_id}-7"]
        assert json.loads(framed[7].body) == {"order": 7, "queue": queue_id, "item": "widget-7"}

    for fmt in ("jsonl", "raw"):
        outputs = []
        for source in (node, twin):
            out = tmp_path / f"{source.name}-{fmt}"
            result = source("restore", TOPIC, "--to-dir", str(out), "--format", fmt, output="json")
            assert result.exit_code == 0, result.stderr
            assert result.json()["messages"] == sum(COUNTS.values())
            outputs.append(tree(out))
        assert outputs[0] == outputs[1] and outputs[0], fmt

    stores = []
    for source in (node, twin):
        target = tmp_path / f"{source.name}-store"
        # One queue at a time: queues restored at once interleave in the hot commit log as they come.
        result = source("restore", TOPIC, "--to-store", str(target), "--parallel", "1", output="json")
        assert result.exit_code == 0, result.stderr
        stores.append({queue_id: hot_records(target, TOPIC, queue_id) for queue_id in COUNTS})
    assert stores[0] == stores[1]
    assert [len(records) for records in stores[0].values()] == list(COUNTS.values())


def test_verify_scrub_the_cold_key_index_and_db_rebuild_read_framed_segments(
    framed_node: Node, request: pytest.FixtureRequest
) -> None:
    node = framed_node
    archived(node)
    objects = cold_objects(node, request)
    assert_framed(node, objects)

    deep = node("verify", "--deep", output="json")
    assert deep.exit_code == 0, deep.stdout
    assert (deep.json()["ok"], deep.json()["records"]) == (True, sum(COUNTS.values()))
    assert deep.json()["index_files"] >= 4
    # Framed segments are folders of chunks on every provider: none of them, nor a descriptor, is an orphan.
    scrub = node("scrub", "--older-than", "1s", output="json")
    assert scrub.exit_code == 0, scrub.stderr
    assert scrub.json()["orphans"] == []
    # A framed segment metadata does not know is one orphan, descriptor and chunks together, and goes whole.
    stray = plant_stray_copy(node, objects)
    planted = node("scrub", output="json").json()["orphans"]
    assert [(o["location"], o["action"]) for o in planted] == [(stray, "kept")], planted
    assert node("verify", TOPIC, output="json").json()["problems"][0]["kind"] == "ORPHAN_OBJECT"
    wait_past(planted[0]["last_modified"])
    deleted = node("scrub", "--delete", "--older-than", "1s", output="json")
    assert deleted.exit_code == 0, deleted.stderr
    assert deleted.json()["deleted"] == 1
    assert not [key for key in objects.listed() if key.startswith(stray + "/")]
    assert node("scrub", "--older-than", "1s", output="json").json()["orphans"] == []

    # With the hot store away, keys are found through the uploaded (framed) key-index files alone.
    away = node.data_dir / "hot-away"
    node.hot_dir.rename(away)
    found = node("query-key", TOPIC, "order-0-7", output="json")
    assert found.exit_code == 0, found.stderr
    assert [(m["queue_id"], m["queue_offset"], m["tier"], m["body"]) for m in found.json_lines()] == [
        (0, 7, "cold", '{"order": 7, "queue": 0, "item": "widget-7"}')
    ]

    recorded = segment_rows(node)
    drop_database(node, node.metadata_url or "")
    rebuilt = node("db", "rebuild", "--from-cold", output="json")
    assert rebuilt.exit_code == 0, rebuilt.stderr
    assert {(q["queue_id"], q["max_offset"]) for q in rebuilt.json()["queues"]} == set(COUNTS.items())
    assert rebuilt.json()["index_files"] == deep.json()["index_files"]
    # Sizes come back logical (uncompressed), as the archiver recorded them, not as stored.
    assert segment_rows(node) == recorded
    again = node("verify", "--deep", output="json")
    assert again.exit_code == 0, again.stdout
    assert again.json()["records"] == sum(COUNTS.values())
    found = node("query-key", TOPIC, "order-1-42", output="json")
    assert [(m["queue_id"], m["queue_offset"], m["tier"]) for m in found.json_lines()] == [(1, 42, "cold")]
    read = node("read", TOPIC, "0", "--offset", "295", "--count", "10", "--tier", "cold", output="json")
    assert read.exit_code == 0, read.stderr
    assert [m["keys"] for m in read.json_lines()] == [[f"order-0-{n}"] for n in range(295, 300)]


def test_a_topic_switched_from_none_to_zstd_and_back_reads_back_whole(
    framed_node: Node, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The archiver restarts with each configuration; segments roll by size (150 messages overflow a 16 KiB
    commit-log segment and a 100-unit consume-queue segment), never because the codec changed: the segment
    a run continues keeps the format it was created with, and each new segment takes the new one."""
    node = framed_node
    keyring = Path(node.env["TIEREDSTORE_ENCRYPTION__KEYRING_FILE"])
    phases = [("none", codec_env("none")), ("zstd", codec_env("zstd", keyring, KEY_ID)), ("none", codec_env("none"))]
    # The last phase writes unframed segments again but still holds the key that opens the middle ones.
    phases[2][1]["TIEREDSTORE_ENCRYPTION__KEYRING_FILE"] = str(keyring)
    objects = cold_objects(node, request)
    framed: dict[str, bool] = {}
    sizes: dict[str, int] = {}
    continued = 0
    for number, (compression, env) in enumerate(phases):
        use_codec(node, env)
        produce_json(node, 0, 150, first=150 * number)
        archive(node)
        rows = {key: size for key, _, size, _ in segment_rows(node, [0])}
        created = rows.keys() - framed.keys()
        assert {key.split("/")[-2] for key in created} == {"COMMIT_LOG", "CONSUME_QUEUE"}, "both files rolled"
        assert {objects.is_framed(key) for key in created} == {compression == "zstd"}, number
        # A segment written before the switch and continued after it keeps the format it was created with.
        continued += sum(1 for key, size in sizes.items() if rows[key] > size)
        assert {key: objects.is_framed(key) for key in framed} == framed, number
        framed.update({key: objects.is_framed(key) for key in created})
        sizes = rows
    assert continued >= 2, "each switch found a segment open"

    deep = node("verify", "--deep", output="json")
    assert deep.exit_code == 0, deep.stdout
    assert deep.json()["records"] == 450
    read = node("read", TOPIC, "0", "--offset", "0", "--count", "500", "--tier", "cold", output="json")
    assert read.exit_code == 0, read.stderr
    assert [json.loads(m["body"])["order"] for m in read.json_lines()] == list(range(450))
    out = tmp_path / "export"
    exported = node("restore", TOPIC, "--to-dir", str(out), output="json")
    assert exported.exit_code == 0, exported.stderr
    lines = (out / TOPIC / "0.jsonl").read_text().splitlines()
    assert [json.loads(line)["queue_offset"] for line in lines] == list(range(450))
