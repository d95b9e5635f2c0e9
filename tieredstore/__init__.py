"""tieredstore: a local hot store for message data, archived to POSIX or S3 cold storage and read from either tier.

The public API is what ``__all__`` names: the facade (``TieredMessageStore`` and its async core), the
config loader, what reads, puts and restores return, and the exception tree of ``tieredstore.errors``.

Only the errors are imported with the package. Everything else loads on first use (module
``__getattr__``), because ``providers`` and ``metadata`` import ``tieredstore.errors`` and must not pull
in the facade, its database engine and its readers with it, nor meet a half-imported package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tieredstore.errors import (
    ArchiverRunningError,
    CommitConflictError,
    CommitTimeoutError,
    ConcurrentUpdateError,
    ConditionalWritesUnsupportedError,
    ConfigError,
    CorruptRecordError,
    IntegrityError,
    InvalidPropertyError,
    InvalidQueueError,
    InvalidTopicError,
    LeaseLostError,
    MessageTooLargeError,
    MetadataCorruptError,
    MetadataError,
    MetadataUnavailableError,
    MissingExtraError,
    NotFoundError,
    PathEscapeError,
    ReadOnlyError,
    SchemaVersionError,
    SegmentNotFoundError,
    SizeUnknownError,
    StorageAccessError,
    StorageError,
    StorageUnavailableError,
    StoreFullError,
    StoreLockedError,
    TieredStoreError,
    ValidationError,
)

if TYPE_CHECKING:
    from tieredstore.basics import Boundary, BoundaryType
    from tieredstore.config import ReadPolicy, TieredStoreConfig, load_config
    from tieredstore.local.results import PutRequest, PutResult, RetentionReport
    from tieredstore.read.results import (
        FetchedMessage,
        GetMessageResult,
        GetMessageStatus,
        MessageFilter,
        QueueOffsets,
    )
    from tieredstore.restore import (
        DirectorySink,
        ExportFormat,
        HotStoreSink,
        QueueOutcome,
        RestoreRequest,
        RestoreSink,
        RestoreSummary,
        restore_archive,
    )
    from tieredstore.store import AsyncTieredMessageStore, TieredMessageStore

# Each lazily loaded name and the module that defines it.
_LAZY = {
    "AsyncTieredMessageStore": "tieredstore.store",
    "TieredMessageStore": "tieredstore.store",
    "ReadPolicy": "tieredstore.config",
    "TieredStoreConfig": "tieredstore.config",
    "load_config": "tieredstore.config",
    "Boundary": "tieredstore.basics",
    "BoundaryType": "tieredstore.basics",
    "FetchedMessage": "tieredstore.read.results",
    "GetMessageResult": "tieredstore.read.results",
    "GetMessageStatus": "tieredstore.read.results",
    "MessageFilter": "tieredstore.read.results",
    "QueueOffsets": "tieredstore.read.results",
    "PutRequest": "tieredstore.local.results",
    "PutResult": "tieredstore.local.results",
    "RetentionReport": "tieredstore.local.results",
    "DirectorySink": "tieredstore.restore",
    "ExportFormat": "tieredstore.restore",
    "HotStoreSink": "tieredstore.restore",
    "QueueOutcome": "tieredstore.restore",
    "RestoreRequest": "tieredstore.restore",
    "RestoreSink": "tieredstore.restore",
    "RestoreSummary": "tieredstore.restore",
    "restore_archive": "tieredstore.restore",
}

__all__ = [
    "ArchiverRunningError",
    "AsyncTieredMessageStore",
    "Boundary",
    "BoundaryType",
    "CommitConflictError",
    "CommitTimeoutError",
    "ConcurrentUpdateError",
    "ConditionalWritesUnsupportedError",
    "ConfigError",
    "CorruptRecordError",
    "DirectorySink",
    "ExportFormat",
    "FetchedMessage",
    "GetMessageResult",
    "GetMessageStatus",
    "HotStoreSink",
    "IntegrityError",
    "InvalidPropertyError",
    "InvalidQueueError",
    "InvalidTopicError",
    "LeaseLostError",
    "MessageFilter",
    "MessageTooLargeError",
    "MetadataCorruptError",
    "MetadataError",
    "MetadataUnavailableError",
    "MissingExtraError",
    "NotFoundError",
    "PathEscapeError",
    "PutRequest",
    "PutResult",
    "QueueOffsets",
    "QueueOutcome",
    "ReadOnlyError",
    "ReadPolicy",
    "RestoreRequest",
    "RestoreSink",
    "RestoreSummary",
    "RetentionReport",
    "SchemaVersionError",
    "SegmentNotFoundError",
    "SizeUnknownError",
    "StorageAccessError",
    "StorageError",
    "StorageUnavailableError",
    "StoreFullError",
    "StoreLockedError",
    "TieredMessageStore",
    "TieredStoreConfig",
    "TieredStoreError",
    "ValidationError",
    "load_config",
    "restore_archive",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
