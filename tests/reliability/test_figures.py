"""A reliability run's figures become RELIABILITY.md's plots."""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path
from types import ModuleType

from tests.reliability.figures import Sampler, save_figure

REPO = Path(__file__).resolve().parents[2]


def _plots_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("reliability_plots", REPO / "scripts" / "reliability_plots.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_a_sampled_outage_and_a_crash_loop_are_drawn(tmp_path: Path) -> None:
    figures = tmp_path / "figures"
    readings = {"put": 0.0, "archived": 0.0, "up": 1.0}
    sampler = Sampler(
        {
            "put": lambda: readings["put"],
            "archived": lambda: readings["archived"],
            "cold_storage_up": lambda: readings["up"],
            "commit_failures": lambda: 0.0,
        },
        interval=0.01,
    )
    sampler.start()
    for step in range(12):
        readings["put"] += 10
        readings["archived"] = readings["put"] if readings["up"] else readings["archived"]
        if step == 3:
            sampler.mark("outage began")
            readings["up"] = 0.0
        if step == 7:
            sampler.mark("outage ended")
            readings["up"] = 1.0
        await asyncio.sleep(0.02)
    sampler.mark("last put")
    sampler.mark("caught up")
    await sampler.stop()
    outage = sampler.figure(outage_seconds=0.08, producer_rate=500)
    assert len(outage["rows"]) >= 5 and outage["columns"][0] == "seconds"
    save_figure("archiver-outage", outage, figures)
    crash = {"kills": [[0.5, "archiver"], [0.7, "producer"]], "checks": [[1.0, 40]], "acknowledged": 90,
             "archived": 100, "seconds": 2.0, "seed": 1}  # fmt: skip
    save_figure("crash-loop", crash, figures)
    assert json.loads((figures / "crash-loop.json").read_text()) == crash

    drawn = _plots_script().main(figures, tmp_path / "plots")
    assert sorted(path.name for path in drawn) == ["archiver-outage.png", "crash-loop.png"]
    for path in drawn:
        assert path.read_bytes().startswith(b"\x89PNG") and path.stat().st_size > 10_000
