"""Run the ``tieredstore`` entry point in-process under typer's CliRunner isolation, exit codes included."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from tieredstore.cli import main
from tieredstore.formats.message import POS_PHYSICAL_OFFSET
from tieredstore.local import LocalMessageStore


@dataclass(frozen=True)
class CliResult:
    exit_code: int
    stdout_bytes: bytes
    stderr: str

    @property
    def stdout(self) -> str:
        return self.stdout_bytes.decode("utf-8")

    def json(self) -> Any:
        return json.loads(self.stdout)

    def json_lines(self) -> list[Any]:
        return [json.loads(line) for line in self.stdout.splitlines() if line.strip()]


@dataclass
class Node:
    """One node's settings as CLI flags and environment: a data dir, a cold URL, a metadata URL."""

    name: str
    data_dir: Path
    cold_url: str | None = None
    metadata_url: str | None = None
    env: dict[str, str] = field(default_factory=dict)

    @property
    def flags(self) -> list[str]:
        flags = ["--data-dir", str(self.data_dir)]
        if self.cold_url is not None:
            flags += ["--cold-url", self.cold_url]
        if self.metadata_url is not None:
            flags += ["--metadata-url", self.metadata_url]
        return flags

    @property
    def hot_dir(self) -> Path:
        return self.data_dir / "hot"

    def __call__(self, *args: str, input: str | bytes | None = None, output: str | None = None) -> CliResult:
        prefix = [*self.flags, *(["--output", output] if output else [])]
        return invoke([*prefix, *args], input=input, env=self.env)


def put_jsonl(node: Node, topic: str, queue_id: int, items: Sequence[Mapping[str, Any]]) -> None:
    """Put ``items`` (``put --jsonl`` objects) into one queue; every one of them lands."""
    lines = "".join(json.dumps(item) + "\n" for item in items)
    result = node("put", topic, str(queue_id), "--jsonl", input=lines, output="json")
    assert result.exit_code == 0, result.stderr
    assert result.json()["count"] == len(items)


def invoke(args: Sequence[str], *, input: str | bytes | None = None, env: Mapping[str, str] | None = None) -> CliResult:
    runner = CliRunner()
    with runner.isolation(input=input, env=dict(env or {})) as streams:
        code = main(list(args))
        sys.stdout.flush()
        sys.stderr.flush()
        stdout, stderr = streams[0].getvalue(), streams[1].getvalue()
    return CliResult(code, stdout, stderr.decode("utf-8", "replace"))


def hot_records(hot_dir: Path, topic: str, queue_id: int) -> dict[int, bytes]:
    """Every record the hot store holds for a queue, by queue offset (read-only)."""
    with LocalMessageStore(hot_dir, read_only=True) as hot:
        start = hot.min_offset(topic, queue_id)
        stored = hot.read_messages(topic, queue_id, start, max_count=1 << 20, max_bytes=1 << 30)
        return {m.queue_offset: m.raw for m in stored}


def without_physical_offset(raw: bytes) -> bytes:
    """A record's bytes minus PHYSICALOFFSET, the one field that names where a copy lies."""
    return raw[:POS_PHYSICAL_OFFSET] + raw[POS_PHYSICAL_OFFSET + 8 :]
