"""scrub over framed segments: orphans of every kind, written framed, are reported as they are for unframed
ones (a sealed segment's stray tail by its logical size), and --delete leaves an archive that verifies and
reads whole, on POSIX and S3 with SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.framed import DIAGONAL_PAIRS, cold_objects, framed_node_on
from tests.cli.helpers import Node
from tests.cli.test_restore import TOPIC
from tests.cli.test_scrub import MESSAGES, archived, config_of, found, plant, wait_past


@pytest.fixture(params=DIAGONAL_PAIRS)
def framed_node(request: pytest.FixtureRequest, tmp_path: Path) -> Node:
    return framed_node_on(request.param, request, tmp_path)


def test_framed_orphans_of_every_kind_are_reported_and_deleted(
    framed_node: Node, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    node = framed_node
    archived(node)  # and scrub finds no orphan in a fresh framed archive
    planted = plant(node, config_of(node, monkeypatch), 0)
    objects = cold_objects(node, request)
    assert all(objects.is_framed(location) for _, location in planted.orphans)
    report = node("scrub", output="json").json()
    assert found(report) == planted.orphans
    tails = {o["location"]: o["size"] for o in report["orphans"] if o["kind"] == "sealed_tail"}
    assert tails == planted.tail_sizes
    assert node("verify", "--deep", output="json").exit_code == 5  # the planted segment, folder and index file

    wait_past(max(o["last_modified"] for o in report["orphans"]))
    deleted = node("scrub", "--delete", "--older-than", "1s", output="json")
    assert deleted.exit_code == 0, deleted.stderr
    assert found(deleted.json()) == planted.orphans and deleted.json()["deleted"] == len(planted.orphans)
    assert node("scrub", "--older-than", "1s", output="json").json()["orphans"] == []
    verified = node("verify", "--deep", output="json")
    assert verified.exit_code == 0, verified.stdout
    read = node("read", TOPIC, "0", "--offset", "0", "--count", str(MESSAGES), "--tier", "cold", output="json")
    assert read.exit_code == 0, read.stderr
    assert [m["queue_offset"] for m in read.json_lines()] == list(range(MESSAGES))
    assert read.json_lines()[101]["body"] == "order 0-101"
