"""A queue's durable end: one past its last message whose record lies wholly below the flushed commit-log position.

Only those messages may leave the hot tier. After a machine crash (power loss) recovery starts at the
checkpoint and keeps every record below the flushed position, so a message archived from below it is
still at its queue offset afterwards; one archived from above it may be gone, and producers would
then write new messages at offsets the archive already holds (RocketMQ's tiered store likewise
dispatches only below the confirmed offset). A consume-queue unit need not be flushed itself:
recovery rebuilds the units of every record past the checkpoint from the commit log.
"""

from __future__ import annotations

from collections.abc import Callable

# (commit-log offset, size) of the record a queue offset's unit points at; None when it cannot be read now.
PositionAt = Callable[[int], tuple[int, int] | None]
# Whether the message at a queue offset is flushed; True up to some offset of a queue, False after it.
IsFlushed = Callable[[int], bool]


class DurableEnd:
    """One queue's durable end, searched from where the last search ended.

    The flushed bound only moves up while a store is open, so a search resumes at the last answer
    and costs a unit look or two per queue per scan instead of a binary search over the whole queue.
    """

    __slots__ = ("_last",)

    def __init__(self) -> None:
        # (flushed bound, durable end) of the last search: one attribute, so threads never see half of it.
        self._last: tuple[tuple[int, ...], int] | None = None

    def find(self, flushed: int, min_offset: int, max_offset: int, position_at: PositionAt) -> int:
        """The first queue offset in [min_offset, max_offset] whose record does not end at or below ``flushed``."""

        def is_flushed(queue_offset: int) -> bool:
            position = position_at(queue_offset)
            return position is not None and position[0] + position[1] <= flushed

        return self.search((flushed,), min_offset, max_offset, is_flushed)

    def search(self, bound: tuple[int, ...], min_offset: int, max_offset: int, is_flushed: IsFlushed) -> int:
        """The first queue offset in [min_offset, max_offset] that ``is_flushed`` rejects.

        ``bound`` is what ``is_flushed`` tests against (an offset, a timestamp): when no part of it
        moved down since the last search, the search resumes at the last answer.
        """
        low = min_offset
        if self._last is not None:
            last_bound, last_end = self._last
            if len(bound) == len(last_bound) and all(now >= then for now, then in zip(bound, last_bound, strict=True)):
                low = max(min_offset, last_end)
        low, high = min(low, max_offset), max_offset
        while low < high:
            middle = (low + high) // 2
            if is_flushed(middle):
                low = middle + 1
            else:
                high = middle
        self._last = (bound, low)
        return low
