"""HotReader: what every reader of the hot store (archiver, fetcher, CLI, the facade's reads) may ask of it.

Two classes implement it: ``LocalMessageStore``, the store this process opened (as its writer, or
read-only), and ``HotStoreFollower``, which follows a store another process writes. Writing (puts,
restores, hot retention) is not part of it: only the writer has it, and ``hot_writer`` says so to a
caller that holds a follower.
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import Protocol, Self, runtime_checkable

from tieredstore.errors import ValidationError
from tieredstore.formats.consume_queue import ConsumeQueueUnit
from tieredstore.formats.message import MessageRecord
from tieredstore.local.batch import HotBatch, SharedWindow
from tieredstore.local.config import LocalStoreConfig
from tieredstore.local.index_file import KeyedRecord
from tieredstore.local.reading import Boundary, StoredMessage
from tieredstore.local.store import LocalMessageStore


@runtime_checkable
class HotReader(Protocol):
    """Reads of a hot store. Offsets are queue offsets unless named commit-log offsets; a queue never
    written reads as empty (offsets 0), an offset below the queue's min offset is a NotFoundError."""

    @property
    def root(self) -> Path:
        """The store's directory."""
        ...

    @property
    def config(self) -> LocalStoreConfig: ...

    @property
    def read_only(self) -> bool:
        """False only for the writer: what it reads is flushed on demand and it runs hot retention."""
        ...

    def queues(self) -> list[tuple[str, int]]: ...

    def min_offset(self, topic: str, queue_id: int) -> int: ...

    def max_offset(self, topic: str, queue_id: int) -> int: ...

    def durable_max_offset(self, topic: str, queue_id: int) -> int:
        """One past the last message a machine crash cannot take back: all the archiver may take."""
        ...

    def flush_queue(self, topic: str, queue_id: int) -> int:
        """The queue made durable as far as this reader can (a follower cannot); its ``durable_max_offset``."""
        ...

    @property
    def commitlog_min_offset(self) -> int: ...

    @property
    def commitlog_max_offset(self) -> int: ...

    @property
    def commitlog_flushed_offset(self) -> int: ...

    def release_pages(self, below: int) -> int:
        """Unmap this process's pages of the commit log below ``below``; the bytes newly released."""
        ...

    def cq_unit(self, topic: str, queue_id: int, queue_offset: int) -> ConsumeQueueUnit: ...

    def read_record(self, unit: ConsumeQueueUnit) -> bytes: ...

    def read_messages(
        self, topic: str, queue_id: int, queue_offset: int, max_count: int = 32, max_bytes: int = 4 << 20
    ) -> list[StoredMessage]: ...

    def read_batch(
        self,
        topic: str,
        queue_id: int,
        queue_offset: int,
        max_count: int = 32,
        max_bytes: int = 4 << 20,
        *,
        unmap: bool = False,
        window: SharedWindow | None = None,
    ) -> HotBatch: ...

    def get_message(self, topic: str, queue_id: int, queue_offset: int) -> MessageRecord: ...

    def store_timestamp(self, topic: str, queue_id: int, queue_offset: int) -> int: ...

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp: int, boundary: Boundary = "lower") -> int: ...

    def query_keys(
        self, topic: str, key: str, max_count: int = 32, begin_timestamp: int = 0, end_timestamp: int = (1 << 63) - 1
    ) -> list[KeyedRecord]: ...

    def record_at(self, commitlog_offset: int) -> bytes: ...

    def offset_msg_id(self, commitlog_offset: int) -> str: ...

    def close(self) -> None: ...

    def __enter__(self) -> Self: ...

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None: ...


def hot_writer(hot: HotReader, what: str) -> LocalMessageStore:
    """``hot`` as the store that writes it, for ``what`` (puts, restores, ...); ValidationError for a follower."""
    if isinstance(hot, LocalMessageStore):
        return hot
    raise ValidationError(f"{hot.root} is followed, not owned: {what} belong to the writer process")
