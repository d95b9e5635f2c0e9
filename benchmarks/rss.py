"""Peak resident memory of a process tree, sampled on a background thread with psutil."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from types import TracebackType

import psutil

DEFAULT_INTERVAL_S = 0.05


def tree_rss(root: psutil.Process, exclude: set[int]) -> int:
    """Resident bytes of ``root`` and its descendants, leaving out ``exclude`` and everything under them."""
    return tree_memory(root, exclude)[0]


def tree_memory(root: psutil.Process, exclude: set[int]) -> tuple[int, int]:
    """(resident, anonymous resident) bytes of ``root``'s tree, leaving out ``exclude`` and what is under them.

    Anonymous is resident minus file-backed and shared pages: what the processes hold themselves. Pages
    of a memory-mapped file that was read (the hot store's commit log) count as resident but not as
    anonymous; the kernel can drop them at will, as it can any page-cache page.
    """
    total = anonymous = 0
    excluded_trees: set[int] = set()
    for pid in exclude:
        try:
            excluded_trees.add(pid)
            excluded_trees.update(child.pid for child in psutil.Process(pid).children(recursive=True))
        except psutil.NoSuchProcess:
            continue
    try:
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0, 0
    for process in processes:
        if process.pid in excluded_trees:
            continue
        try:
            memory = process.memory_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        total += memory.rss
        anonymous += max(0, memory.rss - getattr(memory, "shared", 0))
    return total, anonymous


class PeakRss:
    """``with PeakRss() as peak: ...``; ``peak.bytes`` is the largest tree RSS seen while inside.

    ``peak.anonymous_bytes`` is the largest anonymous part (RSS less file-backed and shared pages).

    ``pid`` defaults to this process; services we started (a moto server) go in ``exclude``.
    Sampling every 50 ms can miss a spike shorter than that, so the figure is a lower bound.
    """

    def __init__(self, pid: int | None = None, *, exclude: Iterable[int] = (), interval: float = DEFAULT_INTERVAL_S):
        self._root = psutil.Process(pid)
        self._exclude = set(exclude)
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample_until_stopped, name="peak-rss", daemon=True)
        self.bytes = 0
        self.anonymous_bytes = 0

    def _sample(self) -> None:
        resident, anonymous = tree_memory(self._root, self._exclude)
        self.bytes = max(self.bytes, resident)
        self.anonymous_bytes = max(self.anonymous_bytes, anonymous)

    def _sample_until_stopped(self) -> None:
        while not self._stop.wait(self._interval):
            self._sample()

    def __enter__(self) -> PeakRss:
        self._sample()
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    @property
    def mib(self) -> float:
        return self.bytes / (1 << 20)

    @property
    def anonymous_mib(self) -> float:
        return self.anonymous_bytes / (1 << 20)
