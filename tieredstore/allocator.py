"""The archiver's allocator tuning, now in ``tieredstore.tuning``; kept so that existing imports work."""

from __future__ import annotations

from tieredstore.tuning import ARCHIVER_ARENAS as ALLOCATOR_ARENAS
from tieredstore.tuning import ARCHIVER_THRESHOLD_BYTES as ALLOCATOR_THRESHOLD_BYTES
from tieredstore.tuning import tune_for_archiver as tune_allocator

__all__ = ["ALLOCATOR_ARENAS", "ALLOCATOR_THRESHOLD_BYTES", "tune_allocator"]
