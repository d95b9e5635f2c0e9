"""An upload rate limit as a provider wrapper: every commit of every segment draws on one token bucket.

The bucket holds up to one second of the rate (the budget) and refills continuously on the monotonic
clock. A commit takes as many tokens as it writes bytes; it waits, in arrival order, until the bucket
holds its size. A commit larger than the budget waits for a full bucket, then goes alone and leaves the
bucket in debt, which the commits after it pay by waiting: the long-run rate is the cap whatever the
sizes, and a single batch above the budget is never refused. Only ``_commit`` is throttled; reads,
listings and deletes pass through.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import ClassVar

from tieredstore.errors import ValidationError
from tieredstore.providers.base import FileSegment, Provider
from tieredstore.providers.wrapper import WrappedProvider, WrappedSegment


class UploadBudget:
    """A token bucket of bytes: ``rate`` a second, at most ``burst`` (default one second's worth) saved up.

    ``on_wait`` is told the seconds each throttled commit waited (for a metric). One budget serves the
    commits of one event loop; they are admitted in the order they asked.
    """

    def __init__(
        self,
        rate: float,
        *,
        burst: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_wait: Callable[[float], None] | None = None,
    ) -> None:
        if rate <= 0:
            raise ValidationError(f"an upload rate must be positive, not {rate}")
        self.rate = float(rate)
        self.burst = float(burst) if burst is not None else self.rate
        if self.burst <= 0:
            raise ValidationError(f"an upload burst must be positive, not {burst}")
        self._clock = clock
        self._on_wait = on_wait
        self._tokens = self.burst
        self._refilled_at = clock()
        # Held while a commit waits for its tokens: the next in line cannot overtake it.
        self._turn = asyncio.Lock()

    @property
    def tokens(self) -> float:
        """Bytes that may go now without waiting (negative: a debt still to be paid)."""
        self._refill()
        return self._tokens

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._refilled_at) * self.rate)
        self._refilled_at = now

    async def spend(self, size: int) -> float:
        """Wait until ``size`` bytes may be uploaded, then take them; returns the seconds waited."""
        if size <= 0:
            return 0.0
        asked_at = self._clock()
        held_up = self._turn.locked()  # another commit is waiting for its budget: this one queues behind it
        async with self._turn:
            # Above the budget, a full bucket is all it can wait for: it goes, and the debt is paid after it.
            needed = min(float(size), self.burst)
            self._refill()
            while self._tokens < needed:
                held_up = True
                await asyncio.sleep((needed - self._tokens) / self.rate)
                self._refill()
            self._tokens -= size
        if not held_up:
            return 0.0
        waited = self._clock() - asked_at
        if self._on_wait is not None:
            self._on_wait(waited)
        return waited


class ThrottledSegment(WrappedSegment):
    """A segment whose commits wait for their bytes in a shared UploadBudget before they are sent."""

    def __init__(self, inner: FileSegment, budget: UploadBudget) -> None:
        super().__init__(inner)
        self.budget = budget

    async def _commit(self, position: int, data: bytes | bytearray) -> None:
        await self.budget.spend(len(data))
        await self.inner._commit(position, data)


class ThrottledProvider(WrappedProvider):
    """A provider whose segments all draw their commits from one UploadBudget."""

    scheme: ClassVar[str] = "throttled"

    def __init__(self, inner: Provider, budget: UploadBudget) -> None:
        super().__init__(inner)
        self.budget = budget

    def wrap(self, segment: FileSegment) -> ThrottledSegment:
        return ThrottledSegment(segment, self.budget)
