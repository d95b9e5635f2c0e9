"""What every maintenance commit shares: the sync's bookmark carried forward, the retry loop, live-file listing.

A maintenance snapshot (compaction, trim) must carry the sync's exactly-once bookmark ``tieredstore.offsets``
from its parent unchanged, or the next sync would restart from a stale offset and append rows twice. The
parent is only known when pyiceberg builds the snapshot, which it does again after its own retry on a
refreshed table, so the properties are a mapping read at that moment (``CarriedProperties``), never a copy
taken while planning.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, TypeVar

from pyiceberg.exceptions import CommitFailedException, ValidationException
from pyiceberg.manifest import DataFile, DataFileContent
from pyiceberg.table.snapshots import ancestors_of

from tieredstore.errors import ConcurrentUpdateError, ValidationError
from tieredstore.logs import get_logger

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot

OFFSETS_PROPERTY = "tieredstore.offsets"
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


def latest_value(table: Table, name: str) -> str | None:
    """The property as the newest snapshot of the current history that has it says.

    The head alone is not enough: a sync's snapshot carries ``tieredstore.offsets`` but not
    ``tieredstore.trimmed``, and a snapshot of another tool may carry neither.
    """
    for snapshot in ancestors_of(head_snapshot(table), table.metadata):
        value = summary_value(snapshot, name)
        if value is not None:
            return value
    return None


def queue_offsets(text: str | None) -> dict[int, int]:
    """Parse a ``{"<queue_id>": offset}`` summary value; absent means empty."""
    if text is None:
        return {}
    return {int(queue): int(offset) for queue, offset in json.loads(text).items()}


def offsets_text(offsets: Mapping[int, int]) -> str:
    """The summary value for ``offsets``, keys sorted so equal maps give equal strings."""
    return json.dumps({str(queue): offsets[queue] for queue in sorted(offsets)}, separators=(",", ":"))


class CarriedProperties(Mapping[str, str]):
    """Summary properties of a maintenance snapshot, read from the table's history when pyiceberg builds it.

    Each ``tieredstore.*`` property is taken from the newest snapshot that has it (``latest_value``).
    ``derive`` may add or replace properties given those (trim merges its low offsets into
    ``tieredstore.trimmed``). pyiceberg unpacks this mapping each time it builds the snapshot, also after its
    own reload on a commit conflict, so the values always come from the history the snapshot lands on.
    """

    def __init__(self, table: Table, derive: Callable[[dict[str, str]], dict[str, str]] | None = None) -> None:
        self._table = table
        self._derive = derive

    def _values(self) -> dict[str, str]:
        carried: dict[str, str] = {}
        for name in CARRIED_PROPERTIES:
            value = latest_value(self._table, name)
            if value is not None:
                carried[name] = value
        if self._derive is not None:
            carried = self._derive(carried)
        return carried

    def __getitem__(self, key: str) -> str:
        return self._values()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values())

    def __len__(self) -> int:
        return len(self._values())


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
            log.info("table maintenance lost a commit race", table=".".join(table.name()), operation=what,
                     attempt=attempt + 1, attempts=attempts, error=str(exc))
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
