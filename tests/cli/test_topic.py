"""topic set-retention, retention (dry run, then for real) and topic delete."""

from __future__ import annotations

import os
import time

import pytest

from tests.cli.helpers import Node
from tests.cli.test_restore import TOPIC, archive, produce
from tieredstore.leases import SingleArchiverLock
from tieredstore.metadata import MetadataStore, SegmentUpdate


def age_sealed_segments(node: Node, hours: float) -> int:
    """Pretend the sealed segments' newest messages were stored ``hours`` ago; returns how many."""
    old = int(time.time() * 1000 - hours * 3_600_000)
    with MetadataStore(node.metadata_url or f"sqlite:///{node.data_dir / 'metadata.db'}") as metadata:
        aged = 0
        for (path, kind), rows in metadata.list_all_segments().items():
            for row in rows[:-1]:
                metadata.update_segment(SegmentUpdate(path, kind.value, row.base_offset, end_timestamp=old))
                aged += 1
        return aged


def test_retention_dry_run_then_delete(node: Node) -> None:
    produce(node, 0, 400)
    archive(node)
    changed = node("topic", "set-retention", TOPIC, "2", output="json")
    assert changed.json() == {"topic": TOPIC, "reserve_hours": 2, "status": "ACTIVE"}
    assert node("retention", "--dry-run", output="json").json()["segment_count"] == 0
    nothing = node("retention", "--dry-run")
    assert nothing.stdout.strip() == "retention would remove 0 segments (0 bytes)", "no empty table"
    assert age_sealed_segments(node, 3) >= 2
    assert "would delete" in node("retention", "--dry-run").stdout

    plan = node("retention", "--dry-run", output="json").json()
    assert plan["dry_run"] is True
    assert {s["file_type"] for s in plan["segments"]} == {"COMMIT_LOG", "CONSUME_QUEUE"}
    assert node("segments", TOPIC, "0", output="json").json()["rows"][0]["base_offset"] == 0  # nothing went

    done = node("retention", output="json").json()
    assert done["dry_run"] is False
    assert [(s["file_type"], s["base_offset"]) for s in done["segments"]] == [
        (s["file_type"], s["base_offset"]) for s in plan["segments"]
    ]
    new_min = plan["segments"][0]["min_offset_after"]
    assert new_min > 0
    (row,) = node("status", output="json").json()["rows"]
    assert row["cold_min"] == new_min
    assert node("verify", output="json").exit_code == 0
    assert node("read", TOPIC, "0", "--offset", "0", "--tier", "cold").exit_code == 3
    assert node("read", TOPIC, "0", "--offset", str(new_min), "--tier", "cold").exit_code == 0


def test_topic_delete_refuses_without_yes(node: Node) -> None:
    produce(node, 0, 50)
    produce(node, 1, 10)
    archive(node)
    refused = node("topic", "delete", TOPIC)
    assert refused.exit_code == 2 and "--yes" in refused.stderr
    assert len(node("topics", output="json").json()["rows"]) == 1

    deleted = node("topic", "delete", TOPIC, "--yes", output="json")
    assert deleted.exit_code == 0, deleted.stderr
    assert deleted.json() == {"topic": TOPIC, "queues": 2, "deleted": True}
    assert node("topics", output="json").json()["rows"] == []
    assert node("verify", output="json").json()["ok"] is True  # no orphan object left behind
    assert node("topic", "delete", TOPIC, "--yes").exit_code == 3
    assert node("topic", "set-retention", "Nope", "5").exit_code == 3
    assert node("topic", "set-retention", TOPIC, "0").exit_code == 2


def test_topic_delete_and_retention_refuse_while_an_archiver_runs_on_sqlite(posix: Node) -> None:
    """Both change cold storage under the archiver's open queues (it would write a deleted topic again):
    with SQLite metadata they refuse, exit 7, naming the archiver, and change nothing."""
    produce(posix, 0, 50)
    archive(posix)
    database = posix.data_dir / "metadata.db"
    with SingleArchiverLock(database.resolve()):  # what a running `tieredstore run` holds
        refused = posix("topic", "delete", TOPIC, "--yes")
        assert refused.exit_code == 7
        assert f"an archiver (pid {os.getpid()}) is running" in refused.stderr
        assert "before deleting topic 'Orders'" in refused.stderr
        assert posix("retention").exit_code == 7
        assert posix("retention", "--dry-run").exit_code == 0, "a dry run changes nothing: it may run"
    assert [row["topic"] for row in posix("topics", output="json").json()["rows"]] == [TOPIC]
    assert posix("topic", "delete", TOPIC, "--yes").exit_code == 0


def test_topic_delete_and_retention_refuse_while_an_archiver_heartbeats(node: Node) -> None:
    """Scale-out archivers (PostgreSQL, leases) hold no lock file: a live heartbeat in metadata is what
    says they run, and both commands refuse beside one, naming it."""
    produce(node, 0, 30)
    archive(node)
    url = node.metadata_url or f"sqlite:///{node.data_dir / 'metadata.db'}"
    with MetadataStore(url) as metadata:
        metadata.leases.heartbeat_archiver("archiver-b", hostname="host-b", pid=4242, ttl_ms=60_000)
        refused = node("topic", "delete", TOPIC, "--yes")
        assert refused.exit_code == 7
        assert "1 archiver(s) running on this metadata database: archiver-b (host-b pid 4242)" in refused.stderr
        assert node("retention").exit_code == 7
        assert [row["topic"] for row in node("topics", output="json").json()["rows"]] == [TOPIC]
        metadata.leases.remove_archiver("archiver-b")  # its clean shutdown
    assert node("topic", "delete", TOPIC, "--yes").exit_code == 0


def test_set_retention_takes_seconds_minutes_hours_and_days_and_a_bare_number_is_hours(node: Node) -> None:
    produce(node, 0, 10)
    archive(node)
    for given, hours in (("30s", 30 / 3600), ("15m", 0.25), ("72h", 72), ("7d", 168), ("5", 5), ("90M", 1.5)):
        changed = node("topic", "set-retention", TOPIC, given, output="json")
        assert changed.exit_code == 0, changed.stderr
        assert changed.json()["reserve_hours"] == pytest.approx(hours), given
        [row] = [t for t in node("topics", output="json").json()["rows"] if t["topic"] == TOPIC]
        assert row["reserve_hours"] == pytest.approx(hours), given
    for bad in ("0", "0s", "3w", "1.5h", "5x", "h", ""):
        refused = node("topic", "set-retention", TOPIC, bad)
        assert refused.exit_code == 2, (bad, refused.stderr)
        assert "is not a duration" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1, bad
    [row] = [t for t in node("topics", output="json").json()["rows"] if t["topic"] == TOPIC]
    assert row["reserve_hours"] == pytest.approx(1.5)  # the last good value: nothing was changed by a refusal
