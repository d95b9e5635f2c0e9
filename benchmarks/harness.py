"""The benchmark harness: named benchmarks, alternating baseline/ours rounds, pair-by-pair ratios, JSON results.

A benchmark is a function of a :class:`BenchmarkContext`, registered by name with :func:`benchmark` in a
module of ``benchmarks.suite`` (discovered on import, so a new benchmark is one new module). It prepares
its own data under ``ctx.work_dir`` and calls :meth:`BenchmarkContext.compare` once per comparison; the
harness then runs baseline, ours, baseline, ours ... for ``ctx.rounds`` rounds, each side in a fresh
directory, and keeps every figure. Ratios are taken round by round (ours of round i over baseline of round
i), so background load that slows one round slows both sides of the pair.
"""

from __future__ import annotations

import enum
import importlib
import json
import math
import pkgutil
import shutil
import statistics
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.machine import machine_facts

RESULT_SCHEMA_VERSION = 1
FULL_ROUNDS = 3
QUICK_ROUNDS = 1
DEFAULT_RESULTS_DIR = Path(__file__).parent / "results"
SUITE_PACKAGE = "benchmarks.suite"


class Metric(enum.StrEnum):
    """What a comparison ranks: items per second (higher is better), elapsed seconds or the bytes a side
    left in storage (``Measurement.bytes``; both lower is better)."""

    THROUGHPUT = "throughput"
    SECONDS = "seconds"
    STORED_BYTES = "stored_bytes"


@dataclass(frozen=True, slots=True)
class Measurement:
    """One side of one round: how long it took and how much it did.

    ``items`` counts the unit of the comparison (messages, objects, queues); ``bytes`` is set when a
    bytes/s figure means something; ``extras`` holds any other per-round figure (requests, peak RSS),
    which the harness summarises as median, min and max.
    """

    seconds: float
    items: int
    bytes: int | None = None
    extras: Mapping[str, float] = field(default_factory=dict)


SideRun = Callable[[Path], Measurement]


@dataclass(frozen=True, slots=True)
class Contender:
    """A labelled side of a comparison; ``run`` gets a fresh empty directory for the round."""

    label: str
    run: SideRun


@dataclass(frozen=True, slots=True)
class Target:
    """What an issue asks of the ratio ours/baseline, in words and as bounds."""

    text: str
    min_ratio: float | None = None
    max_ratio: float | None = None

    @classmethod
    def at_least(cls, ratio: float, text: str) -> Target:
        return cls(text=text, min_ratio=ratio)

    @classmethod
    def at_most(cls, ratio: float, text: str) -> Target:
        return cls(text=text, max_ratio=ratio)

    def is_met(self, ratio: float) -> bool:
        if self.min_ratio is not None and ratio < self.min_ratio:
            return False
        return not (self.max_ratio is not None and ratio > self.max_ratio)

    def to_json(self) -> dict[str, Any]:
        return {"text": self.text, "min_ratio": self.min_ratio, "max_ratio": self.max_ratio}


def summarise(values: Sequence[float]) -> dict[str, Any]:
    """Median, min and max of ``values`` (which are kept too, in round order)."""
    return {
        "values": list(values),
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
    }


def _side_summary(label: str, measurements: Sequence[Measurement], metric: Metric, unit: str) -> dict[str, Any]:
    if metric is Metric.THROUGHPUT:
        values = [m.items / m.seconds if m.seconds > 0 else math.inf for m in measurements]
        value_unit = f"{unit}/s"
    elif metric is Metric.STORED_BYTES:
        if any(m.bytes is None for m in measurements):
            raise ValueError(f"{label}: a stored-bytes comparison needs the bytes of every round")
        values = [float(m.bytes or 0) for m in measurements]
        value_unit = "B"
    else:
        values = [m.seconds for m in measurements]
        value_unit = "s"
    summary: dict[str, Any] = {"label": label, "unit": value_unit, **summarise(values)}
    summary["seconds"] = summarise([m.seconds for m in measurements])
    summary["items"] = [m.items for m in measurements]
    byte_counts = [m.bytes for m in measurements]
    # Stored bytes over the seconds it took to write them would read as a transfer rate, which it is not.
    if metric is not Metric.STORED_BYTES and all(b is not None for b in byte_counts):
        summary["mb_per_s"] = summarise(
            [
                (b or 0) / m.seconds / 1e6 if m.seconds > 0 else math.inf
                for b, m in zip(byte_counts, measurements, strict=True)
            ]
        )
    extra_names = sorted({name for m in measurements for name in m.extras})
    summary["extras"] = {
        name: summarise([m.extras[name] for m in measurements if name in m.extras]) for name in extra_names
    }
    return summary


@dataclass(frozen=True, slots=True)
class Benchmark:
    """A registered benchmark: its name on the command line, what it measures, and the issue it serves."""

    name: str
    title: str
    issue: int | None
    summary: str
    run: Callable[[BenchmarkContext], None]


_REGISTRY: dict[str, Benchmark] = {}


def benchmark(
    name: str, *, title: str, issue: int | None, summary: str
) -> Callable[[Callable[[BenchmarkContext], None]], Callable[[BenchmarkContext], None]]:
    """Register the decorated function as the benchmark ``name``."""

    def register(run: Callable[[BenchmarkContext], None]) -> Callable[[BenchmarkContext], None]:
        if name in _REGISTRY and _REGISTRY[name].run is not run:
            raise ValueError(f"benchmark {name!r} is registered twice")
        _REGISTRY[name] = Benchmark(name=name, title=title, issue=issue, summary=summary, run=run)
        return run

    return register


def unregister(name: str) -> None:
    """Forget a benchmark (tests register throwaway ones)."""
    _REGISTRY.pop(name, None)


def discover() -> tuple[dict[str, Benchmark], dict[str, str]]:
    """Import every module of the suite; the registry, and the modules that failed to import with why.

    A module whose code under test has not landed yet fails to import; the others still run.
    """
    suite = importlib.import_module(SUITE_PACKAGE)
    failures: dict[str, str] = {}
    for module in sorted(pkgutil.iter_modules(suite.__path__), key=lambda m: m.name):
        if module.name.startswith("_"):
            continue
        try:
            importlib.import_module(f"{SUITE_PACKAGE}.{module.name}")
        except Exception as exc:  # noqa: BLE001 - any import failure of one benchmark must not stop the others
            failures[module.name] = f"{type(exc).__name__}: {exc}"
    return dict(_REGISTRY), failures


class BenchmarkContext:
    """What a benchmark sees: its scale (quick or full), a work directory, and the recorders of results."""

    def __init__(self, bench: Benchmark, *, quick: bool, rounds: int, work_dir: Path) -> None:
        self.benchmark = bench
        self.quick = quick
        self.rounds = rounds
        self.work_dir = work_dir
        self.parameters: dict[str, Any] = {}
        self.comparisons: list[dict[str, Any]] = []
        self.figures: list[dict[str, Any]] = []
        self.series: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.not_run: list[dict[str, Any]] = []

    def scale(self, full: int, quick: int) -> int:
        """``full`` normally, ``quick`` under --quick."""
        return quick if self.quick else full

    def parameter(self, **values: Any) -> None:
        """Record the sizes and settings the figures depend on."""
        self.parameters.update(values)

    def note(self, text: str) -> None:
        """A sentence for BENCHMARKS.md (a scale-down, a caveat)."""
        self.notes.append(text)

    def compare(
        self,
        name: str,
        *,
        baseline: Contender,
        ours: Contender,
        unit: str,
        metric: Metric = Metric.THROUGHPUT,
        target: Target | None = None,
        description: str = "",
        rounds: int | None = None,
    ) -> dict[str, Any]:
        """Run baseline and ours alternately, ``rounds`` times (default: the context's), and record both."""
        round_count = rounds if rounds is not None else self.rounds
        baseline_runs: list[Measurement] = []
        ours_runs: list[Measurement] = []
        for round_index in range(round_count):
            for side, contender, runs in (("baseline", baseline, baseline_runs), ("ours", ours, ours_runs)):
                round_dir = self.work_dir / f"{name}-round{round_index}-{side}"
                round_dir.mkdir(parents=True)
                try:
                    runs.append(contender.run(round_dir))
                finally:
                    shutil.rmtree(round_dir, ignore_errors=True)
        baseline_summary = _side_summary(baseline.label, baseline_runs, metric, unit)
        ours_summary = _side_summary(ours.label, ours_runs, metric, unit)
        ratios = [
            o / b if b > 0 else math.inf
            for o, b in zip(ours_summary["values"], baseline_summary["values"], strict=True)
        ]
        ratio = summarise(ratios)
        comparison: dict[str, Any] = {
            "name": name,
            "description": description,
            "metric": metric.value,
            "rounds": round_count,
            "baseline": baseline_summary,
            "ours": ours_summary,
            "ratio": ratio,
            "target": target.to_json() if target is not None else None,
            "met": target.is_met(ratio["median"]) if target is not None else None,
        }
        self.comparisons.append(comparison)
        return comparison

    def skip_comparison(self, name: str, *, reason: str, target: Target | None = None, description: str = "") -> None:
        """Record that the comparison ``name`` was not run and why (a baseline tool missing on this machine).

        The benchmark goes on with its other comparisons; the report shows the pair as not run.
        """
        self.not_run.append(
            {
                "name": name,
                "description": description,
                "reason": reason,
                "target": target.to_json() if target is not None else None,
            }
        )

    def figure(self, name: str, values: Sequence[float], unit: str, description: str = "") -> dict[str, Any]:
        """A figure with no baseline (a latency, a peak RSS), one value per round."""
        entry = {"name": name, "unit": unit, "description": description, **summarise(values)}
        self.figures.append(entry)
        return entry

    def curve(
        self,
        name: str,
        *,
        title: str,
        x_label: str,
        y_label: str,
        x: Sequence[float],
        lines: Mapping[str, Sequence[float]],
        log_x: bool = False,
        log_y: bool = False,
    ) -> None:
        """A scaling curve: one or more lines over the same x values, drawn as a PNG by the report."""
        for label, ys in lines.items():
            if len(ys) != len(x):
                raise ValueError(f"curve {name!r} line {label!r} has {len(ys)} points for {len(x)} x values")
        self.series.append(
            {
                "name": name,
                "title": title,
                "x_label": x_label,
                "y_label": y_label,
                "x": list(x),
                "lines": {label: list(ys) for label, ys in lines.items()},
                "log_x": log_x,
                "log_y": log_y,
            }
        )


@contextmanager
def stopwatch() -> Iterator[Callable[[], float]]:
    """``with stopwatch() as elapsed: ...``; ``elapsed()`` is the seconds spent inside the block."""
    start = time.perf_counter()
    end: float | None = None

    def elapsed() -> float:
        return (end if end is not None else time.perf_counter()) - start

    try:
        yield elapsed
    finally:
        end = time.perf_counter()


def command_for(name: str, *, quick: bool, rounds: int | None = None) -> str:
    """The exact command that reproduces one benchmark's result (``rounds``: an overridden round count)."""
    flags = (" --quick" if quick else "") + (f" --rounds {rounds}" if rounds else "")
    return f"python -m benchmarks run {name}{flags}"


def result_path(out_dir: Path, name: str, *, quick: bool, started: datetime) -> Path:
    stamp = started.strftime("%Y%m%dT%H%M%S%fZ")
    return out_dir / f"{name}-{'quick' if quick else 'full'}-{stamp}.json"


def run_one(bench: Benchmark, *, quick: bool, out_dir: Path, rounds: int | None = None) -> dict[str, Any]:
    """Run one benchmark in a temporary directory and return its result document (also written to ``out_dir``).

    A benchmark that raises is recorded with status ``failed`` and its traceback, so one broken benchmark
    leaves the others' results intact.
    """
    round_count = rounds if rounds is not None else (QUICK_ROUNDS if quick else FULL_ROUNDS)
    started = datetime.now(UTC)
    status = "ok"
    error: str | None = None
    with tempfile.TemporaryDirectory(prefix=f"tieredstore-bench-{bench.name}-") as work:
        ctx = BenchmarkContext(bench, quick=quick, rounds=round_count, work_dir=Path(work))
        with stopwatch() as elapsed:
            try:
                bench.run(ctx)
            except Exception:  # noqa: BLE001 - recorded in the result and reported; the next benchmark runs
                status = "failed"
                error = traceback.format_exc()
    document: dict[str, Any] = {
        "schema": RESULT_SCHEMA_VERSION,
        "benchmark": bench.name,
        "title": bench.title,
        "issue": bench.issue,
        "summary": bench.summary,
        "command": command_for(bench.name, quick=quick, rounds=rounds),
        "quick": quick,
        "rounds": round_count,
        "status": status,
        "error": error,
        "started": started.isoformat(),
        "duration_s": elapsed(),
        "machine": machine_facts(),
        "parameters": ctx.parameters,
        "comparisons": ctx.comparisons,
        "not_run": ctx.not_run,
        "figures": ctx.figures,
        "series": ctx.series,
        "notes": ctx.notes,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    path = result_path(out_dir, bench.name, quick=quick, started=started)
    path.write_text(json.dumps(document, indent=2, default=str) + "\n", encoding="utf-8")
    document["path"] = str(path)
    return document
