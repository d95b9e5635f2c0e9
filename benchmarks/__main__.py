"""Command line of the benchmark suite: ``python -m benchmarks run|list|report``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from benchmarks.harness import DEFAULT_RESULTS_DIR, discover, run_one
from benchmarks.report import DEFAULT_MARKDOWN, DEFAULT_PLOTS_DIR, regenerate
from tieredstore.logs import configure_logging

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
console = Console()


def _ratio_text(comparison: dict[str, Any]) -> str:
    ratio = comparison["ratio"]
    verdict = {True: "met", False: "MISSED", None: "no target"}[comparison["met"]]
    target = comparison["target"]["text"] if comparison["target"] else ""
    return f"{ratio['median']:.3g} ({ratio['min']:.3g}-{ratio['max']:.3g}) {target} {verdict}"


def _print_result(document: dict[str, Any]) -> None:
    table = Table(title=f"{document['benchmark']}: {document['title']} [{document['status']}]", show_lines=False)
    for column in ("comparison", "baseline (median)", "ours (median)", "ours/baseline"):
        table.add_column(column)
    for comparison in document["comparisons"]:
        base, ours = comparison["baseline"], comparison["ours"]
        table.add_row(
            comparison["name"],
            f"{base['median']:.4g} {base['unit']}",
            f"{ours['median']:.4g} {ours['unit']}",
            _ratio_text(comparison),
        )
    for skipped in document.get("not_run", []):
        table.add_row(skipped["name"], "", "", f"not run: {skipped['reason']}")
    for figure in document["figures"]:
        table.add_row(figure["name"], "", f"{figure['median']:.4g} {figure['unit']}", "")
    console.print(table)
    if document["error"]:
        console.print(document["error"], style="red", markup=False, highlight=False)
    console.print(f"result: {document['path']}")


@app.command("list")
def list_benchmarks() -> None:
    """List the registered benchmarks (and suite modules that cannot be imported yet)."""
    registry, failures = discover()
    for name, bench in sorted(registry.items()):
        issue = f"issue {bench.issue}" if bench.issue is not None else ""
        console.print(f"[bold]{name}[/bold]  {bench.title}  [dim]{issue}[/dim]")
    for module, reason in sorted(failures.items()):
        console.print(f"[red]{module}[/red]  cannot be imported: {reason}", markup=True)


@app.command("run")
def run(
    names: Annotated[list[str] | None, typer.Argument(help="benchmarks to run; all when none is named")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="small data, one round: checks the harness works")] = False,
    out: Annotated[Path, typer.Option("--out", help="directory for the JSON results")] = DEFAULT_RESULTS_DIR,
    rounds: Annotated[int | None, typer.Option("--rounds", min=1, help="override the round count")] = None,
    log_level: Annotated[str, typer.Option("--log-level", help="tieredstore's log level while measuring")] = "WARNING",
) -> None:
    """Run benchmarks, each with its baseline alternating round by round; write one JSON result each."""
    # Info lines per store opened would interleave with the figures and cost time inside measured loops.
    configure_logging(log_level)
    registry, failures = discover()
    wanted = names or sorted(registry)
    unknown = [name for name in wanted if name not in registry]
    if unknown:
        known = ", ".join(sorted(registry)) or "none"
        broken = "".join(f"\n  {module}: {reason}" for module, reason in sorted(failures.items()))
        console.print(f"unknown benchmark(s) {', '.join(unknown)}; registered: {known}{broken}", markup=False)
        raise typer.Exit(2)
    failed = 0
    for name in wanted:
        console.rule(name)
        document = run_one(registry[name], quick=quick, out_dir=out, rounds=rounds)
        _print_result(document)
        failed += document["status"] != "ok"
    for module, reason in sorted(failures.items()):
        console.print(f"suite module {module} cannot be imported: {reason}", style="red", markup=False)
    if failed or (failures and not names):
        raise typer.Exit(1)


@app.command("report")
def report(
    results: Annotated[Path, typer.Option("--results", help="directory of JSON results")] = DEFAULT_RESULTS_DIR,
    markdown: Annotated[Path, typer.Option("--markdown", help="the page to update")] = DEFAULT_MARKDOWN,
    plots: Annotated[Path, typer.Option("--plots", help="directory for the PNG curves")] = DEFAULT_PLOTS_DIR,
    names: Annotated[list[str] | None, typer.Argument(help="only these benchmarks")] = None,
) -> None:
    """Regenerate the BENCHMARKS.md tables and PNG curves from the newest saved results."""
    written = regenerate(results_dir=results, markdown_path=markdown, plots_dir=plots, names=names)
    if not written:
        console.print(f"no results found in {results}", markup=False)
        raise typer.Exit(1)
    console.print(f"updated {markdown} for: {', '.join(written)}", markup=False)


if __name__ == "__main__":
    sys.exit(app())
