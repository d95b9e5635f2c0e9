"""The archiver's public names where they were first imported from; the code is in ``tieredstore.archiver``."""

from tieredstore.archiver.scheduler import Dispatcher
from tieredstore.archiver.views import UNSEEN, DispatchStats, HotView, OnceResult, QueueKey, QueueStatus
from tieredstore.basics import now_ms as wall_clock_ms  # the name this clock was first imported by

__all__ = ["UNSEEN", "DispatchStats", "Dispatcher", "HotView", "OnceResult", "QueueKey", "QueueStatus", "wall_clock_ms"]
