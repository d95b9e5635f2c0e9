"""Regenerate BENCHMARKS.md tables and the scaling-curve PNGs from saved JSON results.

Each benchmark owns one generated block in BENCHMARKS.md between ``<!-- benchmark:NAME:begin -->`` and
``<!-- benchmark:NAME:end -->``; everything outside the blocks (introduction, profiles, hot spots) is
written by hand and kept as is. A benchmark without a block yet gets one appended at the end.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.harness import DEFAULT_RESULTS_DIR, RESULT_SCHEMA_VERSION

REPOSITORY = Path(__file__).resolve().parent.parent
DEFAULT_MARKDOWN = REPOSITORY / "BENCHMARKS.md"
DEFAULT_PLOTS_DIR = Path(__file__).parent / "plots"


def begin_marker(name: str) -> str:
    return f"<!-- benchmark:{name}:begin -->"


def end_marker(name: str) -> str:
    return f"<!-- benchmark:{name}:end -->"


def load_results(results_dir: Path) -> list[dict[str, Any]]:
    """Every readable result document in ``results_dir``, oldest first."""
    documents: list[dict[str, Any]] = []
    for path in sorted(results_dir.glob("*.json")):
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(document, dict) and document.get("schema") == RESULT_SCHEMA_VERSION:
            document["path"] = str(path)
            documents.append(document)
    documents.sort(key=lambda d: str(d.get("started", "")))
    return documents


def latest_results(documents: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per benchmark, the newest successful full run; a quick or failed run only when nothing better exists."""

    def rank(document: dict[str, Any]) -> tuple[int, int, str]:
        return (document.get("status") == "ok", not document.get("quick"), str(document.get("started", "")))

    best: dict[str, dict[str, Any]] = {}
    for document in documents:
        name = str(document["benchmark"])
        if name not in best or rank(document) >= rank(best[name]):
            best[name] = document
    return best


def _number(value: float) -> str:
    if value != value or value in (float("inf"), float("-inf")):
        return str(value)
    magnitude = abs(value)
    if float(value).is_integer() and magnitude < 1e15:
        return f"{int(value):,}"
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 100:
        return f"{value:.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    if magnitude >= 0.01:
        return f"{value:.3f}"
    return f"{value:.2g}"


def _spread(summary: dict[str, Any]) -> str:
    if summary["min"] == summary["max"]:
        return _number(summary["median"])
    return f"{_number(summary['median'])} ({_number(summary['min'])}-{_number(summary['max'])})"


def _verdict(comparison: dict[str, Any]) -> str:
    target = comparison.get("target")
    if target is None:
        return "— (no target)"
    ratio = comparison["ratio"]["median"]
    if comparison["met"]:
        return "**met**"
    if target.get("min_ratio"):
        shortfall = target["min_ratio"] / ratio if ratio > 0 else float("inf")
        return f"**missed** ({_number(shortfall)}x short of {_number(target['min_ratio'])})"
    if target.get("max_ratio"):
        excess = ratio / target["max_ratio"]
        return f"**missed** ({_number(excess)}x over {_number(target['max_ratio'])})"
    return "**missed**"


def _side_cell(side: dict[str, Any]) -> str:
    cell = f"{side['label']}: {_spread(side)} {side['unit']}"
    if "mb_per_s" in side:
        cell += f", {_number(side['mb_per_s']['median'])} MB/s"
    return cell


def _extras_lines(comparison: dict[str, Any]) -> list[str]:
    lines = []
    for side_name in ("baseline", "ours"):
        side = comparison[side_name]
        for extra, summary in side.get("extras", {}).items():
            lines.append(f"{comparison['name']} · {side_name} ({side['label']}) · {extra}: {_spread(summary)}")
    return lines


def machine_line(machine: dict[str, Any]) -> str:
    memory_gib = machine.get("memory_bytes", 0) / (1 << 30)
    packages = machine.get("packages", {})
    shown = ", ".join(f"{name} {version}" for name, version in packages.items() if version)
    git = machine.get("git") or {}
    commit = (git.get("commit") or "unknown")[:10] + (" (working tree modified)" if git.get("dirty") else "")
    load = machine.get("load_average")
    load_text = f"; load average at start {', '.join(f'{x:.2f}' for x in load)}" if load else ""
    return (
        f"{machine.get('logical_cores')} cores ({machine.get('cpu_model')}), {memory_gib:.0f} GiB, "
        f"{machine.get('platform')}, temp dir on {machine.get('temp_filesystem')}, "
        f"Python {machine.get('python')}; {shown}; commit {commit}{load_text}"
    )


def plot_name(benchmark: str, series: str) -> str:
    return f"{benchmark}-{series}.png"


def render_section(document: dict[str, Any], *, plots_dir: Path, markdown_dir: Path) -> str:
    """The generated block of one benchmark (markers included)."""
    name = document["benchmark"]
    issue = f" (issue {document['issue']})" if document.get("issue") is not None else ""
    lines = [begin_marker(name), f"### {document['title']}{issue}", "", document.get("summary", ""), ""]
    run_kind = "quick smoke run, figures not representative" if document.get("quick") else "full run"
    lines.append(
        f"Command: `{document['command']}` — {run_kind}, {document['rounds']} round(s) alternating "
        f"baseline/ours, taken {str(document['started'])[:16].replace('T', ' ')} UTC in {document['duration_s']:.0f} s."
    )
    lines += ["", f"Machine: {machine_line(document.get('machine', {}))}.", ""]
    if document.get("status") != "ok":
        error = (document.get("error") or "").strip().splitlines()
        lines += [f"**The last run failed**: `{error[-1] if error else 'unknown error'}`", ""]
    if document.get("parameters"):
        params = ", ".join(f"{key} = {value}" for key, value in document["parameters"].items())
        lines += [f"Parameters: {params}.", ""]
    comparisons = document.get("comparisons", [])
    not_run = document.get("not_run", [])
    if comparisons or not_run:
        lines += [
            "| comparison | baseline: median (min-max) | ours: median (min-max) | ratio ours/baseline, "
            "pair by pair: median (min-max) | target | verdict |",
            "|---|---|---|---|---|---|",
        ]
        for comparison in comparisons:
            target = comparison.get("target")
            description = f" — {comparison['description']}" if comparison.get("description") else ""
            lines.append(
                f"| {comparison['name']}{description} | {_side_cell(comparison['baseline'])} | "
                f"{_side_cell(comparison['ours'])} | {_spread(comparison['ratio'])} | "
                f"{target['text'] if target else '—'} | {_verdict(comparison)} |"
            )
        for skipped in not_run:
            target = skipped.get("target")
            description = f" — {skipped['description']}" if skipped.get("description") else ""
            lines.append(
                f"| {skipped['name']}{description} | — | — | — | {target['text'] if target else '—'} | "
                f"not run: {skipped['reason']} |"
            )
        lines.append("")
        extras = [line for comparison in comparisons for line in _extras_lines(comparison)]
        if extras:
            lines += ["Per-round extras (median (min-max)):", ""] + [f"- {line}" for line in extras] + [""]
    figures = document.get("figures", [])
    if figures:
        lines += ["| figure | median (min-max) | unit |", "|---|---|---|"]
        for figure in figures:
            description = f" — {figure['description']}" if figure.get("description") else ""
            lines.append(f"| {figure['name']}{description} | {_spread(figure)} | {figure['unit']} |")
        lines.append("")
    for series in document.get("series", []):
        png = plots_dir / plot_name(name, series["name"])
        relative = _relative(png, markdown_dir)
        lines += [f"![{series['title']}]({relative})", ""]
        lines += _series_table(series)
    if document.get("notes"):
        lines += ["Notes:", ""] + [f"- {note}" for note in document["notes"]] + [""]
    lines.append(end_marker(name))
    return "\n".join(lines)


def _series_table(series: dict[str, Any]) -> list[str]:
    labels = list(series["lines"])
    lines = [
        f"| {series['x_label']} | " + " | ".join(labels) + " |",
        "|---|" + "---|" * len(labels),
    ]
    for index, x in enumerate(series["x"]):
        cells = " | ".join(_number(series["lines"][label][index]) for label in labels)
        lines.append(f"| {_number(x)} | {cells} |")
    return [*lines, ""]


def _relative(path: Path, start: Path) -> str:
    try:
        return path.resolve().relative_to(start.resolve()).as_posix()
    except ValueError:
        return path.resolve().as_posix()


def draw_series(document: dict[str, Any], plots_dir: Path) -> list[Path]:
    """One PNG per scaling curve of ``document``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    written = []
    plots_dir.mkdir(parents=True, exist_ok=True)
    for series in document.get("series", []):
        figure, axes = plt.subplots(figsize=(7, 4.2), dpi=100)
        for label, ys in series["lines"].items():
            axes.plot(series["x"], ys, marker="o", label=label)
        if series.get("log_x"):
            axes.set_xscale("log", base=2)
            axes.xaxis.set_major_formatter(ScalarFormatter())
            axes.set_xticks(series["x"])
        if series.get("log_y"):
            axes.set_yscale("log")
            axes.yaxis.set_major_formatter(ScalarFormatter())
            axes.yaxis.set_minor_formatter(NullFormatter())
        axes.set_xlabel(series["x_label"])
        axes.set_ylabel(series["y_label"])
        quick = " (quick run)" if document.get("quick") else ""
        axes.set_title(series["title"] + quick)
        axes.grid(True, which="both", alpha=0.3)
        axes.legend()
        figure.tight_layout()
        path = plots_dir / plot_name(document["benchmark"], series["name"])
        # No timestamp in the PNG metadata, so an unchanged curve gives an unchanged file in git.
        figure.savefig(path, metadata={"Software": None})
        plt.close(figure)
        written.append(path)
    return written


def splice(markdown: str, name: str, section: str) -> str:
    """``markdown`` with the block of ``name`` replaced by ``section``, or with ``section`` appended."""
    pattern = re.compile(re.escape(begin_marker(name)) + r".*?" + re.escape(end_marker(name)), re.DOTALL)
    if pattern.search(markdown):
        return pattern.sub(lambda _: section, markdown, count=1)
    return markdown.rstrip("\n") + "\n\n" + section + "\n"


def regenerate(
    *,
    results_dir: Path = DEFAULT_RESULTS_DIR,
    markdown_path: Path = DEFAULT_MARKDOWN,
    plots_dir: Path = DEFAULT_PLOTS_DIR,
    names: Sequence[str] | None = None,
) -> list[str]:
    """Rewrite the generated blocks of ``markdown_path`` and the PNGs; the names of the benchmarks written."""
    chosen = latest_results(load_results(results_dir))
    if names:
        chosen = {name: doc for name, doc in chosen.items() if name in names}
    markdown = markdown_path.read_text(encoding="utf-8") if markdown_path.exists() else "# Benchmarks\n"
    for name, document in sorted(chosen.items()):
        draw_series(document, plots_dir)
        markdown = splice(
            markdown, name, render_section(document, plots_dir=plots_dir, markdown_dir=markdown_path.parent)
        )
    markdown_path.write_text(markdown, encoding="utf-8")
    return sorted(chosen)
