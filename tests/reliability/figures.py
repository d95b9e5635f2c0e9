"""Time series of reliability scenarios, for RELIABILITY.md's plots: written only when asked for.

With ``TIEREDSTORE_RELIABILITY_FIGURES=DIR`` a scenario writes what it sampled to ``DIR/<name>.json``;
``python scripts/reliability_plots.py DIR`` draws them into ``docs/assets/reliability/``. Without it
nothing is written, so the suite reads and writes only its temporary directories.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

FIGURES_ENV = "TIEREDSTORE_RELIABILITY_FIGURES"
# Read at import, as the scale is: the suite's fixtures hide every TIEREDSTORE_* variable from the tests.
FIGURES_DIR = os.environ.get(FIGURES_ENV) or None


def save_figure(name: str, figure: dict[str, Any], directory: str | Path | None = FIGURES_DIR) -> Path | None:
    """Write ``figure`` as ``name``.json into ``directory`` (the environment's); None when there is none."""
    if directory is None:
        return None
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    path.write_text(json.dumps(figure, indent=1), encoding="utf-8")
    return path


class Sampler:
    """Samples ``columns`` (name -> reading) every ``interval`` seconds in a task, from when it starts."""

    def __init__(self, columns: dict[str, Callable[[], float]], interval: float = 0.1) -> None:
        self.columns = columns
        self.interval = interval
        self.started = time.monotonic()
        self.rows: list[list[float]] = []
        self.events: dict[str, float] = {}
        self._task: asyncio.Task[None] | None = None

    def elapsed(self) -> float:
        return round(time.monotonic() - self.started, 3)

    def mark(self, event: str) -> None:
        """Note when ``event`` happened, in seconds since the start."""
        self.events[event] = self.elapsed()

    async def _run(self) -> None:
        while True:
            self.rows.append([self.elapsed(), *(float(read()) for read in self.columns.values())])
            await asyncio.sleep(self.interval)

    def start(self) -> None:
        self.started = time.monotonic()
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def figure(self, **about: Any) -> dict[str, Any]:
        return {"columns": ["seconds", *self.columns], "rows": self.rows, "events": self.events, **about}
