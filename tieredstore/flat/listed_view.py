"""A read-only view of one queue built from segments listed in storage, for readers with no metadata store.

A Spark executor finds a queue's segments by listing the cold storage (``tieredstore.flat.listing``)
and has no metadata database; the view is the flat layer's own read-only ``FlatMessageFile``
(``FlatMessageFile.load``), its segment rows made from the listed spans, so that such a reader goes
through the one cold reader (``ColdQueueReader``) like every other. Any write or metadata use is a
ReadOnlyError: the archive is the archiver's to change.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, cast

from tieredstore.errors import ReadOnlyError
from tieredstore.flat.message_file import FlatMessageFile
from tieredstore.metadata import MetadataStore, QueuePosition, SegmentFileType, SegmentRecord, SegmentStatus
from tieredstore.providers.base import Provider


class ListedSpan(Protocol):
    """One listed segment: where it starts in its file, its committed size, its store-time range if known."""

    @property
    def base_offset(self) -> int: ...

    @property
    def size(self) -> int: ...

    @property
    def begin_timestamp(self) -> int | None: ...

    @property
    def end_timestamp(self) -> int | None: ...


class _NoMetadata:
    """The metadata store of a view that never writes: any use of it is a bug, said as such."""

    def __getattr__(self, name: str) -> Any:
        raise ReadOnlyError(f"the Spark source reads the archive only; it has no metadata store to {name}")


NO_METADATA = cast(MetadataStore, _NoMetadata())


def segment_record(path: str, file_type: SegmentFileType, span: ListedSpan) -> SegmentRecord:
    """A listed segment as the flat layer loads it: sealed at the size the listing gives."""
    return SegmentRecord(
        path,
        file_type,
        span.base_offset,
        span.size,
        SegmentStatus.SEALED,
        created_timestamp=0,
        begin_timestamp=span.begin_timestamp,
        end_timestamp=span.end_timestamp,
        sealed_timestamp=None,
    )


def listed_message_file(
    provider: Provider,
    topic: str,
    queue_id: int,
    path: str,
    archived: tuple[int, int],
    commit_log: Sequence[ListedSpan],
    consume_queue: Sequence[ListedSpan],
) -> FlatMessageFile:
    """A read-only ``FlatMessageFile`` of the queue at ``path`` from its listed segments; no provider call.

    ``archived`` is the [min, max) queue offsets to read: reads stop at its end, as a view loaded from
    metadata stops at the recorded archived offset.
    """
    min_offset, max_offset = archived
    position = QueuePosition(topic, queue_id, min_offset, max_offset, version=0, updated=0)
    return FlatMessageFile.load(
        provider,
        NO_METADATA,
        path,
        position,
        [segment_record(path, SegmentFileType.COMMIT_LOG, span) for span in commit_log],
        [segment_record(path, SegmentFileType.CONSUME_QUEUE, span) for span in consume_queue],
    )
