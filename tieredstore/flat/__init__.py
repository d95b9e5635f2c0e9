"""The container layer: per-queue cold files built from provider segments, with metadata and recovery."""

from tieredstore.basics import BoundaryType
from tieredstore.flat.append_file import FlatAppendFile
from tieredstore.flat.checker import InvariantProblem, ProblemKind, check_queue_invariant
from tieredstore.flat.commit_log import FlatCommitLogFile
from tieredstore.flat.consume_queue import FlatConsumeQueueFile
from tieredstore.flat.message_file import FlatFileSettings, FlatMessageFile, RecoveryResult
from tieredstore.flat.store import FlatFileStore, RecoveryReport

__all__ = [
    "BoundaryType",
    "FlatAppendFile",
    "FlatCommitLogFile",
    "FlatConsumeQueueFile",
    "FlatFileSettings",
    "FlatFileStore",
    "FlatMessageFile",
    "InvariantProblem",
    "ProblemKind",
    "RecoveryReport",
    "RecoveryResult",
    "check_queue_invariant",
]
