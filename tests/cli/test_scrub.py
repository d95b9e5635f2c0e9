"""scrub: planted orphans (a sealed segment's stray tail, an unrecorded segment, an unknown topic's folder, an
uncatalogued index file), young and old, are reported exactly; --delete removes only the old ones, and then
verify --deep is clean and every message still reads."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs

from tests.cli.helpers import Node
from tests.cli.test_restore import TOPIC, archive, produce
from tieredstore.config import TieredStoreConfig, load_config
from tieredstore.formats.naming import FileType, index_path, queue_path, segment_key
from tieredstore.leases import SingleArchiverLock
from tieredstore.metadata import MetadataStore, SegmentStatus, SegmentUpdate
from tieredstore.metrics import Metrics
from tieredstore.providers.base import ListsObjects, Provider
from tieredstore.runtime import open_cold_provider
from tieredstore.scrub import Scrubber, ScrubReport, ScrubScope

MESSAGES = 400
CLUSTER, BROKER = "DefaultCluster", "broker-a"
QUEUE = queue_path(CLUSTER, BROKER, TOPIC, 0)
GHOST = "Ghost"
INDEX_ROOT = index_path(CLUSTER, BROKER)
HOUR_MS = 3_600_000


@dataclass(frozen=True)
class Planted:
    """Where each planted orphan is: (kind, location) as scrub reports them."""

    orphans: frozenset[tuple[str, str]]
    tail_sizes: dict[str, int]
    recorded_sizes: dict[str, int]  # of the sealed segment the tail was put behind


def config_of(node: Node, monkeypatch: pytest.MonkeyPatch) -> TieredStoreConfig:
    for name, value in node.env.items():
        monkeypatch.setenv(name, value)
    return load_config(data_dir=node.data_dir, cold_url=node.cold_url, metadata_url=node.metadata_url)


def metadata_url(node: Node) -> str:
    return node.metadata_url or f"sqlite:///{node.data_dir / 'metadata.db'}"


def sealed_followed_on(node: Node) -> list[int]:
    """Base offsets of queue 0's SEALED commit-log segments that the next segment follows on from."""
    with MetadataStore(metadata_url(node)) as metadata:
        rows = metadata.list_segments(QUEUE, FileType.COMMIT_LOG.value)
    return [
        row.base_offset
        for row, after in itertools.pairwise(rows)
        if row.status is SegmentStatus.SEALED and after.base_offset == row.base_offset + row.size
    ]


async def _commit(provider: Provider, kind: FileType, path: str, base: int, data: bytes, at: int = 0) -> str:
    segment = provider.segment(kind, path, base, commit_position=at)
    segment.append(data)
    await segment.commit()
    return segment.key


async def _plant(config: TieredStoreConfig, tail_of: int, tail_at: int, ordinal: int) -> None:
    """One orphan of each kind; ``ordinal`` keeps the young set apart from the old one."""
    async with open_cold_provider(config) as provider:
        await _commit(provider, FileType.COMMIT_LOG, QUEUE, tail_of, b"\x07" * 300, at=tail_at)
        kind = FileType.COMMIT_LOG if ordinal == 0 else FileType.CONSUME_QUEUE
        await _commit(provider, kind, QUEUE, 10_000_000 + 20 * ordinal, b"s" * 40)
        ghost = queue_path(CLUSTER, BROKER, GHOST, ordinal)
        await _commit(provider, FileType.CONSUME_QUEUE, ghost, 0, b"\0" * 20)
        await _commit(provider, FileType.INDEX, INDEX_ROOT, 12_345 + ordinal, b"i" * 64)


def plant(node: Node, config: TieredStoreConfig, ordinal: int) -> Planted:
    """Plant one orphan of each kind (``ordinal`` 0: the old set, 1: the young set)."""
    tail_of = sealed_followed_on(node)[ordinal]
    with MetadataStore(metadata_url(node)) as metadata:
        size = next(r.size for r in metadata.list_segments(QUEUE, "COMMIT_LOG") if r.base_offset == tail_of)
    asyncio.run(_plant(config, tail_of, size, ordinal))
    kind = FileType.COMMIT_LOG if ordinal == 0 else FileType.CONSUME_QUEUE
    tail = segment_key(QUEUE, FileType.COMMIT_LOG, tail_of)
    return Planted(
        frozenset(
            {
                ("sealed_tail", tail),
                ("segment", segment_key(QUEUE, kind, 10_000_000 + 20 * ordinal)),
                ("folder", segment_key(queue_path(CLUSTER, BROKER, GHOST, ordinal), FileType.CONSUME_QUEUE, 0)),
                ("index_file", segment_key(INDEX_ROOT, FileType.INDEX, 12_345 + ordinal)),
            }
        ),
        {tail: 300},
        {tail: size},
    )


async def _listing(config: TieredStoreConfig) -> list[tuple[str, int]]:
    async with open_cold_provider(config) as provider:
        assert isinstance(provider, ListsObjects)
        return [(o.key, o.size) for o in await provider.list_objects("")]


def listing(config: TieredStoreConfig) -> list[tuple[str, int]]:
    return asyncio.run(_listing(config))


def found(report: dict[str, object]) -> set[tuple[str, str]]:
    orphans = report["orphans"]
    assert isinstance(orphans, list)
    return {(o["kind"], o["location"]) for o in orphans}


def by_action(report: dict[str, object], action: str) -> set[tuple[str, str]]:
    orphans = report["orphans"]
    assert isinstance(orphans, list)
    return {(o["kind"], o["location"]) for o in orphans if o["action"] == action}


async def _scrub(config: TieredStoreConfig, metrics: Metrics, **arguments: int | bool) -> ScrubReport:
    async with open_cold_provider(config) as provider:
        with MetadataStore(config.effective_metadata_url) as metadata:
            scope = ScrubScope(config.cluster, config.broker)
            return await Scrubber(metadata, provider, metrics).scrub(scope, **arguments)  # type: ignore[arg-type]


@contextlib.contextmanager
def info_logs_captured() -> Iterator[list[dict[str, Any]]]:
    """Info lines captured, whatever level the last CLI call configured."""
    saved = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG))
    try:
        with capture_logs() as logs:
            yield logs
    finally:
        structlog.configure(**saved)


def archived(node: Node) -> None:
    produce(node, 0, MESSAGES)
    produce(node, 1, 30)
    archive(node)
    clean = node("scrub", "--older-than", "1s", output="json")
    assert clean.exit_code == 0, clean.stderr
    assert clean.json()["orphans"] == [], "a fresh archive has no orphan"
    assert len(sealed_followed_on(node)) >= 2, "the test needs two sealed commit-log segments"


def wait_past(last_modified_ms: int) -> None:
    """Until this clock is a whole second past ``last_modified_ms`` (S3 stamps objects to the second)."""
    deadline = time.monotonic() + 30
    while time.time_ns() // 1_000_000 <= last_modified_ms + 1000:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_dry_run_reports_exactly_the_orphans_then_delete_removes_only_old_ones(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    archived(node)
    config = config_of(node, monkeypatch)
    old = plant(node, config, 0)
    old_report = node("scrub", output="json").json()
    assert found(old_report) == old.orphans
    wait_past(max(o["last_modified"] for o in old_report["orphans"]))
    young = plant(node, config, 1)
    before = listing(config)

    dry = node("scrub", output="json")
    assert dry.exit_code == 0, dry.stderr
    report = dry.json()
    assert report["dry_run"] is True and report["older_than_ms"] == 24 * HOUR_MS
    assert found(report) == old.orphans | young.orphans
    assert by_action(report, "kept") == old.orphans | young.orphans  # nothing is 24 h old
    tails = {o["location"]: o["size"] for o in report["orphans"] if o["kind"] == "sealed_tail"}
    assert tails == old.tail_sizes | young.tail_sizes
    reasons = {o["kind"]: o["reason"] for o in report["orphans"]}
    assert "the topic is not in the metadata store" in reasons["folder"]
    assert "catalogue has no row" in reasons["index_file"]
    assert listing(config) == before, "a dry run deletes nothing"
    text = node("scrub")
    assert text.exit_code == 0
    assert "scrub: 8 orphans (848 bytes): dry run: 0 would be deleted (0 bytes) with --delete, 8 kept" in text.stdout
    assert all(location in text.stdout for _, location in old.orphans | young.orphans)
    assert listing(config) == before

    # The window against the storage's own times: only what was written before the young set goes.
    young_since = min(o["last_modified"] for o in report["orphans"] if (o["kind"], o["location"]) in young.orphans)
    metrics = Metrics()
    with info_logs_captured() as logs:
        deleted = asyncio.run(_scrub(config, metrics, older_than_ms=1, delete=True, now_ms=young_since))
    done = deleted.as_json()
    assert by_action(done, "deleted") == old.orphans and by_action(done, "kept") == young.orphans
    deletions = [entry for entry in logs if entry["event"] == "orphan deleted by scrub"]
    assert {(entry["kind"], entry["location"]) for entry in deletions} == old.orphans
    samples = {
        kind: metrics.registry.get_sample_value("tieredstore_scrub_deleted_objects_total", {"file_type": kind})
        for kind in ("COMMIT_LOG", "CONSUME_QUEUE", "INDEX")
    }
    assert samples == {"COMMIT_LOG": 2, "CONSUME_QUEUE": 1, "INDEX": 1}
    freed = sum(
        metrics.registry.get_sample_value("tieredstore_scrub_deleted_bytes_total", {"file_type": kind}) or 0
        for kind in ("COMMIT_LOG", "CONSUME_QUEUE", "INDEX")
    )
    assert freed == done["deleted_bytes"] == 300 + 40 + 20 + 64
    left = node("scrub", output="json").json()
    assert found(left) == young.orphans

    # Once the young set is old enough too, the CLI deletes it; then the archive is as metadata says.
    wait_past(max(o["last_modified"] for o in left["orphans"]))
    cleared = node("scrub", "--delete", "--older-than", "1s", output="json")
    assert cleared.exit_code == 0, cleared.stderr
    assert by_action(cleared.json(), "deleted") == young.orphans
    assert node("scrub", "--older-than", "1s", output="json").json()["orphans"] == []
    verified = node("verify", "--deep", output="json")
    assert verified.exit_code == 0, verified.stdout
    assert not [note for note in verified.json()["notes"] if "sealed segment" in note]
    read = node("read", TOPIC, "0", "--offset", "0", "--count", str(MESSAGES), "--tier", "cold", output="json")
    assert read.exit_code == 0, read.stderr
    assert [m["queue_offset"] for m in read.json_lines()] == list(range(MESSAGES))
    assert read.json_lines()[101]["body"] == "order 0-101"


def test_delete_with_a_window_of_an_hour_removes_what_is_older_on_posix(
    posix: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    archived(posix)
    config = config_of(posix, monkeypatch)
    old = plant(posix, config, 0)
    young = plant(posix, config, 1)
    two_hours_ago = time.time() - 2 * 3600
    cold = posix.data_dir / "cold"
    for _, location in old.orphans:
        os.utime(cold / location, (two_hours_ago, two_hours_ago))
    result = posix("scrub", "--delete", "--older-than", "1h", "--progress", output="json")
    assert result.exit_code == 0, result.stderr
    assert "scrub: listing" in result.stderr and "4/4" in result.stderr  # 2 queues, the folders, the key index
    report = result.json()
    assert report["dry_run"] is False
    assert by_action(report, "deleted") == old.orphans and by_action(report, "kept") == young.orphans
    for kind, location in old.orphans:
        if kind == "sealed_tail":
            assert (cold / location).stat().st_size == old.recorded_sizes[location], "cut back to its recorded size"
        else:
            assert not (cold / location).exists()
    assert all((cold / location).exists() for _, location in young.orphans)
    assert found(posix("scrub", output="json").json()) == young.orphans


def test_a_topic_narrows_the_scrub(node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    archived(node)
    config = config_of(node, monkeypatch)
    planted = plant(node, config, 0)
    mine = node("scrub", TOPIC, "--older-than", "1s", output="json").json()
    assert found(mine) == {(k, loc) for k, loc in planted.orphans if k in ("segment", "sealed_tail")}
    ghost = node("scrub", GHOST, output="json").json()
    assert found(ghost) == {(k, loc) for k, loc in planted.orphans if k == "folder"}
    assert node("scrub", "Other", output="json").json()["orphans"] == []
    before = listing(config)
    wait_past(max(o["last_modified"] for o in ghost["orphans"]))
    gone = node("scrub", GHOST, "--delete", "--older-than", "1s", output="json").json()
    assert by_action(gone, "deleted") == found(ghost)
    after = listing(config)
    assert {key for key, _ in before} - {key for key, _ in after} == {
        key for key, _ in before if key.startswith(queue_path(CLUSTER, BROKER, GHOST, 0))
    }, "only the Ghost topic's objects went"


def test_delete_is_refused_while_an_archiver_runs_and_a_dry_run_says_so(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    archived(node)
    config = config_of(node, monkeypatch)
    planted = plant(node, config, 0)
    before = listing(config)
    with contextlib.ExitStack() as running:
        if node.metadata_url is None:  # what a running `tieredstore run` holds on SQLite
            running.enter_context(SingleArchiverLock((node.data_dir / "metadata.db").resolve()))
        else:  # a scale-out archiver's live heartbeat on PostgreSQL
            metadata = running.enter_context(MetadataStore(metadata_url(node)))
            metadata.leases.heartbeat_archiver("archiver-b", hostname="host-b", pid=4242, ttl_ms=60_000)
            running.callback(metadata.leases.remove_archiver, "archiver-b")
        refused = node("scrub", "--delete", "--older-than", "1s")
        assert refused.exit_code == 7, refused.stderr
        assert "before deleting orphans (scrub --delete)" in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
        dry = node("scrub", "--older-than", "1s")
        assert dry.exit_code == 0
        assert "orphans younger than the window may be commits in flight" in dry.stderr
        assert all(location in dry.stdout for _, location in planted.orphans)
    assert listing(config) == before


def test_a_garbage_window_is_one_line_exit_2_and_nothing_is_listed_or_deleted(
    posix: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    archived(posix)
    config = config_of(posix, monkeypatch)
    plant(posix, config, 0)
    before = listing(config)
    for window in ("soon", "0", "-5m", "1w", "1.5h", ""):
        result = posix("scrub", "--delete", "--older-than", window)
        assert result.exit_code == 2, (window, result.stderr)
        assert result.stdout == "" and len(result.stderr.strip().splitlines()) == 1
        assert "is not a duration" in result.stderr
    assert listing(config) == before


def test_a_segment_a_cut_short_retention_left_deleting_is_an_orphan(posix: Node) -> None:
    """Retention deletes the objects, then marks the row DELETED: cut in between, the objects stay behind."""
    archived(posix)
    with MetadataStore(metadata_url(posix)) as metadata:
        first = metadata.list_segments(QUEUE, FileType.COMMIT_LOG.value)[0]
        metadata.update_segment(
            SegmentUpdate(QUEUE, FileType.COMMIT_LOG.value, first.base_offset, status=SegmentStatus.DELETING)
        )
    report = posix("scrub", TOPIC, output="json").json()
    (orphan,) = report["orphans"]
    assert (orphan["kind"], orphan["base_offset"], orphan["size"]) == ("segment", first.base_offset, first.size)
    assert orphan["reason"].endswith("(its row is DELETING)")
