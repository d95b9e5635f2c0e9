"""The bytes a batch reader of the cold tier may hold: what its reads wait for, and give back."""

from __future__ import annotations

from typing import Protocol


class ReadBudget(Protocol):
    """Bytes a batch reader may hold read and not yet handed on (``restore.budget.ByteBudget`` is one)."""

    async def acquire(self, size: int) -> int:
        """Wait until ``size`` bytes fit and hold them; returns what ``release`` gives back."""
        ...

    async def release(self, size: int) -> None: ...


class _Unbounded:
    """The budget of a reader that bounds nothing: every read goes at once."""

    async def acquire(self, size: int) -> int:
        return size

    async def release(self, size: int) -> None:
        return None


UNBOUNDED: ReadBudget = _Unbounded()
