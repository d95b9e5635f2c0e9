"""Table maintenance: compaction, snapshot expiry, and trimming what retention removed from the cold tier.

Library functions on a pyiceberg ``Table``; the caller (``table compact``, the archiver) opens the table
and passes the settings. Every snapshot committed here carries the sync's bookmark ``tieredstore.offsets``
forward unchanged from the history it lands on (``maintenance_common.carried_properties``); trim also records
``tieredstore.trimmed``, the highest low offset applied per queue. A lost commit race reloads the table and
tries again, ``attempts`` times in all, then raises ``ConcurrentUpdateError``.

- ``compact``: small files of a partition merged into files of about the target size (``compaction``).
- ``expire``: snapshots older than a time, beyond the newest ``retain_last``, dropped from the metadata; the
  manifest lists, manifests and data files only they referenced are deleted through the table's FileIO.
- ``trim``: rows whose ``queue_offset`` is below a queue's low offset deleted (copy on write).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING

from pyiceberg.table.snapshots import Snapshot, ancestors_of
from pyiceberg.utils.datetime import datetime_to_millis

from tieredstore.errors import ValidationError
from tieredstore.logs import get_logger
from tieredstore.table.compaction import CompactionPlan, CompactResult, commit_compaction, compact, plan_compaction
from tieredstore.table.maintenance_common import (
    CARRIED_PROPERTIES,
    DEFAULT_ATTEMPTS,
    TRIMMED_PROPERTY,
    carried_properties,
    head_snapshot,
    summary_value,
    with_retries,
)
from tieredstore.table.offsets import OFFSETS_PROPERTY, decode_offsets, encode_offsets, latest_value

if TYPE_CHECKING:
    from pyiceberg.table import Table

__all__ = [
    "OFFSETS_PROPERTY",
    "TRIMMED_PROPERTY",
    "CompactResult",
    "CompactionPlan",
    "commit_compaction",
    "compact",
    "expire",
    "plan_compaction",
    "trim",
]

log = get_logger(__name__)


def expire(table: Table, *, older_than: datetime, retain_last: int, attempts: int = DEFAULT_ATTEMPTS) -> int:
    """Expire snapshots older than ``older_than`` except the newest ``retain_last`` of the current history.

    Never expired: branch and tag heads (so the current snapshot), the newest ``retain_last`` ancestors of
    the current snapshot, and the newest ancestor carrying each ``tieredstore.*`` bookmark (so a sync still
    finds it even if another writer's snapshot on top lacks it). Returns the number of snapshots expired.
    """
    if retain_last < 1:
        raise ValidationError(f"retain_last must be at least 1 (the current snapshot), not {retain_last}")

    def attempt() -> list[Snapshot]:
        metadata = table.metadata
        ancestry = list(ancestors_of(metadata.current_snapshot(), metadata))
        keep = {ref.snapshot_id for ref in metadata.refs.values()}
        keep.update(snapshot.snapshot_id for snapshot in ancestry[:retain_last])
        for name in CARRIED_PROPERTIES:
            holder = next((s for s in ancestry if summary_value(s, name) is not None), None)
            if holder is not None:
                keep.add(holder.snapshot_id)
        cutoff_ms = datetime_to_millis(older_than)
        doomed = [s for s in metadata.snapshots if s.snapshot_id not in keep and s.timestamp_ms < cutoff_ms]
        if doomed:
            table.maintenance.expire_snapshots().by_ids([s.snapshot_id for s in doomed]).commit()
        return doomed

    expired = with_retries(table, attempts, "snapshot expiry", attempt)
    if expired:
        _delete_unreachable(table, expired)
    return len(expired)


def _delete_unreachable(table: Table, expired: list[Snapshot]) -> None:
    """Delete the files the expired snapshots referenced that no remaining snapshot does.

    The remaining set is read after the expiry committed: a writer that started on an expired snapshot loses
    its commit race and rebuilds on the current head, so it cannot bring back a file deleted here.
    """
    table.refresh()
    entries: dict[str, list[str]] = {}
    doomed = _reachable(table, expired, entries)
    kept = _reachable(table, table.metadata.snapshots, entries)
    removed = 0
    for path in sorted(doomed - kept):
        try:
            table.io.delete(path)
            removed += 1
        except FileNotFoundError:
            pass
    log.info("snapshots expired", table=".".join(table.name()), snapshots=len(expired), files_deleted=removed)


def _reachable(table: Table, snapshots: Iterable[Snapshot], entries: dict[str, list[str]]) -> set[str]:
    """Manifest lists, manifests and live data files of ``snapshots``; ``entries`` caches manifests read."""
    paths: set[str] = set()
    for snapshot in snapshots:
        paths.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(table.io):
            paths.add(manifest.manifest_path)
            if manifest.manifest_path not in entries:
                entries[manifest.manifest_path] = [
                    entry.data_file.file_path for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)
                ]
            paths.update(entries[manifest.manifest_path])
    return paths


def trim(table: Table, low_offsets: Mapping[int, int], *, attempts: int = DEFAULT_ATTEMPTS) -> int:
    """Delete the rows with ``queue_offset < low_offsets[queue_id]``; return how many were deleted.

    Queues whose low offset is not above the one ``tieredstore.trimmed`` already records are skipped. A trim
    that finds no rows commits nothing (and so records nothing): running it again costs one plan.
    """
    for queue, low in low_offsets.items():
        if not isinstance(queue, int) or not isinstance(low, int) or queue < 0 or low < 0:
            raise ValidationError(f"low offsets map queue ids to offsets, both non-negative ints: {queue!r}: {low!r}")

    def attempt() -> int:
        head = head_snapshot(table)
        if head is None:
            return 0
        done = _decoded(latest_value(table, TRIMMED_PROPERTY))
        wanted = {queue: low for queue, low in low_offsets.items() if low > done.get(queue, 0)}
        if not wanted:
            return 0
        known = {snapshot.snapshot_id for snapshot in table.metadata.snapshots}

        def record_trimmed(carried: dict[str, str]) -> dict[str, str]:
            trimmed = _decoded(carried.get(TRIMMED_PROPERTY))
            for queue, low in wanted.items():
                trimmed[queue] = max(trimmed.get(queue, 0), low)
            return {**carried, TRIMMED_PROPERTY: encode_offsets(trimmed)}

        transaction = table.transaction()
        with warnings.catch_warnings():
            # Nothing below the low offsets is a normal outcome here, not something to warn a user about.
            warnings.filterwarnings("ignore", message="Delete operation did not match any records")
            transaction.delete(
                _below(wanted),
                snapshot_properties=carried_properties(table, record_trimmed),
            )
        transaction.commit_transaction()
        # commit_transaction left the table at the metadata it committed, so the new snapshots are ours.
        ours = [s for s in ancestors_of(head_snapshot(table), table.metadata) if s.snapshot_id not in known]
        return sum(_records(s, "deleted-records") - _records(s, "added-records") for s in ours)

    deleted = with_retries(table, attempts, "trim", attempt)
    if deleted:
        log.info("table rows trimmed below retention", table=".".join(table.name()), rows=deleted)
    return deleted


def _below(low_offsets: Mapping[int, int]) -> str:
    """queue_id = q AND queue_offset < low, OR-ed over the queues, in pyiceberg's filter syntax (ints only)."""
    return " OR ".join(f"(queue_id = {queue} AND queue_offset < {low})" for queue, low in sorted(low_offsets.items()))


def _decoded(text: str | None) -> dict[int, int]:
    """A ``{"<queue_id>": offset}`` summary value as a map; absent means empty."""
    return decode_offsets(text) if text is not None else {}


def _records(snapshot: Snapshot, key: str) -> int:
    value = summary_value(snapshot, key)
    return int(value) if value is not None else 0
