"""Restore: produce → archive → lose the hot store → restore → every message back at its offset, byte-identical."""

from __future__ import annotations

import base64
import json
import shutil

from tests.cli.helpers import Node, hot_records, put_jsonl, without_physical_offset
from tieredstore.formats.message import decode

TOPIC = "Orders"


def produce(node: Node, queue_id: int, count: int) -> None:
    items = []
    for index in range(count):
        text = f"order {queue_id}-{index}".encode()
        body = bytes([index % 256, 0xFF, 0xFE]) * (index % 7) if index % 5 == 0 else text
        item = {"body_base64": base64.b64encode(body).decode(), "keys": [f"order-{queue_id}-{index}"], "tags": "paid"}
        items.append(item)
    put_jsonl(node, TOPIC, queue_id, items)


def archive(node: Node) -> None:
    result = node("run", "--once")
    assert result.exit_code == 0, result.stderr


def test_produce_archive_lose_hot_store_restore_every_message_at_its_offset(node: Node) -> None:
    produce(node, 0, 300)
    produce(node, 1, 120)
    archive(node)
    originals = {queue_id: hot_records(node.hot_dir, TOPIC, queue_id) for queue_id in (0, 1)}
    assert node("verify", "--deep").exit_code == 0

    shutil.rmtree(node.hot_dir)
    restored = node("restore", TOPIC, "--to-store", str(node.hot_dir), output="json")
    assert restored.exit_code == 0, restored.stderr
    summary = restored.json()
    assert summary["messages"] == 420
    assert {(q["queue_id"], q["first"], q["end"], q["restored"]) for q in summary["queues"]} == {
        (0, 0, 300, 300),
        (1, 0, 120, 120),
    }

    for queue_id, records in originals.items():
        back = hot_records(node.hot_dir, TOPIC, queue_id)
        assert sorted(back) == sorted(records)
        for offset, raw in records.items():
            assert without_physical_offset(back[offset]) == without_physical_offset(raw), offset
    # The restored store serves reads through the CLI from the hot tier, at the original offsets.
    read = node("read", TOPIC, "0", "--offset", "295", "--count", "10", "--tier", "hot", output="json")
    assert [m["queue_offset"] for m in read.json_lines()] == [295, 296, 297, 298, 299]
    assert read.json_lines()[1]["body"] == "order 0-296"
    # Nothing is left to archive: the hot store's offsets match the archived ones.
    status = {row["queue_id"]: row for row in node("status", output="json").json()["rows"]}
    assert status[0]["lag"] == 0 and status[1]["lag"] == 0

    again = node("restore", TOPIC, "--to-store", str(node.hot_dir), output="json")
    assert again.exit_code == 0, again.stderr
    assert again.json()["messages"] == 0
    assert sum(len(hot_records(node.hot_dir, TOPIC, q)) for q in (0, 1)) == 420


def test_restore_into_a_new_store_keeps_offsets_far_from_zero(posix: Node, tmp_path: object) -> None:
    produce(posix, 0, 200)
    archive(posix)
    originals = hot_records(posix.hot_dir, TOPIC, 0)
    target = posix.data_dir / "new-node-hot"
    result = posix("restore", TOPIC, "--queue", "0", "--from-offset", "150", "--to-store", str(target), output="json")
    assert result.exit_code == 0, result.stderr
    back = hot_records(target, TOPIC, 0)
    assert sorted(back) == list(range(150, 200))
    assert all(without_physical_offset(back[o]) == without_physical_offset(originals[o]) for o in back)


def test_interrupted_restore_continues_without_duplicates(posix: Node) -> None:
    produce(posix, 0, 250)
    archive(posix)
    target = posix.data_dir / "target"
    first = posix("restore", TOPIC, "--to-store", str(target), "--to-offset", "97", output="json")
    assert first.json()["messages"] == 97
    rest = posix("restore", TOPIC, "--to-store", str(target), output="json")
    assert rest.json()["messages"] == 250 - 97
    assert rest.json()["queues"][0]["already_done"] == 97
    assert sorted(hot_records(target, TOPIC, 0)) == list(range(250))


def test_a_hot_store_written_into_after_it_was_lost_is_flagged_and_not_resumed_into(posix: Node) -> None:
    produce(posix, 0, 40)
    archive(posix)
    shutil.rmtree(posix.hot_dir)
    produce(posix, 0, 3)  # a replaced disk: producers start again at offset 0, offsets the archive holds

    rows = posix("status", output="json").json()["rows"]
    assert [(r["hot_max"], r["archived"], r["hot_behind_archive"]) for r in rows] == [(3, 40, True)]
    text = posix("status")
    assert "warning: Orders/0: the hot store holds offsets below 3 but 40 are archived" in text.stderr
    ran = posix("run", "--once")
    assert ran.exit_code == 0
    assert "fewer offsets than are archived" in ran.stdout + ran.stderr

    refused = posix("restore", TOPIC, "--to-store", str(posix.hot_dir))
    assert refused.exit_code == 2
    assert "holds a different message at Orders/0 offset 2 than the archive" in refused.stderr
    assert sorted(hot_records(posix.hot_dir, TOPIC, 0)) == [0, 1, 2], "nothing written"
    # Into an empty directory the archive comes back whole, and a second run resumes nothing.
    target = posix.data_dir / "empty"
    assert posix("restore", TOPIC, "--to-store", str(target), output="json").json()["messages"] == 40
    assert posix("restore", TOPIC, "--to-store", str(target), output="json").json()["messages"] == 0


def test_export_to_files_resumes_after_a_crash_mid_batch(posix: Node) -> None:
    produce(posix, 0, 180)
    archive(posix)
    out = posix.data_dir / "export"
    whole = posix("restore", TOPIC, "--to-dir", str(out), "--format", "jsonl", output="json")
    assert whole.exit_code == 0, whole.stderr
    data = out / TOPIC / "0.jsonl"
    complete = data.read_bytes()
    lines = complete.splitlines(keepends=True)
    assert [json.loads(line)["queue_offset"] for line in lines] == list(range(180))
    assert json.loads(lines[5])["body_encoding"] == "base64"
    assert json.loads(lines[6])["body"] == "order 0-6"

    # A crash after 60 messages were recorded and half a line more was written.
    kept = b"".join(lines[:60])
    data.write_bytes(kept + lines[60][:25])
    progress = out / TOPIC / "0.jsonl.progress"
    progress.write_text(json.dumps({"first_offset": 0, "next_offset": 60, "length": len(kept)}))
    resumed = posix("restore", TOPIC, "--to-dir", str(out), output="json")
    assert resumed.json()["messages"] == 120
    assert data.read_bytes() == complete


def test_raw_export_is_the_archived_records_and_dry_run_writes_nothing(posix: Node) -> None:
    produce(posix, 0, 40)
    archive(posix)
    out = posix.data_dir / "raw"
    plan = posix("restore", TOPIC, "--to-dir", str(out), "--format", "raw", "--dry-run", output="json")
    assert plan.exit_code == 0, plan.stderr
    assert plan.json()["dry_run"] is True
    assert plan.json()["queues"][0]["remaining"] == 40
    assert not out.exists()
    assert posix("restore", TOPIC, "--to-dir", str(out), "--format", "raw").exit_code == 0
    raw = (out / TOPIC / "0.raw").read_bytes()
    originals = hot_records(posix.hot_dir, TOPIC, 0)
    position = 0
    for offset in range(40):
        record = decode(raw, position)
        size = int.from_bytes(raw[position : position + 4], "big")
        assert record.queue_offset == offset
        assert without_physical_offset(raw[position : position + size]) == without_physical_offset(originals[offset])
        position += size
    assert position == len(raw)


def test_restore_by_time_range_and_refusals(posix: Node) -> None:
    produce(posix, 0, 30)
    archive(posix)
    everything = posix("restore", TOPIC, "--since", "1h", "--until", "now", "--to-dir", str(posix.data_dir / "t"))
    assert everything.exit_code == 0, everything.stderr
    assert len((posix.data_dir / "t" / TOPIC / "0.jsonl").read_text().splitlines()) == 30
    nothing = posix("restore", TOPIC, "--until", "2000-01-01T00:00:00Z", "--to-dir", str(posix.data_dir / "u"))
    assert nothing.exit_code == 0
    assert (posix.data_dir / "u" / TOPIC / "0.jsonl").read_text() == ""
    both = posix("restore", TOPIC, "--to-dir", "a", "--to-store", "b")
    assert both.exit_code == 2 and "exactly one target" in both.stderr
    mixed = posix("restore", TOPIC, "--from-offset", "1", "--since", "1h", "--to-dir", "a")
    assert mixed.exit_code == 2
    unknown = posix("restore", "Nope", "--to-dir", str(posix.data_dir / "v"))
    assert unknown.exit_code == 3
