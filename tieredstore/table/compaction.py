"""Compaction: a partition's small data files merged into files of about the target size, the rows unchanged.

pyiceberg 0.12 can replace a set of data files atomically: its overwrite snapshot producer
(``Transaction.update_snapshot().overwrite()``) takes ``delete_data_file`` and ``append_data_file`` calls and
commits them as one OVERWRITE snapshot, refusing (``ValidationException``) when a file it was told to delete is
no longer live. ``Table.overwrite`` with a filter would instead re-read and re-filter whole partitions.

The whole run is ONE snapshot, not one per partition: the snapshot count (and so the table metadata) grows by
one per run however many days are compacted, and the replace is all or nothing. The cost of a long run is
bounded anyway: the new files are written before the commit loop, so a lost race costs a re-check of which
inputs are still live, not a rewrite; memory is bounded by one output file's rows.

Rows: a merged file holds exactly the rows of the files it replaces (checked by count before committing),
sorted by (queue_id, queue_offset). Rows appended concurrently live in files this run never touches.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import pyarrow as pa
from pyiceberg.conversions import from_bytes
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io.pyarrow import ArrowScan, write_file
from pyiceberg.manifest import DataFile, ManifestContent
from pyiceberg.partitioning import PartitionFieldValue, PartitionKey
from pyiceberg.table import FileScanTask, WriteTask
from pyiceberg.types import PrimitiveType

from tieredstore.errors import ConcurrentUpdateError, IntegrityError, ValidationError
from tieredstore.logs import get_logger
from tieredstore.table.maintenance_common import (
    DEFAULT_ATTEMPTS,
    carried_properties,
    head_snapshot,
    live_data_files,
    with_retries,
)

if TYPE_CHECKING:
    from pyiceberg.table import Table

ORDER_COLUMNS = ("queue_id", "queue_offset")
log = get_logger(__name__)


@dataclass(frozen=True)
class Rewrite:
    """Input files of one partition and the one file written with their rows."""

    replaced: tuple[DataFile, ...]
    written: tuple[DataFile, ...]
    rows: int


@dataclass(frozen=True)
class CompactionPlan:
    """Files written but not committed yet: ``commit_compaction`` swaps them in or deletes them."""

    rewrites: tuple[Rewrite, ...]


@dataclass(frozen=True)
class CompactResult:
    """What a compaction committed (all zero and no snapshot when there was nothing worth merging)."""

    partitions: int
    files_removed: int
    files_added: int
    rows_rewritten: int
    snapshot_id: int | None


def compact(
    table: Table, *, small_file_bytes: int, target_file_bytes: int, attempts: int = DEFAULT_ATTEMPTS
) -> CompactResult:
    """Merge every partition's data files under ``small_file_bytes`` into files of about ``target_file_bytes``."""
    plan = plan_compaction(table, small_file_bytes=small_file_bytes, target_file_bytes=target_file_bytes)
    return commit_compaction(table, plan, attempts=attempts)


def plan_compaction(table: Table, *, small_file_bytes: int, target_file_bytes: int) -> CompactionPlan:
    """Choose the files to merge from the table's current snapshot and write their merged files."""
    if target_file_bytes <= 0 or small_file_bytes <= 0:
        raise ValidationError("small_file_bytes and target_file_bytes must be positive")
    if small_file_bytes > target_file_bytes:
        raise ValidationError(
            f"small_file_bytes ({small_file_bytes}) must not exceed target_file_bytes ({target_file_bytes})"
        )
    table.refresh()
    head = head_snapshot(table)
    if head is None:
        return CompactionPlan(rewrites=())
    if any(manifest.content != ManifestContent.DATA for manifest in head.manifests(table.io)):
        # Row-level deletes come from another engine (pyiceberg only copies on write); merging data files
        # without applying them would bring deleted rows back, so such a table is left alone.
        log.warning("table has delete files; compaction skipped", table=".".join(table.name()))
        return CompactionPlan(rewrites=())
    default_spec = table.metadata.default_spec_id
    groups: dict[str, list[DataFile]] = {}
    for data_file in live_data_files(table).values():
        # A file of an older partition spec would have to be re-partitioned, not merely merged.
        if data_file.spec_id == default_spec and data_file.file_size_in_bytes < small_file_bytes:
            groups.setdefault(_partition_key(data_file), []).append(data_file)
    rewrites: list[Rewrite] = []
    try:
        for key in sorted(groups):
            for batch in _bins(sorted(groups[key], key=lambda f: _first_position(table, f)), target_file_bytes):
                if len(batch) > 1:
                    rewrites.append(_merge(table, batch))
    except BaseException:
        _discard(table, rewrites)
        raise
    return CompactionPlan(rewrites=tuple(rewrites))


def commit_compaction(table: Table, plan: CompactionPlan, *, attempts: int = DEFAULT_ATTEMPTS) -> CompactResult:
    """Replace each rewrite's input files by its merged file in one snapshot, on the table's newest state.

    A rewrite whose inputs a concurrent commit already replaced (another compaction, a trim) is dropped and its
    file deleted; the others go ahead. Rows appended meanwhile are in files outside the plan and stay.
    """
    pending = list(plan.rewrites)

    def attempt() -> int | None:
        nonlocal pending
        live = live_data_files(table)
        gone = [rw for rw in pending if not _still_applies(table, rw, live)]
        if gone:
            _discard(table, gone)
            pending = [rw for rw in pending if all(rw is not lost for lost in gone)]
        if not pending:
            return None
        transaction = table.transaction()
        properties = carried_properties(table)
        with transaction.update_snapshot(snapshot_properties=properties).overwrite() as rewrite:
            for rw in pending:
                for old in rw.replaced:
                    rewrite.delete_data_file(live[old.file_path])
                for new in rw.written:
                    rewrite.append_data_file(new)
        transaction.commit_transaction()
        return rewrite.snapshot_id

    try:
        snapshot_id = with_retries(table, attempts, "compaction", attempt)
    except (ConcurrentUpdateError, ValidationError):
        # Every attempt failed before its commit landed, so the written files are referenced by no snapshot.
        _discard(table, pending)
        raise
    if snapshot_id is None:
        return CompactResult(partitions=0, files_removed=0, files_added=0, rows_rewritten=0, snapshot_id=None)
    return CompactResult(
        partitions=len({_partition_key(rw.replaced[0]) for rw in pending}),
        files_removed=sum(len(rw.replaced) for rw in pending),
        files_added=sum(len(rw.written) for rw in pending),
        rows_rewritten=sum(rw.rows for rw in pending),
        snapshot_id=snapshot_id,
    )


def _partition_key(data_file: DataFile) -> str:
    """A sortable, hashable name of the file's partition (pyiceberg's Record compares but does not hash)."""
    return repr(data_file.partition)


def _still_applies(table: Table, rewrite: Rewrite, live: dict[str, DataFile]) -> bool:
    """Its inputs are all still in the table, and its merged file still on storage: an orphan sweep with a
    grace shorter than this run could have taken it, and a snapshot must never name a missing file."""
    return all(f.file_path in live for f in rewrite.replaced) and all(
        table.io.new_input(f.file_path).exists() for f in rewrite.written
    )


def _bins(files: list[DataFile], target_file_bytes: int) -> Iterable[list[DataFile]]:
    """Consecutive runs of files whose sizes add up to at most the target (a file alone may not)."""
    current: list[DataFile] = []
    total = 0
    for data_file in files:
        if current and total + data_file.file_size_in_bytes > target_file_bytes:
            yield current
            current, total = [], 0
        current.append(data_file)
        total += data_file.file_size_in_bytes
    if current:
        yield current


def _first_position(table: Table, data_file: DataFile) -> tuple[float, float, str]:
    """The file's lowest (queue_id, queue_offset) from its column bounds, so merged runs stay in offset order."""
    position: list[float] = []
    for name in ORDER_COLUMNS:
        field = table.schema().find_field(name)
        raw = (data_file.lower_bounds or {}).get(field.field_id)
        if raw is None:
            position.append(math.inf)
        else:
            position.append(float(cast(int, from_bytes(cast(PrimitiveType, field.field_type), raw))))
    return position[0], position[1], data_file.file_path


def _merge(table: Table, files: list[DataFile]) -> Rewrite:
    """Read ``files`` (one partition), sort their rows and write them as one new data file."""
    schema = table.schema()
    scan = ArrowScan(table_metadata=table.metadata, io=table.io, projected_schema=schema, row_filter=AlwaysTrue())
    rows: pa.Table = scan.to_table([FileScanTask(f) for f in files])
    expected = sum(f.record_count for f in files)
    if rows.num_rows != expected:
        raise IntegrityError(f"read {rows.num_rows} rows from data files that record {expected}; not compacting")
    rows = rows.sort_by([(name, "ascending") for name in ORDER_COLUMNS])
    spec = table.metadata.specs()[files[0].spec_id]
    partition_key = None
    if not spec.is_unpartitioned():
        values = [PartitionFieldValue(field, files[0].partition[i]) for i, field in enumerate(spec.fields)]
        partition_key = PartitionKey(field_values=values, partition_spec=spec, schema=schema)
    task = WriteTask(
        write_uuid=uuid.uuid4(),
        task_id=0,
        schema=schema,
        record_batches=rows.to_batches(),
        partition_key=partition_key,
    )
    written = tuple(write_file(table.io, table.metadata, iter([task])))
    return Rewrite(replaced=tuple(files), written=written, rows=rows.num_rows)


def _discard(table: Table, rewrites: Iterable[Rewrite]) -> None:
    """Delete merged files that no snapshot references (their commit never happened)."""
    for rw in rewrites:
        for data_file in rw.written:
            try:
                table.io.delete(data_file.file_path)
            except FileNotFoundError:
                pass  # an orphan sweep got there first
