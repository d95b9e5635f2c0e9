"""The archiver: group-commits every hot-store queue into its cold flat file, queue by queue.

``scheduler`` (the Dispatcher: when each queue goes), ``worker`` (one queue's batch, commit and
backoff), ``lease_rounds`` and ``leases`` (several archivers on one PostgreSQL), ``hot_pages`` (hot-page
release), ``hot_views`` (what the hot store says), ``indexing`` (key-index entries), ``maintenance``
(retention and index upkeep), ``views`` (what the archiver reports).
"""

from tieredstore.archiver.scheduler import Dispatcher
from tieredstore.archiver.views import DispatchStats, HotView, OnceResult, QueueKey, QueueStatus
from tieredstore.archiver.worker import QueueWorker

__all__ = [
    "DispatchStats",
    "Dispatcher",
    "HotView",
    "OnceResult",
    "QueueKey",
    "QueueStatus",
    "QueueWorker",
]
