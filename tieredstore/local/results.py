"""What the hot store's writing operations take and give back: put requests and results, open and retention reports."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple


class PutRequest(NamedTuple):
    """One message of a batch for ``put_messages`` (a named tuple: cheap to build by the thousand)."""

    topic: str
    queue_id: int
    body: bytes
    keys: Sequence[str] = ()
    tags: str | None = None
    properties: Mapping[str, str] | None = None


class PutResult(NamedTuple):
    """Where a put landed (a named tuple: one is built per put, and a frozen dataclass costs 4x as much)."""

    topic: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    size: int
    store_timestamp: int


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What open found and repaired. ``clean`` means the checkpoint was trusted and nothing was scanned."""

    clean: bool
    scanned_from: int
    valid_end: int
    records_scanned: int = 0
    stop_reason: str | None = None
    bytes_cleared: int = 0
    files_removed: list[str] = field(default_factory=list)
    queue_units_dropped: int = 0
    queue_units_rebuilt: int = 0
    seconds: float = 0.0

    @property
    def repaired(self) -> bool:
        """Whether anything on disk was wrong: a torn tail, stray files or consume queues out of step

        (units dropped past the checkpoint and rewritten identically from the commit log are not a repair).
        """
        return bool(
            self.stop_reason
            or self.bytes_cleared
            or self.files_removed
            or self.queue_units_dropped != self.queue_units_rebuilt
        )


@dataclass(frozen=True, slots=True)
class RetentionReport:
    """What ``delete_expired`` removed."""

    commit_log_files: list[str]
    consume_queue_files: int
    commitlog_min_offset: int
    index_files: list[str] = field(default_factory=list)
