"""The cap on record bytes a restore has read from cold storage and not yet written."""

from __future__ import annotations

import asyncio


class ByteBudget:
    """Record bytes read from cold storage and not yet written, capped: a read waits until its bytes fit.

    A batch larger than the whole cap still goes, alone (it takes the whole cap), so nothing waits forever.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.peak = 0
        self._changed = asyncio.Condition()

    async def acquire(self, size: int) -> int:
        """Wait until ``size`` bytes fit under the cap and hold them; returns what ``release`` takes back."""
        size = min(size, self.limit)
        async with self._changed:
            await self._changed.wait_for(lambda: self.held + size <= self.limit)
            self.held += size
            self.peak = max(self.peak, self.held)
        return size

    async def release(self, size: int) -> None:
        async with self._changed:
            self.held -= size
            self._changed.notify_all()
