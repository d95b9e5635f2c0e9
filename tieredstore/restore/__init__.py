"""Restoring archived messages: back into a hot store at their own queue offsets, or out to files, resumably.

``restore_archive(node, request, sink)`` with a ``ReadNode`` from ``tieredstore.read.node.open_read_node``
and a ``HotStoreSink`` or ``DirectorySink``; the ``tieredstore restore`` command is a thin layer over it.
"""

from tieredstore.restore.engine import restore_archive
from tieredstore.restore.request import DEFAULT_BATCH_MESSAGES, QueueOutcome, RestoreRequest, RestoreSummary
from tieredstore.restore.sinks import DirectorySink, ExportFormat, HotStoreSink, RestoreSink

__all__ = [
    "DEFAULT_BATCH_MESSAGES",
    "DirectorySink",
    "ExportFormat",
    "HotStoreSink",
    "QueueOutcome",
    "RestoreRequest",
    "RestoreSink",
    "RestoreSummary",
    "restore_archive",
]
