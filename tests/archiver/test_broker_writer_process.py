"""A sidecar archiver beside a broker-like writer process that deletes its old files while the archiver follows.

The writer (tests.archiver.broker_writer) puts with RocketMQ's file layout at scaled-down sizes, writes a
broker's checkpoint after each flush and deletes its oldest files by age, whatever the archive holds. It
logs, per message, where it lies, and when each flush and each deletion happened. Every message that stayed
on disk, flushed, for longer than the group-commit timeout (plus a scan's slack) is archived exactly once,
byte for byte; every other one is archived or recorded as lost, never both and never twice. Expectations
come from the writer's log, not from how fast anything ran.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import signal
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.archiver.broker_writer import FILE_SIZE
from tests.archiver.processes import (
    child_env,
    run_tieredstore,
    start_broker_writer,
    start_tieredstore,
    wait_for_text,
)
from tieredstore.config import load_config
from tieredstore.flat import FlatFileStore
from tieredstore.formats.message import decode
from tieredstore.metadata import MetadataStore
from tieredstore.runtime import open_cold_provider

GROUP_COMMIT_TIMEOUT = 0.3
# How far an archiver may fall behind on a loaded machine beyond the group-commit timeout. A file lives
# RETENTION seconds past its last record, so a message stays on disk, flushed, about that long: more than
# both together, and so every message must be archived unless the archiver fell further behind.
SCAN_SLACK = 3.0
RETENTION = 5.0
SECONDS = 8.0
RATE = 300.0
UNTIL_SECONDS = 90.0

QueueKey = tuple[str, int]


@dataclass
class WriterLog:
    """What the writer process said: each put, each flush's covered end, each commit-log file deleted."""

    puts: dict[QueueKey, list[tuple[int, int, int]]] = field(default_factory=dict)  # (offset, end, crc) by offset
    durable: list[tuple[int, float]] = field(default_factory=list)
    deleted: dict[int, float] = field(default_factory=dict)
    done: bool = False

    @classmethod
    def read(cls, path: Path) -> WriterLog:
        log = cls()
        for line in path.read_text().splitlines():
            kind, *fields = line.split()
            if kind == "PUT":
                topic, queue_id, queue_offset, commitlog_offset, size, crc = fields
                queue = log.puts.setdefault((topic, int(queue_id)), [])
                assert int(queue_offset) == len(queue), "the writer's queue offsets are contiguous"
                queue.append((int(commitlog_offset), int(commitlog_offset) + int(size), int(crc)))
            elif kind == "DURABLE":
                log.durable.append((int(fields[0]), float(fields[1])))
            elif kind == "DELETED":
                log.deleted[int(fields[0])] = float(fields[2])
            elif kind == "DONE":
                log.done = True
        return log

    def flushed_for(self, commitlog_offset: int, end: int) -> float | None:
        """How long the record stayed on disk once flushed (None: its file was never deleted)."""
        deleted = self.deleted.get(commitlog_offset - commitlog_offset % FILE_SIZE)
        if deleted is None:
            return None
        ends = [covered for covered, _ in self.durable]
        flushed = self.durable[bisect.bisect_left(ends, end)][1]
        return deleted - flushed


def _settings(tmp_path: Path, cold: str, request: pytest.FixtureRequest) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "TIEREDSTORE_DATA_DIR": tmp_path / "data",
        "TIEREDSTORE_ARCHIVER__GROUP_COMMIT_TIMEOUT": GROUP_COMMIT_TIMEOUT,
        "TIEREDSTORE_ARCHIVER__SCAN_INTERVAL": 0.05,
        "TIEREDSTORE_SEGMENTS__COMMIT_LOG_MAX_SIZE": 256 << 10,
    }
    if cold == "posix":
        settings["TIEREDSTORE_COLD_URL"] = tmp_path / "cold"
    else:
        settings["TIEREDSTORE_COLD_URL"] = request.getfixturevalue("s3_bucket_url")
        settings.update(request.getfixturevalue("s3_server").settings())
    return settings


def _archived_ends(metadata_url: str) -> dict[QueueKey, int]:
    with MetadataStore(metadata_url) as metadata:
        return {(queue.topic, queue.queue_id): queue.max_offset for queue in metadata.list_queues()}


async def _cold_copy(config: Any) -> dict[QueueKey, tuple[dict[int, bytes], list[tuple[int, int]]]]:
    """Each queue's archived records by queue offset, and its lost ranges, read back from cold storage."""
    copies: dict[QueueKey, tuple[dict[int, bytes], list[tuple[int, int]]]] = {}
    with MetadataStore(config.effective_metadata_url) as metadata:
        provider = open_cold_provider(config)
        try:
            flat = FlatFileStore(provider, metadata, cluster=config.cluster, broker=config.broker)
            await flat.recover()
            for queue in metadata.list_queues():
                flat_file = flat.get(queue.topic, queue.queue_id)
                records: dict[int, bytes] = {}
                for start, end in flat_file.archived_runs:
                    for offset, raw in enumerate(await flat_file.read_messages(start, end - start), start):
                        records[offset] = raw
                copies[(queue.topic, queue.queue_id)] = (records, flat_file.lost_ranges)
        finally:
            await provider.close()
    return copies


# On S3 (moto over HTTP) it takes about 20 s: with the reliability scenarios.
@pytest.mark.parametrize("cold", ["posix", pytest.param("s3", marks=pytest.mark.reliability)])
def test_every_message_that_stayed_on_disk_past_the_group_commit_is_archived_once_while_the_broker_deletes_files(
    tmp_path: Path, cold: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = _settings(tmp_path, cold, request)
    env = child_env(settings)
    for name, value in settings.items():
        monkeypatch.setenv(name, str(value))
    config = load_config()  # the archiver's, from the same settings
    hot_dir = tmp_path / "data" / "hot"
    hot_dir.mkdir(parents=True)
    events = tmp_path / "writer.log"
    archiver_err = tmp_path / "archiver.err"
    archiver = start_tieredstore(["--output", "json", "run", "--no-demo", "--hot-mode", "follower"], env, archiver_err)
    writer = None
    try:
        # The archiver follows (the empty store) before the broker writes: its start-up is not retention's race.
        wait_for_text(archiver_err, "archiving ", timeout=UNTIL_SECONDS)
        writer = start_broker_writer(hot_dir, SECONDS, RATE, RETENTION, env, events)
        assert writer.wait(timeout=SECONDS + UNTIL_SECONDS) == 0, events.with_suffix(".err").read_text()
        log = WriterLog.read(events)
        assert log.done
        final = {key: len(puts) for key, puts in log.puts.items()}
        deadline = time.monotonic() + UNTIL_SECONDS
        while _archived_ends(config.effective_metadata_url) != final:
            assert archiver.poll() is None, archiver_err.read_text()
            assert time.monotonic() < deadline, f"not archived within {UNTIL_SECONDS}s: {archiver_err.read_text()}"
            time.sleep(0.2)
        archiver.send_signal(signal.SIGTERM)
        stdout, _ = archiver.communicate(timeout=60)
    finally:
        for process in (writer, archiver):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
    assert archiver.returncode == 0, archiver_err.read_text()
    summary = json.loads(stdout.decode().strip().splitlines()[-1])

    # Retention ran while the archiver followed: files went, with messages the archiver had taken in them.
    assert len(log.deleted) >= 3
    copies = asyncio.run(_cold_copy(config))
    assert set(copies) == set(log.puts)
    must, kept_after_deletion, lost = 0, 0, 0
    for key, puts in log.puts.items():
        records, lost_ranges = copies[key]
        lost_offsets = {offset for start, end in lost_ranges for offset in range(start, end)}
        assert not lost_offsets & set(records), f"{key}: an offset both archived and recorded as lost"
        assert set(records) | lost_offsets == set(range(len(puts))), f"{key}: an offset neither archived nor lost"
        for offset, (commitlog_offset, end, crc) in enumerate(puts):
            stayed = log.flushed_for(commitlog_offset, end)
            if offset in records:
                record = decode(records[offset])
                assert (record.topic, record.queue_id, record.queue_offset) == (*key, offset)
                assert zlib.crc32(record.body) == crc, f"{key}@{offset} is not the message put there"
                kept_after_deletion += stayed is not None
            else:
                lost += 1
            if stayed is None or stayed > GROUP_COMMIT_TIMEOUT + SCAN_SLACK:
                must += 1
                assert offset in records, f"{key}@{offset} stayed {stayed}s on disk, flushed, and is not archived"
    assert kept_after_deletion > 0, "some archived messages had their hot file deleted afterwards"
    assert must > 0
    assert summary["lost_messages"] == lost
    deep = run_tieredstore(["--output", "json", "verify", "--deep"], env, timeout=120)
    assert deep.returncode == 0, deep.stdout + deep.stderr
