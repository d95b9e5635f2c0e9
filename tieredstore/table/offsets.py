"""Each queue's table offset, carried by the table's own snapshots: the next offset the table does not hold.

Every snapshot sync commits has summary property ``tieredstore.offsets``, a JSON object of every queue's
table offset (``{"0": 120, "3": 7}``). The offsets therefore change in the same atomic catalog commit as
the rows, so a sync that reads them from the current snapshot continues exactly where the table ends:
no row twice, none missing, whatever crashed before.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING

from tieredstore.errors import IntegrityError

if TYPE_CHECKING:
    from pyiceberg.table import Table

OFFSETS_PROPERTY = "tieredstore.offsets"


def encode_offsets(offsets: Mapping[int, int]) -> str:
    """The property's value: queue ids as string keys in ascending order, offsets as integers."""
    return json.dumps({str(queue_id): int(offsets[queue_id]) for queue_id in sorted(offsets)}, separators=(",", ":"))


def decode_offsets(text: str) -> dict[int, int]:
    """The offsets of a property value; IntegrityError when it is not a JSON object of queue id to offset."""
    try:
        parsed = json.loads(text)
        if not isinstance(parsed, dict):
            raise TypeError("not an object")
        offsets = {int(queue_id): offset for queue_id, offset in parsed.items()}
        if not all(
            isinstance(offset, int) and not isinstance(offset, bool) and offset >= 0 for offset in offsets.values()
        ):
            raise TypeError("an offset is not a non-negative integer")
    except (ValueError, TypeError) as error:
        raise IntegrityError(
            f"snapshot property {OFFSETS_PROPERTY} is not a map of queue id to offset: {error}"
        ) from error
    return offsets


def latest_value(table: Table, name: str) -> str | None:
    """Summary property ``name`` as the newest snapshot of the current ancestry that has it says (or None).

    The head alone is not enough: a sync's snapshot carries ``tieredstore.offsets`` but not
    ``tieredstore.trimmed``, and a snapshot of another tool may carry neither.
    """
    from pyiceberg.table.snapshots import ancestors_of

    for snapshot in ancestors_of(table.metadata.current_snapshot(), table.metadata):
        value = snapshot.summary.additional_properties.get(name) if snapshot.summary is not None else None
        if value is not None:
            return str(value)
    return None


def read_offsets(table: Table) -> dict[int, int]:
    """Each queue's table offset, from the newest snapshot of the current ancestry that carries them.

    Maintenance (compaction, expiry) copies the property forward; a snapshot written by another tool
    without it is stepped over, as its parent's offsets still hold. An empty table (or one without any
    offsets) has none: each queue then starts at its first archived offset.
    """
    text = latest_value(table, OFFSETS_PROPERTY)
    return decode_offsets(text) if text is not None else {}
