"""status, topics, queues, segments, read, tail, offset-for-time, query-key and put, in text and JSON."""

from __future__ import annotations

import base64
import json
import time

from tests.cli.helpers import Node
from tests.cli.test_restore import TOPIC, archive, produce
from tieredstore.formats.message import decode


def test_listings_before_and_after_archiving(node: Node) -> None:
    produce(node, 0, 150)
    before = node("status", output="json").json()
    assert before["title"] == "status"
    (row,) = before["rows"]
    assert (row["topic"], row["queue_id"], row["hot_min"], row["hot_max"], row["lag"]) == (TOPIC, 0, 0, 150, 150)
    assert row["archived"] is None and row["unarchived_age_ms"] >= 0

    archive(node)
    (row,) = node("status", output="json").json()["rows"]
    assert (row["archived"], row["cold_min"], row["lag"], row["unarchived_age_ms"]) == (150, 0, 0, 0)
    assert row["commit_log_segments"] >= 2 and row["cold_bytes"] > 0

    (topic,) = node("topics", output="json").json()["rows"]
    assert (topic["topic"], topic["queues"], topic["archived_messages"], topic["reserve_hours"]) == (TOPIC, 1, 150, 72)
    (queue,) = node("queues", TOPIC, output="json").json()["rows"]
    assert (queue["queue_id"], queue["cold_min"], queue["archived"], queue["hot_max"]) == (0, 0, 150, 150)
    assert queue["commit_log_bytes"] + queue["consume_queue_bytes"] == row["cold_bytes"]

    units = node("segments", TOPIC, "0", "--type", "consume_queue", output="json").json()["rows"]
    assert {s["file_type"] for s in units} == {"CONSUME_QUEUE"}
    assert sum(s["size"] for s in units) == 150 * 20
    assert [s["base_offset"] for s in units] == sorted(s["base_offset"] for s in units)
    everything = node("segments", TOPIC, "0", output="json").json()["rows"]
    assert len(everything) == len(units) + row["commit_log_segments"]

    text = node("status")
    assert text.exit_code == 0 and TOPIC in text.stdout and "archived" in text.stdout
    watched = node("status", "--watch", "--times", "2", "--interval", "0.05", output="json").json_lines()
    assert len(watched) == 2 and all(w["rows"][0]["archived"] == 150 for w in watched)


def test_read_from_each_tier_in_every_format(posix: Node) -> None:
    produce(posix, 0, 60)
    archive(posix)
    hot = posix("read", TOPIC, "0", "--offset", "10", "--count", "3", "--tier", "hot", output="json").json_lines()
    cold = posix("read", TOPIC, "0", "--offset", "10", "--count", "3", "--tier", "cold", output="json").json_lines()
    assert [m["tier"] for m in hot] == ["hot"] * 3 and [m["tier"] for m in cold] == ["cold"] * 3
    assert [m["queue_offset"] for m in cold] == [10, 11, 12]
    strip = ("tier",)
    assert [{k: v for k, v in m.items() if k not in strip} for m in hot] == [
        {k: v for k, v in m.items() if k not in strip} for m in cold
    ]
    assert cold[1]["body"] == "order 0-11" and cold[1]["keys"] == ["order-0-11"] and cold[1]["tags"] == "paid"
    binary = posix("read", TOPIC, "0", "--offset", "5", "--tier", "cold", "--format", "json").json_lines()[0]
    assert binary["body_encoding"] == "base64"
    assert base64.b64decode(binary["body"]) == bytes([5, 0xFF, 0xFE]) * 5

    text = posix("read", TOPIC, "0", "--offset", "11", "--tier", "cold")
    assert text.stdout.startswith("Orders/0@11 [cold] ") and "keys=order-0-11 tags=paid body=order 0-11" in text.stdout
    raw = posix("read", TOPIC, "0", "--offset", "11", "--count", "2", "--format", "raw").stdout_bytes
    first = decode(raw)
    assert first.body == b"order 0-11" and decode(raw, int.from_bytes(raw[:4], "big")).queue_offset == 12

    past_end = posix("read", TOPIC, "0", "--offset", "60", "--count", "5")
    assert past_end.exit_code == 0 and past_end.stdout == ""
    assert past_end.stderr.strip() == "no messages from offset 60: Orders/0 holds offsets [0, 60)"
    assert posix("read", TOPIC, "7", "--offset", "0").exit_code == 3

    tail = posix("tail", TOPIC, "0", "-n", "2", output="json").json_lines()
    assert [m["queue_offset"] for m in tail] == [58, 59]

    produce(posix, 0, 2)  # offsets 60 and 61, in the hot store only
    cold_end = posix("read", TOPIC, "0", "--offset", "60", "--tier", "cold", output="json")
    assert cold_end.exit_code == 0 and cold_end.stdout == ""
    assert cold_end.stderr.strip() == "no messages from offset 60: Orders/0 holds offsets [0, 60) in the cold tier"


def test_offset_for_time_and_query_key(posix: Node) -> None:
    produce(posix, 0, 20)
    time.sleep(0.05)
    middle = int(time.time() * 1000)
    time.sleep(0.05)
    produce(posix, 0, 20)
    archive(posix)
    for tier in ("hot", "cold", "auto"):
        lower = posix("offset-for-time", TOPIC, "0", str(middle), "--tier", tier, output="json").json()
        upper = posix(
            "offset-for-time", TOPIC, "0", str(middle), "--boundary", "upper", "--tier", tier, output="json"
        ).json()
        assert (lower["queue_offset"], upper["queue_offset"]) == (20, 19), tier
    assert posix("offset-for-time", TOPIC, "0", "2000-01-01T00:00:00Z", output="json").json()["queue_offset"] == 0
    assert posix("offset-for-time", TOPIC, "0", "now", output="json").json()["queue_offset"] == 40
    assert posix("offset-for-time", TOPIC, "0", "yesterday").exit_code == 2

    found = posix("query-key", TOPIC, "order-0-7", output="json").json_lines()
    assert sorted(m["queue_offset"] for m in found) == [7, 27]  # both halves used the same keys
    assert [m["queue_offset"] for m in found] == [27, 7]  # newest first
    # archived and still hot: each found once, read from the hot store
    assert all("order-0-7" in m["keys"] and m["tier"] == "hot" for m in found)
    later = posix("query-key", TOPIC, "order-0-7", "--since", str(middle), output="json").json_lines()
    assert [m["queue_offset"] for m in later] == [27]
    missing = posix("query-key", TOPIC, "no-such-key", output="json")
    assert (missing.exit_code, missing.stdout) == (0, "")  # an empty answer for scripts
    assert f"no message of {TOPIC} has the key 'no-such-key'" in missing.stderr  # not silence for people
    assert posix("query-key", TOPIC, "k", "--since", "now", "--until", "1d").exit_code == 2


def test_put_plain_lines_and_jsonl(posix: Node) -> None:
    plain = posix("put", "Events", "2", "--key", "a", "--key", "b", "--tag", "t", input="one\ntwo\n", output="json")
    assert plain.json() == {"topic": "Events", "queue_id": 2, "count": 2, "first_offset": 0, "next_offset": 2}
    lines = [
        json.dumps({"body": "three", "keys": "x y", "properties": {"source": "test"}}),
        "",
        json.dumps({"body_base64": base64.b64encode(b"\xff\x00").decode()}),
    ]
    assert posix("put", "Events", "2", "--jsonl", input="\n".join(lines)).exit_code == 0
    messages = posix("read", "Events", "2", "--offset", "0", "--count", "9", output="json").json_lines()
    assert [(m["body"], m["keys"], m["tags"]) for m in messages[:3]] == [
        ("one", ["a", "b"], "t"),
        ("two", ["a", "b"], "t"),
        ("three", ["x", "y"], None),
    ]
    assert messages[2]["properties"]["source"] == "test"
    assert base64.b64decode(messages[3]["body"]) == b"\xff\x00"

    bad = posix("put", "Events", "2", "--jsonl", input='{"body": "ok"}\n{"body": 5}\n')
    assert bad.exit_code == 2
    assert "line 2" in bad.stderr and "Traceback" not in bad.stderr
    assert posix("status", output="json").json()["rows"][0]["hot_max"] == 4  # nothing of the bad input landed
    mixed = posix("put", "Events", "2", "--jsonl", "--tag", "t", input="{}")
    assert mixed.exit_code == 2


def test_query_key_finds_what_one_archiver_indexed_on_each_backend_pair(node: Node) -> None:
    # compose.yaml's way: one archiver, queue leases off also on PostgreSQL, so it writes the key index.
    node.env["TIEREDSTORE_ARCHIVER__LEASES"] = "false"
    produce(node, 0, 30)
    produce(node, 1, 30)
    archive(node)
    found = node("query-key", TOPIC, "order-1-7", output="json").json_lines()
    assert [(m["queue_id"], m["queue_offset"], m["keys"]) for m in found] == [(1, 7, ["order-1-7"])]


def test_archivers_sharing_queues_by_lease_index_keys_in_a_namespace_of_their_own(node: Node) -> None:
    # With leases (PostgreSQL's default) each archiver writes its own key-index namespace and says which.
    node.env["TIEREDSTORE_ARCHIVER__LEASES"] = "true"
    produce(node, 0, 10)
    result = node("run", "--once")
    assert result.exit_code == 0, result.stderr
    assert "key index namespace " in result.stderr
    found = node("query-key", TOPIC, "order-0-7", output="json").json_lines()
    assert [(m["queue_id"], m["queue_offset"], m["keys"]) for m in found] == [(0, 7, ["order-0-7"])]
    produce(node, 0, 10)  # the same keys again, at offsets 10..19
    again = node("run", "--once")
    assert again.exit_code == 0, again.stderr
    assert result.stderr.split("key index namespace ")[1].split()[0] in again.stderr  # its slot, taken back
    both = node("query-key", TOPIC, "order-0-7", output="json").json_lines()
    assert sorted(m["queue_offset"] for m in both) == [7, 17]


def test_query_key_finds_messages_the_archiver_has_not_moved_yet(node: Node) -> None:
    produce(node, 1, 10)
    archive(node)  # an archiver runs; queue 0's messages below wait for their group commit
    produce(node, 0, 10)
    fresh = node("query-key", TOPIC, "order-0-7", output="json").json_lines()
    assert [(m["queue_id"], m["queue_offset"], m["tier"]) for m in fresh] == [(0, 7, "hot")]
    archive(node)
    produce(node, 0, 10)  # the same keys again, at offsets 10..19, in the hot store only
    both = node("query-key", TOPIC, "order-0-7", output="json").json_lines()
    assert [(m["queue_offset"], m["keys"]) for m in both] == [(17, ["order-0-7"]), (7, ["order-0-7"])]
    newest = node("query-key", TOPIC, "order-0-7", "--max", "1", output="json").json_lines()
    assert [m["queue_offset"] for m in newest] == [17]
    assert node("query-key", TOPIC, "order-0-77", output="json").stdout == ""
