"""Handing the GIL to worker threads from a busy event loop, without blocking it.

A coroutine served from memory (the cold reader's cache) holds the GIL; a worker thread that needs it
(a provider reading a response, piece by piece) gets it only when the interpreter forces a switch, once
a switch interval (5 ms). A turn of the event loop does not help: its poll drops the GIL and takes it
back at once, which restarts the waiting thread's wait. So the loop waits instead for a helper thread
that returns after a short pause: meanwhile the loop sits in its selector with the GIL free, the waiting
threads take it, and the loop's other tasks still run as soon as they are ready.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

# How long one hand-off leaves the GIL to other threads (seconds): long enough for a waiting thread to
# wake and take it, short against the once-a-millisecond rate the cold reader hands off at.
DEFAULT_PAUSE = 50e-6


class GilHandoff:
    """Awaitable hand-offs of the GIL; the helper thread starts at the first one and ends at ``close``."""

    def __init__(self, pause: float = DEFAULT_PAUSE) -> None:
        self.pause = pause
        self._executor: ThreadPoolExecutor | None = None

    async def __call__(self) -> None:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tieredstore-gil-handoff")
        await asyncio.get_running_loop().run_in_executor(self._executor, time.sleep, self.pause)

    def close(self) -> None:
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False)
