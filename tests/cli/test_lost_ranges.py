"""Offsets lost before they were archived (a recorded consume-queue hole): verify accepts it, read and tail
step over it and say so, restore keeps original offsets (a directory skips the hole, a hot store stops at it)."""

from __future__ import annotations

import asyncio
import json
import shutil

import pytest

from tests.cli.helpers import Node, hot_records, without_physical_offset
from tests.cli.test_restore import TOPIC, archive, produce
from tieredstore.config import TieredStoreConfig, load_config
from tieredstore.flat.message_file import RecordRun
from tieredstore.formats.consume_queue import UNIT_SIZE
from tieredstore.formats.message import decode, tag_hash
from tieredstore.formats.naming import FileType, queue_path, segment_key
from tieredstore.metadata import MetadataStore
from tieredstore.runtime import open_runtime

BEFORE, RESUME, END = 120, 170, 300  # offsets [BEFORE, RESUME) are lost
KEPT = [*range(BEFORE), *range(RESUME, END)]


def node_config(node: Node, monkeypatch: pytest.MonkeyPatch) -> TieredStoreConfig:
    for name, value in node.env.items():
        monkeypatch.setenv(name, value)
    return load_config(data_dir=node.data_dir, cold_url=node.cold_url, metadata_url=node.metadata_url)


async def _archive_with_hole(config: TieredStoreConfig, records: dict[int, bytes]) -> None:
    async with open_runtime(config, hot=False) as runtime:
        flat_file = await runtime.flat.get_or_create(TOPIC, 0)
        for offset in KEPT:
            if offset == RESUME:
                await flat_file.commit()
                # What the archiver does when the hot store dropped offsets it never archived.
                await flat_file.skip_to(RESUME)
            record = decode(records[offset])
            run = RecordRun.of([(records[offset], offset, record.store_timestamp, tag_hash(record.tags))])
            await flat_file.append_records(run)
            if offset % 40 == 39:
                await flat_file.commit()
        await flat_file.commit()
        assert flat_file.lost_ranges == [(BEFORE, RESUME)]


def archive_with_hole(node: Node, monkeypatch: pytest.MonkeyPatch) -> dict[int, bytes]:
    """Queue 0 of TOPIC: [0, END) put into the hot store, archived but for [BEFORE, RESUME); its hot records."""
    produce(node, 0, END)
    originals = hot_records(node.hot_dir, TOPIC, 0)
    asyncio.run(_archive_with_hole(node_config(node, monkeypatch), originals))
    return originals


def offsets_of(result_lines: list[dict[str, object]]) -> list[object]:
    return [line["queue_offset"] for line in result_lines]


def test_verify_accepts_a_recorded_hole(node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    archive_with_hole(node, monkeypatch)
    shallow = node("verify", output="json")
    assert shallow.exit_code == 0, shallow.stdout
    assert shallow.json()["problems"] == [] and shallow.json()["units"] == len(KEPT)
    deep = node("verify", TOPIC, "--queue", "0", "--deep", output="json")
    assert deep.exit_code == 0, deep.stdout
    assert deep.json()["records"] == len(KEPT)
    text = node("verify", "--deep")
    assert text.exit_code == 0 and "verify: ok" in text.stdout


def test_an_unrecorded_gap_is_still_found(posix: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    produce(posix, 0, END)
    archive(posix)
    # The consume-queue segment of offsets [100, 200) vanishes, row and object: it looks like a hole, but
    # the commit log holds the bytes of its messages, so they were archived and then lost.
    config = node_config(posix, monkeypatch)
    queue = queue_path(config.cluster, config.broker, TOPIC, 0)
    metadata = MetadataStore.open(config.effective_metadata_url, create=False)
    try:
        metadata.delete_segment(queue, FileType.CONSUME_QUEUE.value, 100 * UNIT_SIZE)
    finally:
        metadata.close()
    (config.data_dir / "cold" / segment_key(queue, FileType.CONSUME_QUEUE, 100 * UNIT_SIZE)).unlink()

    for deep in ([], ["--deep"]):
        result = posix("verify", *deep, output="json")
        assert result.exit_code == 5, result.stdout
        kinds = {(p["kind"], p["queue_offset"]) for p in result.json()["problems"]}
        assert ("UNRECORDED_GAP", 200) in kinds, kinds


def test_read_and_tail_step_over_the_hole_and_say_so(posix: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    archive_with_hole(posix, monkeypatch)
    across = posix("read", TOPIC, "0", "--offset", "110", "--count", "20", "--tier", "cold", output="json")
    assert across.exit_code == 0, across.stderr
    lines = across.json_lines()
    assert offsets_of(lines) == [*range(110, 120), *range(170, 180)]
    assert [line["lost_before"] for line in lines if line["lost_before"] is not None] == [
        {"from_offset": 120, "to_offset": 170}
    ]
    assert lines[11]["queue_offset"] == 171 and lines[11]["body"] == "order 0-171"

    inside = posix("read", TOPIC, "0", "--offset", "130", "--count", "3", "--tier", "cold", output="json")
    assert inside.exit_code == 0, inside.stderr
    assert offsets_of(inside.json_lines()) == [170, 171, 172]
    assert inside.json_lines()[0]["lost_before"] == {"from_offset": 130, "to_offset": 170}

    text = posix("read", TOPIC, "0", "--offset", "118", "--count", "3", "--tier", "cold")
    assert text.exit_code == 0, text.stderr
    printed = text.stdout.splitlines()
    assert len(printed) == 4
    assert printed[0].startswith(f"{TOPIC}/0@118 ") and printed[1].startswith(f"{TOPIC}/0@119 ")
    assert printed[2] == f"{TOPIC}/0: offsets [120, 170) were lost before they were archived (50 messages); skipped"
    assert printed[3].startswith(f"{TOPIC}/0@170 ")

    # tail reaches back across the hole: the 200 newest offsets hold 150 archived messages.
    tail = posix("tail", TOPIC, "0", "-n", "200", "--tier", "cold", output="json")
    assert tail.exit_code == 0, tail.stderr
    assert offsets_of(tail.json_lines()) == [*range(100, 120), *range(170, END)]
    raw = posix("read", TOPIC, "0", "--offset", "119", "--count", "2", "--tier", "cold", "--format", "raw")
    assert raw.exit_code == 0 and "offsets [120, 170) were lost" in raw.stderr


def test_restore_into_a_hot_store_stops_at_the_hole_and_says_so(posix: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    originals = archive_with_hole(posix, monkeypatch)
    shutil.rmtree(posix.hot_dir)
    plan = posix("restore", TOPIC, "--to-store", str(posix.hot_dir), "--dry-run", output="json")
    assert plan.exit_code == 3
    assert plan.json()["queues"][0]["stopped_at"] == BEFORE

    stopped = posix("restore", TOPIC, "--to-store", str(posix.hot_dir), output="json")
    assert stopped.exit_code == 3, stopped.stderr
    queue = stopped.json()["queues"][0]
    assert (queue["restored"], queue["stopped_at"], queue["lost_ranges"]) == (BEFORE, BEFORE, [[BEFORE, RESUME]])
    assert queue["remaining"] == END - RESUME
    assert "a hot store cannot hold a gap" in stopped.stderr and "--from-offset 170" in stopped.stderr
    back = hot_records(posix.hot_dir, TOPIC, 0)
    assert sorted(back) == list(range(BEFORE))  # nothing compacted: offset 170 never landed at 120
    assert all(without_physical_offset(back[o]) == without_physical_offset(originals[o]) for o in back)

    again = posix("restore", TOPIC, "--to-store", str(posix.hot_dir), output="json")
    assert again.exit_code == 3 and again.json()["messages"] == 0
    assert sorted(hot_records(posix.hot_dir, TOPIC, 0)) == list(range(BEFORE))

    # The rest goes into an empty store at its own offsets; a start inside the hole begins after it.
    later = posix.data_dir / "later-hot"
    rest = posix("restore", TOPIC, "--from-offset", "150", "--to-store", str(later), output="json")
    assert rest.exit_code == 0, rest.stderr
    assert rest.json()["queues"][0]["first"] == RESUME
    assert sorted(hot_records(later, TOPIC, 0)) == list(range(RESUME, END))


def test_export_to_files_skips_the_hole_and_resumes(posix: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    archive_with_hole(posix, monkeypatch)
    out = posix.data_dir / "export"
    first = posix("restore", TOPIC, "--to-dir", str(out), "--to-offset", "150", "--batch", "50", output="json")
    assert first.exit_code == 0, first.stderr
    assert first.json()["queues"][0]["lost_ranges"] == [[BEFORE, 150]]
    assert first.json()["messages"] == BEFORE
    rest = posix("restore", TOPIC, "--to-dir", str(out), "--batch", "50")
    assert rest.exit_code == 0, rest.stderr
    assert "offsets [150, 170) were lost before they were archived; skipped" in rest.stderr
    data = out / TOPIC / "0.jsonl"
    assert [json.loads(line)["queue_offset"] for line in data.read_text().splitlines()] == KEPT
    assert json.loads((out / TOPIC / "0.jsonl.progress").read_text())["next_offset"] == END
    done = posix("restore", TOPIC, "--to-dir", str(out), output="json")
    assert done.exit_code == 0 and done.json()["messages"] == 0
    assert len(data.read_text().splitlines()) == len(KEPT)
