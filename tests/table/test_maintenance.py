"""Table maintenance on real catalogs and warehouses: compaction, snapshot expiry and trim.

Every test runs on SQLite and PostgreSQL catalogs with POSIX and S3 (moto over HTTP) warehouses. What a user
would notice: the rows a query returns never change under compaction or expiry, trim removes exactly what
retention removed, storage shrinks, and the sync's bookmark survives every maintenance commit.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.expressions import EqualTo
from pyiceberg.table import Table

from tests.table.maint_tables import (
    DAY0,
    PAIRS,
    CatalogSetup,
    all_rows,
    append_messages,
    data_file_paths,
    make_setup,
    message_table,
    messages,
    summary_property,
)
from tieredstore.errors import ValidationError
from tieredstore.table.maintenance import (
    OFFSETS_PROPERTY,
    TRIMMED_PROPERTY,
    commit_compaction,
    compact,
    expire,
    plan_compaction,
    trim,
)
from tieredstore.table.maintenance_common import carried_properties, with_retries

BIG = 128 * 1024 * 1024
APPENDS = 6


@pytest.fixture(params=PAIRS)
def setup(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CatalogSetup]:
    catalog_setup = make_setup(request.param, request, tmp_path)
    yield catalog_setup
    for catalog in catalog_setup.opened:
        catalog.engine.dispose()


def _small_file_table(setup: CatalogSetup) -> Table:
    """Two queues on two days, appended in APPENDS syncs of 10 messages per queue and day: many small files."""
    table = message_table(setup.open())
    for i in range(APPENDS):
        batch = pa.concat_tables([messages(queue, day * 1000 + i * 10, 10, day) for day in (0, 1) for queue in (0, 1)])
        append_messages(table, batch)
    return table


def _exists(table: Table, path: str) -> bool:
    return table.io.new_input(path).exists()


def _sorted_within_files(table: Table) -> bool:
    for task in table.scan().plan_files():
        with table.io.new_input(task.file.file_path).open() as stream:
            data = pq.read_table(stream, columns=["queue_id", "queue_offset"])
        keys = list(zip(data["queue_id"].to_pylist(), data["queue_offset"].to_pylist(), strict=True))
        if keys != sorted(keys):
            return False
    return True


def test_compact_merges_each_partitions_small_files_and_keeps_rows_and_bookmark(setup: CatalogSetup) -> None:
    table = _small_file_table(setup)
    rows_before = all_rows(table)
    files_before = data_file_paths(table)
    offsets_before = summary_property(table, OFFSETS_PROPERTY)
    assert len(files_before) == 2 * APPENDS  # one file per partition per append

    result = compact(table, small_file_bytes=BIG, target_file_bytes=BIG)

    assert (result.partitions, result.files_removed, result.files_added) == (2, 2 * APPENDS, 2)
    assert result.rows_rewritten == len(rows_before) == 2 * 2 * APPENDS * 10
    reread = setup.open().load_table(table.name())  # a new client sees the committed state
    assert len(data_file_paths(reread)) == 2
    assert all_rows(reread) == rows_before  # same count, same (queue, offset) set, same bodies and timestamps
    assert summary_property(reread, OFFSETS_PROPERTY) == offsets_before
    assert reread.current_snapshot() is not None
    assert reread.current_snapshot().snapshot_id == result.snapshot_id
    assert _sorted_within_files(reread)
    # The merged files keep their day partition: a filter on one day plans exactly one file.
    one_day = reread.scan(row_filter=f"store_timestamp < '{(DAY0 + timedelta(days=1)).isoformat()}'")
    assert len(list(one_day.plan_files())) == 1


def test_compact_bins_to_the_target_size_and_leaves_large_files(setup: CatalogSetup) -> None:
    table = _small_file_table(setup)
    rows_before = all_rows(table)
    sizes = [task.file.file_size_in_bytes for task in table.scan().plan_files()]
    # Equal batches give near-equal files; the bins below rely on four never fitting where three do.
    assert 4 * min(sizes) > 3 * max(sizes)

    result = compact(table, small_file_bytes=max(sizes) + 1, target_file_bytes=3 * max(sizes))

    per_partition = math.ceil(APPENDS / 3)
    assert result.files_added == 2 * per_partition
    assert len(data_file_paths(table)) == 2 * per_partition
    assert all_rows(table) == rows_before
    # Files now at or above small_file_bytes are left alone: a second run commits nothing.
    again = compact(table, small_file_bytes=min(sizes), target_file_bytes=3 * max(sizes))
    assert again.snapshot_id is None
    assert all_rows(table) == rows_before


def test_append_between_planning_and_commit_keeps_its_rows_and_its_bookmark(setup: CatalogSetup) -> None:
    table = _small_file_table(setup)
    plan = plan_compaction(table, small_file_bytes=BIG, target_file_bytes=BIG)

    # Another process (its own catalog client) syncs more messages while the compaction is in flight.
    rival = setup.open().load_table(table.name())
    late = pa.concat_tables([messages(0, 5000, 7, 0), messages(1, 5000, 3, 1)])
    append_messages(rival, late)
    rows_with_late = all_rows(rival)
    offsets_after_late = summary_property(rival, OFFSETS_PROPERTY)

    result = commit_compaction(table, plan)

    assert result.files_removed == 2 * APPENDS
    final = setup.open().load_table(table.name())
    assert all_rows(final) == rows_with_late  # the late rows are there, nothing lost or doubled
    # The bookmark is the rival's, not the one current when the compaction was planned: a stale one would
    # make the next sync append the late messages again.
    assert summary_property(final, OFFSETS_PROPERTY) == offsets_after_late
    assert json.loads(offsets_after_late or "{}") == {"0": 5007, "1": 5003}
    assert len(data_file_paths(final)) == 2 + 2  # two merged files and the rival's two


def test_a_commit_lost_to_a_rival_is_planned_again_on_its_snapshot_with_its_bookmark(setup: CatalogSetup) -> None:
    """The sync may commit a snapshot with no files that only moves the bookmark (past a lost range). With
    pyiceberg's retries off, a maintenance commit that lost to it raises rather than being rebuilt by pyiceberg,
    and ``with_retries`` plans again on the rival's snapshot, whose moved bookmark the new snapshot carries."""
    table = _small_file_table(setup)
    moved = '{"0":9000,"1":9000}'
    attempts: list[str | None] = []

    def attempt() -> int:
        transaction = table.transaction()
        with transaction.update_snapshot(snapshot_properties=carried_properties(table)).fast_append():
            pass  # staged on the head as it is now
        attempts.append(carried_properties(table).get(OFFSETS_PROPERTY))
        if len(attempts) == 1:
            rival = setup.open().load_table(table.name())
            rival.append(messages(0, 0, 0, 0), snapshot_properties={OFFSETS_PROPERTY: moved})
        transaction.commit_transaction()
        return len(attempts)

    assert with_retries(table, 3, "test", attempt) == 2  # the first commit lost and was not retried by pyiceberg

    final = setup.open().load_table(table.name())
    assert attempts[1] == moved != attempts[0]
    assert summary_property(final, OFFSETS_PROPERTY) == moved
    assert all_rows(final) == all_rows(table)


def test_a_plan_whose_inputs_another_compaction_replaced_commits_nothing_and_removes_its_files(
    setup: CatalogSetup,
) -> None:
    table = _small_file_table(setup)
    rows_before = all_rows(table)
    first = plan_compaction(table, small_file_bytes=BIG, target_file_bytes=BIG)
    second = plan_compaction(setup.open().load_table(table.name()), small_file_bytes=BIG, target_file_bytes=BIG)
    commit_compaction(table, first)

    result = commit_compaction(setup.open().load_table(table.name()), second)

    assert result.snapshot_id is None
    final = setup.open().load_table(table.name())
    assert all_rows(final) == rows_before  # not the rows twice
    written_by_second = [f.file_path for rw in second.rewrites for f in rw.written]
    assert written_by_second
    assert not any(_exists(final, path) for path in written_by_second)


def test_a_trim_between_planning_and_commit_is_not_undone_by_the_compaction(setup: CatalogSetup) -> None:
    table = _small_file_table(setup)
    plan = plan_compaction(table, small_file_bytes=BIG, target_file_bytes=BIG)
    rival = setup.open().load_table(table.name())
    assert trim(rival, {0: 1025}) == APPENDS * 10 + 25
    rows_after_trim = all_rows(rival)

    result = commit_compaction(table, plan)

    # Both days had files the trim rewrote: both merges are dropped, and their files deleted.
    assert result.snapshot_id is None
    final = setup.open().load_table(table.name())
    assert all_rows(final) == rows_after_trim  # the trimmed rows do not come back from the merged files
    assert not any(_exists(final, f.file_path) for rw in plan.rewrites for f in rw.written)
    assert json.loads(summary_property(final, TRIMMED_PROPERTY) or "{}") == {"0": 1025}


def test_trimmed_rows_leave_storage_once_older_snapshots_expire(setup: CatalogSetup) -> None:
    table = _small_file_table(setup)
    files_before = data_file_paths(table)
    trim(table, {0: 1025})
    replaced = sorted(set(files_before) - set(data_file_paths(table)))
    assert replaced  # the trim rewrote the files holding queue 0's rows below 1025

    expire(table, older_than=datetime.now(UTC) + timedelta(seconds=1), retain_last=1)

    assert not any(_exists(table, path) for path in replaced)
    assert all(_exists(table, path) for path in data_file_paths(table))
    # What storage still holds (all Parquet files any snapshot names) has no row below the low offset.
    for path in data_file_paths(table):
        with table.io.new_input(path).open() as stream:
            data = pq.read_table(stream, columns=["queue_id", "queue_offset"])
        pairs = zip(data["queue_id"].to_pylist(), data["queue_offset"].to_pylist(), strict=True)
        assert not any(queue == 0 and offset < 1025 for queue, offset in pairs)


def test_a_merged_file_swept_before_the_commit_is_not_committed(setup: CatalogSetup) -> None:
    table = _small_file_table(setup)
    rows_before = all_rows(table)
    plan = plan_compaction(table, small_file_bytes=BIG, target_file_bytes=BIG)
    assert len(plan.rewrites) == 2  # one per day
    swept = plan.rewrites[0].written[0].file_path
    table.io.delete(swept)  # as an orphan sweep with a too-short grace would

    result = commit_compaction(table, plan)

    assert (result.partitions, result.files_removed, result.files_added) == (1, APPENDS, 1)
    final = setup.open().load_table(table.name())
    assert swept not in data_file_paths(final)
    assert all_rows(final) == rows_before  # readable: no snapshot names the missing file
    assert len(data_file_paths(final)) == APPENDS + 1


def test_expire_bounds_snapshots_and_deletes_only_unreachable_files(setup: CatalogSetup) -> None:
    table = _small_file_table(setup)
    small_files = data_file_paths(table)
    compact(table, small_file_bytes=BIG, target_file_bytes=BIG)
    rows = all_rows(table)
    current_files = data_file_paths(table)
    manifest_lists = {s.snapshot_id: s.manifest_list for s in table.metadata.snapshots}
    assert len(manifest_lists) == APPENDS + 1
    assert all(_exists(table, path) for path in small_files)  # compaction alone frees nothing

    expired = expire(table, older_than=datetime.now(UTC) + timedelta(seconds=1), retain_last=2)

    final = setup.open().load_table(table.name())
    assert expired == APPENDS - 1
    assert len(final.metadata.snapshots) == 2
    head = final.current_snapshot()
    assert head is not None
    kept = {head.snapshot_id, head.parent_snapshot_id}
    assert {s.snapshot_id for s in final.metadata.snapshots} == kept
    assert all_rows(final) == rows
    assert all(_exists(final, path) for path in current_files)
    # The small files are still referenced by the retained parent (the last append) only if it holds them:
    # it does, so they stay until that snapshot expires too.
    assert all(_exists(final, path) for path in small_files)
    assert all(_exists(final, path) == (sid in kept) for sid, path in manifest_lists.items())

    assert expire(final, older_than=datetime.now(UTC) + timedelta(seconds=1), retain_last=1) == 1
    assert not any(_exists(final, path) for path in small_files)
    assert all(_exists(final, path) for path in current_files)
    assert all_rows(setup.open().load_table(table.name())) == rows
    assert summary_property(final, OFFSETS_PROPERTY) is not None


def test_expire_keeps_snapshots_newer_than_the_cutoff(setup: CatalogSetup) -> None:
    table = _small_file_table(setup)
    snapshots = sorted(table.metadata.snapshots, key=lambda s: s.timestamp_ms)
    cutoff = datetime.fromtimestamp(snapshots[3].timestamp_ms / 1000, tz=UTC)
    older = [s.snapshot_id for s in snapshots if s.timestamp_ms < snapshots[3].timestamp_ms]
    assert older  # appends are milliseconds apart at least

    assert expire(table, older_than=cutoff, retain_last=1) == len(older)
    remaining = {s.snapshot_id for s in table.metadata.snapshots}
    assert remaining == {s.snapshot_id for s in snapshots} - set(older)
    with pytest.raises(ValidationError):
        expire(table, older_than=cutoff, retain_last=0)


def test_trim_deletes_exactly_the_rows_below_the_low_offsets(setup: CatalogSetup) -> None:
    table = _small_file_table(setup)
    rows = all_rows(table)
    offsets = summary_property(table, OFFSETS_PROPERTY)
    # Queue 0: all of day 0 and the first 25 offsets of day 1; queue 1 untouched, though it shares the files.
    low = {0: 1025, 1: 0}
    expected = [r for r in rows if not (r[1] == 0 and r[2] < 1025)]

    deleted = trim(table, low)

    final = setup.open().load_table(table.name())
    assert deleted == len(rows) - len(expected) == APPENDS * 10 + 25
    assert all_rows(final) == expected
    assert summary_property(final, OFFSETS_PROPERTY) == offsets
    assert json.loads(summary_property(final, TRIMMED_PROPERTY) or "{}") == {"0": 1025}
    # A sync commits on top (its snapshot carries the offsets, not the trim record), then the same low
    # offsets again: already recorded in the history, nothing to do, no new snapshot.
    append_messages(final, messages(0, 2000, 5, 1))
    head = final.current_snapshot()
    assert trim(final, low) == 0
    assert final.current_snapshot() == head
    # A later trim of the other queue keeps queue 0's record, found below the sync's snapshot.
    assert trim(final, {1: 3}) == 3
    assert json.loads(summary_property(final, TRIMMED_PROPERTY) or "{}") == {"0": 1025, "1": 3}
    assert final.scan(row_filter=EqualTo("queue_id", 1)).to_arrow().num_rows == len([r for r in rows if r[1] == 1]) - 3


def test_trim_refuses_negative_offsets(setup: CatalogSetup) -> None:
    table = message_table(setup.open())
    with pytest.raises(ValidationError):
        trim(table, {0: -1})
