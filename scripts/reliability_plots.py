"""Draw RELIABILITY.md's plots from the figures a reliability run wrote.

    TIEREDSTORE_RELIABILITY_FIGURES=/tmp/figures .venv/bin/python -m pytest -s \\
        tests/reliability/test_archiver_s3_faults.py tests/reliability/test_crash_loop.py
    .venv/bin/python scripts/reliability_plots.py /tmp/figures

Each figure a run wrote (``tests/reliability/figures.py``) becomes ``docs/assets/reliability/<name>.png``;
a figure the run did not write leaves its plot as it was.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display on a server or in CI
import matplotlib.pyplot as plt

PLOTS = Path(__file__).resolve().parents[1] / "docs" / "assets" / "reliability"


def _column(figure: dict[str, Any], name: str) -> list[float]:
    at = figure["columns"].index(name)
    return [row[at] for row in figure["rows"]]


def draw_outage(figure: dict[str, Any], path: Path) -> None:
    """Puts and archived messages over time, the outage shaded, the storage gauge and lag below."""
    seconds = _column(figure, "seconds")
    put, archived = _column(figure, "put"), _column(figure, "archived")
    events = figure["events"]
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(8, 5.5), height_ratios=(3, 1.4))
    top.plot(seconds, put, label="messages put (hot store)")
    top.plot(seconds, archived, label="messages archived (S3)")
    top.set_ylabel("messages")
    bottom.plot(seconds, [p - a for p, a in zip(put, archived, strict=True)], color="tab:red", label="lag")
    bottom.set_ylabel("lag (messages)")
    gauge = bottom.twinx()
    gauge.step(seconds, _column(figure, "cold_storage_up"), where="post", color="tab:gray", label="cold_storage_up")
    gauge.set_ylim(-0.1, 1.1)
    gauge.set_yticks([0, 1])
    gauge.set_ylabel("cold_storage_up")
    for axes in (top, bottom):
        axes.axvspan(events["outage began"], events["outage ended"], color="tab:orange", alpha=0.15)
        axes.grid(alpha=0.3)
    top.annotate(
        f"S3 refuses connections ({figure['outage_seconds']:.0f} s)",
        xy=(events["outage began"], 0.96),
        xycoords=("data", "axes fraction"),
        fontsize=8,
        va="top",
    )
    for event in ("last put", "caught up"):
        top.axvline(events[event], color="tab:gray", linestyle=":", linewidth=1)
        top.annotate(event, xy=(events[event], 0.04), xycoords=("data", "axes fraction"), fontsize=8, rotation=90)
    top.legend(loc="upper left", bbox_to_anchor=(0.0, 0.88), fontsize=8)
    bottom.legend(loc="upper left", fontsize=8)
    gauge.legend(loc="upper right", fontsize=8)
    bottom.set_xlabel("seconds")
    top.set_title(f"Storage outage while a producer puts {figure['producer_rate']:,} msg/s")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def draw_crash_loop(figure: dict[str, Any], path: Path) -> None:
    """Messages archived at each check of the archive, with every SIGKILL of either process marked."""
    fig, axes = plt.subplots(figsize=(8, 4))
    checks = figure["checks"]
    axes.plot([t for t, _ in checks], [n for _, n in checks], marker="o", label="archived, checker clean")
    axes.scatter([figure["seconds"]], [figure["archived"]], marker="*", s=120, color="tab:green", zorder=3)
    axes.annotate(
        f"end: {figure['archived']:,} archived once, {figure['acknowledged']:,} acknowledged puts among them",
        xy=(figure["seconds"], figure["archived"]),
        xytext=(-8, 0),
        textcoords="offset points",
        ha="right",
        va="center",
        fontsize=8,
    )
    for victim, color, level in (("archiver", "tab:red", 0.0), ("producer", "tab:blue", 0.05)):
        times = [t for t, who in figure["kills"] if who == victim]
        axes.plot(
            times,
            [level] * len(times),
            "|",
            color=color,
            markersize=10,
            transform=axes.get_xaxis_transform(),
            label=f"SIGKILL of the {victim} ({len(times)})",
        )
    axes.set_xlabel("seconds")
    axes.set_ylabel("messages archived")
    axes.set_ylim(bottom=0)
    axes.grid(alpha=0.3)
    axes.legend(loc="upper left", fontsize=8)
    axes.set_title("Crash loop: producer and archiver SIGKILLed at random, archive checked every 10 kills")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


DRAWERS = {"archiver-outage": draw_outage, "crash-loop": draw_crash_loop}


def main(figures: Path, plots: Path = PLOTS) -> list[Path]:
    plots.mkdir(parents=True, exist_ok=True)
    drawn = []
    for name, draw in DRAWERS.items():
        source = figures / f"{name}.json"
        if source.exists():
            target = plots / f"{name}.png"
            draw(json.loads(source.read_text(encoding="utf-8")), target)
            drawn.append(target)
    return drawn


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: reliability_plots.py FIGURES_DIR")
    for path in main(Path(sys.argv[1])):
        print(path)
