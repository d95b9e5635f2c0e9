"""Which topics are archived: RocketMQ's system topics stay out of cold storage, include/exclude globs pick the rest."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tests.cli.helpers import Node
from tieredstore.config import load_config
from tieredstore.formats.naming import INDEX_TOPIC, cluster_folder
from tieredstore.runtime import open_cold_provider

USER_TOPICS = ("Orders", "%DLQ%billing")  # a dead-letter topic holds user messages: archived too
SYSTEM_TOPICS = ("rmq_sys_x", "SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC")


def put(node: Node, topic: str, queue_id: int, count: int, first: int = 0) -> None:
    bodies = "".join(f"{topic} {n}\n" for n in range(first, first + count))
    result = node("put", topic, str(queue_id), input=bodies, output="json")
    assert result.exit_code == 0, result.stderr


def archive(node: Node) -> None:
    result = node("run", "--once")
    assert result.exit_code == 0, result.stderr


def topics_in_cold_storage(node: Node, monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """The topic folders under the broker's folder in cold storage (the key index's own folder aside)."""
    for name, value in node.env.items():
        monkeypatch.setenv(name, value)
    config = load_config(data_dir=node.data_dir, cold_url=node.cold_url, metadata_url=node.metadata_url)

    async def listing() -> set[str]:
        provider = open_cold_provider(config)
        try:
            return set(await provider.list_children(f"{cluster_folder(config.cluster)}/{config.broker}"))
        finally:
            await provider.close()

    return asyncio.run(listing()) - {INDEX_TOPIC}


def status_rows(node: Node) -> dict[tuple[str, int], dict[str, Any]]:
    result = node("status", output="json")
    assert result.exit_code == 0, result.stderr
    return {(row["topic"], row["queue_id"]): row for row in result.json()["rows"]}


def text_lines(node: Node, topic: str) -> list[str]:
    """The rows of ``status`` in text mode that show ``topic``."""
    text = node("status")
    assert text.exit_code == 0, text.stderr
    lines = [line for line in text.stdout.splitlines() if f" {topic} " in line]
    assert lines, text.stdout
    return lines


def test_system_topics_are_not_archived_and_status_marks_them_excluded(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    for topic in USER_TOPICS + SYSTEM_TOPICS:
        put(node, topic, 0, 12)
    put(node, "SCHEDULE_TOPIC_XXXX", 3, 5)  # a second delay level
    archive(node)

    assert topics_in_cold_storage(node, monkeypatch) == set(USER_TOPICS)
    assert {row["topic"] for row in node("topics", output="json").json()["rows"]} == set(USER_TOPICS)
    rows = status_rows(node)
    assert set(rows) == {(t, 0) for t in USER_TOPICS + SYSTEM_TOPICS} | {("SCHEDULE_TOPIC_XXXX", 3)}
    for (topic, _), row in rows.items():
        if topic in USER_TOPICS:
            assert (row["excluded"], row["excluded_by"], row["archived"], row["lag"]) == (False, None, 12, 0)
        else:
            # Not archived, and not waiting to be: no lag, whatever the hot store holds.
            assert (row["excluded"], row["excluded_by"], row["archived"], row["lag"]) == (
                True,
                "system topic",
                None,
                None,
            )
            assert row["hot_max"] in (5, 12) and row["unarchived_age_ms"] is None
    assert all("system topic" in line for line in text_lines(node, "SCHEDULE_TOPIC_XXXX"))
    assert not any("system topic" in line for line in text_lines(node, "Orders"))


def test_include_and_exclude_globs_come_from_the_config_file_and_the_environment(
    posix: Node, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config_file = tmp_path / "tieredstore.toml"
    config_file.write_text('[archiver]\ntopics_include = ["Orders*", "Audit*", "rmq_sys_*"]\n')
    posix.env["TIEREDSTORE_CONFIG"] = str(config_file)
    posix.env["TIEREDSTORE_ARCHIVER__TOPICS_EXCLUDE"] = json.dumps(["*Debug"])
    for topic in ("Orders", "OrdersDebug", "AuditTrail", "Payments", "rmq_sys_x"):
        put(posix, topic, 0, 4)
    archive(posix)

    assert topics_in_cold_storage(posix, monkeypatch) == {"Orders", "AuditTrail"}
    reasons = {topic: row["excluded_by"] for (topic, _), row in status_rows(posix).items()}
    # Included by a glob is not enough for a system topic: archive_system_topics says so.
    assert reasons == {
        "Orders": None,
        "AuditTrail": None,
        "OrdersDebug": "topics_exclude",
        "Payments": "not in topics_include",
        "rmq_sys_x": "system topic",
    }

    config_file.write_text('[archiver]\ntopics_include = ["rmq_sys_*"]\narchive_system_topics = true\n')
    archive(posix)
    assert topics_in_cold_storage(posix, monkeypatch) == {"Orders", "AuditTrail", "rmq_sys_x"}


def test_a_topic_excluded_after_it_was_archived_stays_readable_and_stops_being_archived(posix: Node) -> None:
    put(posix, "Orders", 0, 10)
    put(posix, "Audit", 0, 10)
    archive(posix)

    posix.env["TIEREDSTORE_ARCHIVER__TOPICS_EXCLUDE"] = json.dumps(["Audit"])
    put(posix, "Orders", 0, 10, first=10)
    put(posix, "Audit", 0, 10, first=10)
    archive(posix)

    rows = status_rows(posix)
    assert (rows[("Orders", 0)]["archived"], rows[("Orders", 0)]["lag"]) == (20, 0)
    audit = rows[("Audit", 0)]
    assert (audit["archived"], audit["hot_max"], audit["lag"], audit["excluded_by"]) == (10, 20, None, "topics_exclude")
    assert audit["commit_log_segments"] >= 1
    assert all("topics_exclude" in line for line in text_lines(posix, "Audit"))
    cold = posix("read", "Audit", "0", "--offset", "0", "--count", "20", "--tier", "cold", output="json")
    assert cold.exit_code == 0, cold.stderr
    assert [m["body"] for m in cold.json_lines()] == [f"Audit {n}" for n in range(10)]
