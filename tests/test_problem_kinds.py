"""verify speaks one vocabulary: every kind it reports, in JSON or to a library caller, is a ``ProblemKind``."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.cli.conftest import SMALL_FILES
from tests.cli.helpers import Node
from tests.cli.test_verify import archived, segment_files
from tieredstore.cli.verify import verify_archive
from tieredstore.config import load_config
from tieredstore.flat.checker import ProblemKind, kind_of
from tieredstore.formats.naming import segment_name
from tieredstore.formats.records import Fault
from tieredstore.read.node import open_read_node


def test_a_record_fault_is_corruption_unless_the_record_is_only_misplaced() -> None:
    misplaced = {Fault.QUEUE_OFFSET, Fault.PHYSICAL_OFFSET, Fault.TOPIC, Fault.QUEUE_ID, Fault.TAG_HASH}
    assert {fault: kind_of(fault) for fault in Fault if fault not in misplaced} == {
        fault: ProblemKind.CORRUPT_RECORD for fault in Fault if fault not in misplaced
    }
    assert kind_of(Fault.TOPIC) is kind_of(Fault.QUEUE_ID) is ProblemKind.WRONG_QUEUE


def test_the_kinds_verify_reports_are_the_vocabulary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    node = Node("posix-sqlite", tmp_path / "node", env=dict(SMALL_FILES))
    archived(node)
    commit_logs = segment_files(node, "COMMIT_LOG")
    (commit_logs[0].parent / segment_name(10_000_000)).write_bytes(commit_logs[0].read_bytes())
    segment_files(node, "CONSUME_QUEUE")[0].unlink()
    result = node("verify", output="json")
    assert result.exit_code == 5
    reported = [problem["kind"] for problem in result.json()["problems"]]
    assert sorted(reported) == ["MISSING_OBJECT", "ORPHAN_OBJECT"]

    for name, value in node.env.items():
        monkeypatch.setenv(name, value)

    async def library_report() -> list[ProblemKind]:
        async with open_read_node(load_config(data_dir=node.data_dir)) as read_node:
            return [problem.kind for problem in (await verify_archive(read_node)).problems]

    kinds = asyncio.run(library_report())
    assert sorted(kinds) == [ProblemKind.MISSING_OBJECT, ProblemKind.ORPHAN_OBJECT]
    assert all(isinstance(kind, ProblemKind) for kind in kinds)
