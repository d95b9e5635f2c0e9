"""What every maintenance commit shares: the sync's bookmark carried forward, the retry loop, live-file listing.

A maintenance snapshot (compaction, trim) must carry the sync's exactly-once bookmark ``tieredstore.offsets``
from its parent unchanged, or the next sync would restart from a stale offset and append rows twice.

The commit-conflict policy is the sync's (``table.sync``): the tables are created with pyiceberg's own commit
retries off (``schema.NO_COMMIT_RETRIES``), so a commit that loses to another writer raises, and the caller
reloads the table and plans again (``with_retries``). The carried properties are therefore read from the table
as it is at each attempt (``carried_properties``): the snapshot is built on exactly that state, once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from pyiceberg.exceptions import CommitFailedException, ValidationException
from pyiceberg.manifest import DataFile, DataFileContent

from tieredstore.errors import ConcurrentUpdateError, ValidationError
from tieredstore.logs import get_logger
from tieredstore.table.offsets import OFFSETS_PROPERTY, latest_value

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot

TRIMMED_PROPERTY = "tieredstore.trimmed"
CARRIED_PROPERTIES = (OFFSETS_PROPERTY, TRIMMED_PROPERTY)
DEFAULT_ATTEMPTS = 5
# Short and growing: the usual rival is the archiver's sync, whose commit takes well under a second.
_RETRY_BASE_DELAY_S = 0.05

T = TypeVar("T")
log = get_logger(__name__)


def head_snapshot(table: Table) -> Snapshot | None:
    """The main branch's head of the table object as last loaded (None for a table with no snapshot)."""
    return table.metadata.current_snapshot()


def summary_value(snapshot: Snapshot, name: str) -> str | None:
    """A property of the snapshot's summary (None when absent, or when the snapshot has no summary)."""
    return snapshot.summary.additional_properties.get(name) if snapshot.summary is not None else None


def carried_properties(
    table: Table, derive: Callable[[dict[str, str]], dict[str, str]] | None = None
) -> dict[str, str]:
    """Summary properties of a maintenance snapshot built on ``table`` as now loaded.

    Each ``tieredstore.*`` property is taken from the newest snapshot that has it (``latest_value``).
    ``derive`` may add or replace properties given those (trim merges its low offsets into
    ``tieredstore.trimmed``). Call it inside the ``with_retries`` action: with pyiceberg's retries off, the
    snapshot lands on this state or not at all.
    """
    carried: dict[str, str] = {}
    for name in CARRIED_PROPERTIES:
        value = latest_value(table, name)
        if value is not None:
            carried[name] = value
    return derive(carried) if derive is not None else carried


def with_retries(table: Table, attempts: int, what: str, action: Callable[[], T]) -> T:
    """Run ``action`` on a freshly loaded table; on a lost commit race, reload and run it again.

    ``CommitFailedException`` and ``ValidationException`` both mean pyiceberg's commit did not land, so running
    the action again cannot duplicate its effect. After ``attempts`` losses, ``ConcurrentUpdateError``.
    """
    if attempts < 1:
        raise ValidationError(f"attempts must be at least 1, not {attempts}")
    last: Exception | None = None
    for attempt in range(attempts):
        table.refresh()
        try:
            return action()
        except (CommitFailedException, ValidationException) as exc:
            last = exc
            log.info(
                "table maintenance lost a commit race",
                table=".".join(table.name()),
                operation=what,
                attempt=attempt + 1,
                attempts=attempts,
                error=str(exc),
            )
            if attempt + 1 < attempts:
                time.sleep(_RETRY_BASE_DELAY_S * 2**attempt)
    raise ConcurrentUpdateError(
        f"table {'.'.join(table.name())}: {what} lost {attempts} commit races in a row; run it again later"
    ) from last


def live_data_files(table: Table) -> dict[str, DataFile]:
    """The data files of the head snapshot by path (empty without one); delete files are not ours to touch."""
    head = head_snapshot(table)
    if head is None:
        return {}
    files: dict[str, DataFile] = {}
    for manifest in head.manifests(table.io):
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            if entry.data_file.content == DataFileContent.DATA:
                files[entry.data_file.file_path] = entry.data_file
    return files
