"""The local hot store: commit log, consume queues, crash recovery and the producer API."""

from tieredstore.local.config import LocalStoreConfig
from tieredstore.local.flusher import FlushStats
from tieredstore.local.follower import HotStoreFollower
from tieredstore.local.hot_reader import HotReader, hot_writer
from tieredstore.local.store import (
    LocalMessageStore,
    PutRequest,
    PutResult,
    RecoveryReport,
    RetentionReport,
    StoredMessage,
)
from tieredstore.local.store_lock import writer_lock_held

__all__ = [
    "FlushStats",
    "HotReader",
    "HotStoreFollower",
    "LocalMessageStore",
    "LocalStoreConfig",
    "PutRequest",
    "PutResult",
    "RecoveryReport",
    "RetentionReport",
    "StoredMessage",
    "hot_writer",
    "writer_lock_held",
]
