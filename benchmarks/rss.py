"""Peak resident memory of a process tree, sampled on a background thread with psutil."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from types import TracebackType

import psutil

DEFAULT_INTERVAL_S = 0.05


def tree_rss(root: psutil.Process, exclude: set[int]) -> int:
    """Resident bytes of ``root`` and its descendants, leaving out ``exclude`` and everything under them."""
    total = 0
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
        return 0
    for process in processes:
        if process.pid in excluded_trees:
            continue
        try:
            total += process.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total


class PeakRss:
    """``with PeakRss() as peak: ...``; ``peak.bytes`` is the largest tree RSS seen while inside.

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

    def _sample(self) -> None:
        self.bytes = max(self.bytes, tree_rss(self._root, self._exclude))

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
