"""Exactly once when syncers race or retention moved on: a commit lost to another syncer is planned again from
the table's new offsets, and a queue whose older data retention removed starts at what is still archived."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.table.conftest import TOPIC, messages, table_node_on, table_rows
from tieredstore.metadata import MetadataStore, QueuePosition
from tieredstore.table.catalog import open_catalog
from tieredstore.table.sync import QueueProgress, TableSyncer, create_table, queue_progress


@pytest.mark.parametrize("pair", ["posix-sqlite", pytest.param("s3-postgres", marks=pytest.mark.postgres)])
def test_a_commit_lost_to_another_syncer_is_planned_again_and_no_row_is_written_twice(
    pair: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    node = table_node_on(pair, request, tmp_path)
    node.put({(TOPIC, 0): messages(0, range(70)), (TOPIC, 1): messages(1, range(30))})
    config = node.config()
    metadata = MetadataStore(config.effective_metadata_url)
    # A table another tool set to retry lost commits (pyiceberg's default): sync turns that off again.
    with create_table(open_catalog(config), config, TOPIC).transaction() as transaction:
        transaction.set_properties({"commit.retry.num-retries": "4"})
    try:
        ours = TableSyncer(config, metadata, open_catalog(config))
        theirs = TableSyncer(config, metadata, open_catalog(config))
        raced: list[int] = []

        def other_syncer_commits_first() -> None:
            if not raced:
                raced.append(theirs.sync_topic(TOPIC).rows_added)

        result = ours.sync_topic(TOPIC, before_commit=other_syncer_commits_first)
    finally:
        metadata.close()
    assert raced == [100]  # the other syncer appended everything between our read and our commit
    assert (result.conflicts, result.rows_added, result.lag) == (1, 0, 0)
    rows = table_rows(node.table())
    assert [(r["queue_id"], r["queue_offset"]) for r in rows] == [(0, o) for o in range(70)] + [
        (1, o) for o in range(30)
    ]
    assert rows == node.expected()
    assert node.table().properties["commit.retry.num-retries"] == "0"


def test_a_commit_lost_while_the_next_rows_are_read_is_planned_again(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    node = table_node_on("posix-sqlite", request, tmp_path)
    # ~3 MiB of rows at 1 MiB commits: the first commits are made while the rows after them are read.
    node.put({(TOPIC, q): messages(q, range(200), body_size=4096) for q in range(4)})
    config = node.config(target_file_size=1 << 20)
    metadata = MetadataStore(config.effective_metadata_url)
    try:
        ours = TableSyncer(config, metadata, open_catalog(config))
        theirs = TableSyncer(config, metadata, open_catalog(config))
        commits: list[int] = []

        def other_syncer_commits_second() -> None:
            commits.append(len(commits))
            if len(commits) == 2:
                theirs.sync_topic(TOPIC)

        result = ours.sync_topic(TOPIC, before_commit=other_syncer_commits_second)
    finally:
        metadata.close()
    assert result.conflicts == 1 and result.lag == 0
    assert result.commits >= 1  # the first commit went in before the other syncer's
    rows = table_rows(node.table())
    assert [(r["queue_id"], r["queue_offset"]) for r in rows] == [(q, o) for q in range(4) for o in range(200)]
    assert rows == node.expected()


def position(queue_id: int, min_offset: int, max_offset: int) -> QueuePosition:
    return QueuePosition(TOPIC, queue_id, min_offset, max_offset, version=1, updated=0)


def test_each_queue_starts_at_its_table_offset_or_what_retention_left() -> None:
    queues = [position(2, 500, 900), position(0, 0, 100), position(1, 300, 400)]
    # Queue 0 continues at its table offset; queue 1's table offset is below what retention left: it starts at
    # the oldest archived offset; queue 2 has no table offset yet: a backfill from its first archived one.
    assert queue_progress({0: 60, 1: 120}, queues) == [
        QueueProgress(0, 60, 100),
        QueueProgress(1, 300, 400),
        QueueProgress(2, 500, 900),
    ]
