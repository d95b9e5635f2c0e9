"""Sync keeps the table bounded and honest: rows retention removed from the cold tier leave the table,
snapshots and metadata files stay bounded, ``table compact`` merges small files, the archiver compacts, and a
catalog that lost the table gets it registered again; on POSIX + SQLite and S3 (moto) + PostgreSQL."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy

from tests.table.conftest import TOPIC, TableNode, messages, table_node_on, table_rows
from tests.table.test_sync import assert_rows_are_the_archive, data_files
from tieredstore.metadata import MetadataStore
from tieredstore.metrics import Metrics
from tieredstore.table.background import BackgroundTableSync
from tieredstore.table.recovery import metadata_file_names
from tieredstore.table.schema import METADATA_VERSIONS_KEPT

PAIRS = ["posix-sqlite", pytest.param("s3-postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=PAIRS)
def pair_node(request: pytest.FixtureRequest, tmp_path: Path) -> TableNode:
    return table_node_on(request.param, request, tmp_path)


def sync(node: TableNode, topic: str = TOPIC) -> dict[str, Any]:
    done = node("table", "sync", topic, output="json")
    assert done.exit_code == 0, done.stderr
    (report,) = done.json()["topics"]
    return dict(report)


def min_offsets(node: TableNode) -> dict[int, int]:
    with MetadataStore(node.archive.metadata_url) as metadata:
        return {q.queue_id: q.min_offset for q in metadata.list_queues(TOPIC)}


def test_rows_retention_removes_from_the_cold_tier_leave_the_table(pair_node: TableNode) -> None:
    # 20 consume-queue units a segment (tests.spark.helpers.SETTINGS): queue 0 has five, queue 1 two.
    pair_node.put({(TOPIC, 0): messages(0, range(0, 100)), (TOPIC, 1): messages(1, range(0, 40))})
    assert sync(pair_node)["rows_added"] == 140
    # The messages were stored in May 2026: every sealed segment is past a one-hour retention.
    assert pair_node("topic", "set-retention", TOPIC, "1").exit_code == 0
    removed = pair_node("retention", output="json")
    assert removed.exit_code == 0, removed.stderr
    lows = min_offsets(pair_node)
    assert lows[0] > 0 and lows[1] > 0, lows

    report = sync(pair_node)

    expected = [row for row in pair_node.expected() if row["queue_offset"] >= lows[row["queue_id"]]]
    assert report["rows_trimmed"] == 140 - len(expected)
    assert report["rows_added"] == 0
    assert table_rows(pair_node.table()) == expected
    # Done once: the next sync plans no trim and commits nothing.
    snapshots = len(pair_node.table().snapshots())
    assert sync(pair_node)["rows_trimmed"] == 0
    assert len(pair_node.table().snapshots()) == snapshots
    # And new messages still arrive exactly once.
    pair_node.put({(TOPIC, 0): messages(0, range(100, 110))})
    assert sync(pair_node)["rows_added"] == 10
    assert len(table_rows(pair_node.table())) == len(expected) + 10


def test_many_small_syncs_then_compact_gives_fewer_files_and_the_same_rows(pair_node: TableNode) -> None:
    for start in range(0, 60, 10):
        pair_node.put(
            {(TOPIC, 0): messages(0, range(start, start + 10)), (TOPIC, 1): messages(1, range(start, start + 10))}
        )
        assert sync(pair_node)["rows_added"] == 20
    rows_before = table_rows(pair_node.table())
    files_before = len(data_files(pair_node.table()))
    assert files_before == 6  # one file a sync: all on one day

    compacted = pair_node("table", "compact", output="json")

    assert compacted.exit_code == 0, compacted.stderr
    (report,) = compacted.json()["topics"]
    assert (report["topic"], report["files_before"], report["files_after"], report["rows"]) == (TOPIC, 6, 1, 120)
    assert len(data_files(pair_node.table())) == 1
    assert table_rows(pair_node.table()) == rows_before
    text = pair_node("table", "compact", TOPIC)
    assert text.stdout.strip() == f"table {TOPIC}: 1 -> 1 data files, 120 rows"
    # The compaction carried the offsets: the next sync adds exactly the new messages.
    pair_node.put({(TOPIC, 1): messages(1, range(60, 75))})
    assert sync(pair_node)["rows_added"] == 15
    assert_rows_are_the_archive(pair_node)


def test_compact_of_an_unknown_topic_is_exit_3(pair_node: TableNode) -> None:
    refused = pair_node("table", "compact", "nosuch")
    assert refused.exit_code == 3
    assert len(refused.stderr.strip().splitlines()) == 1


def test_snapshots_and_metadata_files_stay_bounded_over_many_syncs(pair_node: TableNode) -> None:
    pair_node.node.env.update(
        {"TIEREDSTORE_TABLE__SNAPSHOT_MAX_AGE": "0", "TIEREDSTORE_TABLE__SNAPSHOT_RETAIN_LAST": "3"}
    )
    syncs = METADATA_VERSIONS_KEPT + 5
    for offset in range(syncs):
        pair_node.put({(TOPIC, 0): messages(0, [offset])})
        assert sync(pair_node)["rows_added"] == 1
        # An append and an expiry a sync: the newest three snapshots, and at most one about to expire.
        assert len(pair_node.table().snapshots()) <= 3 + 1

    assert_rows_are_the_archive(pair_node)
    names = [name for name in metadata_file_names(pair_node.config(), TOPIC) if name.endswith(".metadata.json")]
    # Every sync committed at least once: without the bound there would be more than ``syncs`` of them.
    assert len(names) <= METADATA_VERSIONS_KEPT + 1 < syncs


def test_a_table_the_catalog_lost_is_registered_again_and_nothing_is_added_twice(
    pair_node: TableNode, caplog: pytest.LogCaptureFixture
) -> None:
    pair_node.put({(TOPIC, 0): messages(0, range(0, 50)), (TOPIC, 1): messages(1, range(0, 30), day=1)})
    assert sync(pair_node)["rows_added"] == 80
    files = sorted(data_files(pair_node.table()))
    # The catalog's rows are lost (its tables dropped), the table's files remain on the cold tier.
    engine = sqlalchemy.create_engine(pair_node.archive.metadata_url)
    with engine.begin() as connection:
        connection.execute(sqlalchemy.text("DROP TABLE iceberg_tables"))
        connection.execute(sqlalchemy.text("DROP TABLE iceberg_namespace_properties"))
    engine.dispose()
    pair_node.put({(TOPIC, 0): messages(0, range(50, 60))})

    synced = pair_node("table", "sync", TOPIC, output="json")

    assert synced.exit_code == 0, synced.stderr
    (report,) = synced.json()["topics"]
    assert (report["registered"], report["rows_added"], report["orphans_deleted"]) == (True, 10, 0)
    assert "the catalog had no table" in caplog.text and "registered it again" in caplog.text
    assert_rows_are_the_archive(pair_node)
    assert set(files) <= set(data_files(pair_node.table()))  # the old files are the table's again
    assert sync(pair_node)["registered"] is False


def test_the_archivers_table_sync_compacts_every_compact_interval(pair_node: TableNode) -> None:
    config = pair_node.config(compact_interval=0.5)
    background = BackgroundTableSync(config, Metrics())
    for start in range(0, 40, 10):
        pair_node.put({(TOPIC, 0): messages(0, range(start, start + 10))})
        background.sync_all()
    # Rounds go on without new messages until the interval has passed and the round compacted.
    deadline = time.monotonic() + 30
    while len(data_files(pair_node.table())) > 1 and time.monotonic() < deadline:
        time.sleep(0.1)
        background.sync_all()

    assert background.compactions >= 1
    assert len(data_files(pair_node.table())) == 1
    assert_rows_are_the_archive(pair_node)


def test_a_sync_sets_the_metadata_bounds_again_on_a_table_that_lost_them(pair_node: TableNode) -> None:
    pair_node.put({(TOPIC, 0): messages(0, range(0, 5))})
    sync(pair_node)
    table = pair_node.table()
    assert table.properties["write.metadata.delete-after-commit.enabled"] == "true"
    with table.transaction() as transaction:  # as another tool might
        transaction.set_properties(
            {"write.metadata.delete-after-commit.enabled": "false", "commit.retry.num-retries": "4"}
        )

    sync(pair_node)

    properties = pair_node.table().properties
    assert properties["write.metadata.delete-after-commit.enabled"] == "true"
    assert properties["write.metadata.previous-versions-max"] == str(METADATA_VERSIONS_KEPT)
    assert properties["commit.retry.num-retries"] == "0"


def test_a_lost_sqlite_metadata_file_rebuilt_from_cold_gets_its_table_back(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    node = table_node_on("posix-sqlite", request, tmp_path)
    node.put({(TOPIC, 0): messages(0, range(0, 50)), (TOPIC, 1): messages(1, range(0, 30))})
    assert sync(node)["rows_added"] == 80
    files = sorted(data_files(node.table()))
    # The SQLite file, and with it the catalog, is lost; the archive's metadata is rebuilt from the cold tier.
    (node.node.data_dir / "metadata.db").rename(node.node.data_dir / "lost.db")
    rebuilt = node("db", "rebuild", "--from-cold", output="json")
    assert rebuilt.exit_code == 0, rebuilt.stderr

    report = sync(node)

    assert (report["registered"], report["rows_added"], report["orphans_deleted"]) == (True, 0, 0)
    assert sorted(data_files(node.table())) == files
    assert all(Path(path.removeprefix("file://")).exists() for path in files)
    assert_rows_are_the_archive(node)
    node.put({(TOPIC, 1): messages(1, range(30, 42))})
    assert sync(node)["rows_added"] == 12
    assert_rows_are_the_archive(node)
