"""The benchmark harness itself: alternation, pair-by-pair ratios, result documents, the report and the CLI.

Figures are never asserted: the sides here return made-up measurements so that what is checked is the
harness's bookkeeping, and the quick smoke run checks only that every benchmark completes and writes a
well-formed result.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.harness import (
    Benchmark,
    BenchmarkContext,
    Contender,
    Measurement,
    Metric,
    Target,
    benchmark,
    discover,
    run_one,
    unregister,
)
from benchmarks.report import begin_marker, end_marker, regenerate

REPOSITORY = Path(__file__).resolve().parents[2]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
QUICK_SUITE_BUDGET_S = 180


@pytest.fixture
def trivial() -> Iterator[list[str]]:
    """A registered benchmark whose sides log their calls and return fixed measurements."""
    calls: list[str] = []

    def side(label: str, seconds: float) -> Contender:
        def run(directory: Path) -> Measurement:
            assert directory.is_dir()
            assert not any(directory.iterdir()), "each round must start in an empty directory"
            (directory / "scratch").write_bytes(b"x")
            calls.append(label)
            return Measurement(seconds=seconds, items=1000, bytes=1_000_000, extras={"requests": 7.0})

        return Contender(label, run)

    @benchmark("trivial_for_test", title="Trivial", issue=10, summary="A harness self-test.")
    def run(ctx: BenchmarkContext) -> None:
        ctx.parameter(items=1000)
        ctx.compare(
            "throughput pair",
            baseline=side("baseline", 2.0),
            ours=side("ours", 1.0),
            unit="msg",
            target=Target.at_least(0.5, ">= 0.5 of raw"),
        )
        ctx.compare(
            "time pair",
            baseline=side("baseline", 1.0),
            ours=side("ours", 4.0),
            unit="queue",
            metric=Metric.SECONDS,
            target=Target.at_most(2.0, "<= 2x the plain SELECT"),
        )
        ctx.figure("peak RSS", [100.0, 120.0], "MiB")
        ctx.curve(
            "size",
            title="Throughput by size",
            x_label="message bytes",
            y_label="msg/s",
            x=[128, 1024],
            lines={"ours": [10.0, 20.0], "raw": [30.0, 40.0]},
            log_x=True,
        )
        ctx.note("scaled down for the test")

    yield calls
    unregister("trivial_for_test")


def _trivial_benchmark() -> object:
    registry, _ = discover()
    return registry["trivial_for_test"]


def test_rounds_alternate_and_ratios_are_taken_pair_by_pair(trivial: list[str], tmp_path: Path) -> None:
    document = run_one(_trivial_benchmark(), quick=False, out_dir=tmp_path)  # type: ignore[arg-type]

    assert document["status"] == "ok", document["error"]
    assert trivial == ["baseline", "ours"] * 6, "3 rounds of each of the 2 comparisons, baseline first"
    throughput, seconds = document["comparisons"]
    assert throughput["baseline"]["values"] == [500.0] * 3
    assert throughput["ours"]["values"] == [1000.0] * 3
    assert throughput["ratio"]["values"] == [2.0] * 3
    assert throughput["ours"]["mb_per_s"]["median"] == 1.0
    assert throughput["ours"]["extras"]["requests"]["median"] == 7.0
    assert throughput["met"] is True
    assert seconds["ratio"]["median"] == 4.0
    assert seconds["met"] is False, "4x slower misses an at-most-2x target"


def test_a_stored_bytes_pair_ranks_the_bytes_each_side_left_and_misses_an_at_most_target(tmp_path: Path) -> None:
    def side(label: str, stored: int) -> Contender:
        return Contender(label, lambda _: Measurement(seconds=2.0, items=10, bytes=stored))

    bench = Benchmark(name="bytes_for_test", title="Bytes", issue=None, summary="", run=lambda _: None)
    ctx = BenchmarkContext(bench, quick=False, rounds=2, work_dir=tmp_path)
    smaller, larger = (
        ctx.compare(
            name,
            baseline=side("before", before),
            ours=side("after", after),
            unit="msg",
            metric=Metric.STORED_BYTES,
            target=Target.at_most(bound, f"<= {bound:.3g}"),
        )
        for name, before, after, bound in (("compressed", 900, 300, 1 / 3), ("sealed", 300, 310, 1.01))
    )

    assert smaller["baseline"]["values"] == [900.0, 900.0] and smaller["baseline"]["unit"] == "B"
    assert smaller["ratio"]["median"] == pytest.approx(1 / 3)
    assert smaller["met"] is True
    assert larger["ratio"]["median"] == pytest.approx(310 / 300)
    assert larger["met"] is False, "3% more bytes misses an at-most-1% target"


def test_result_document_is_saved_with_machine_facts_and_command(trivial: list[str], tmp_path: Path) -> None:
    document = run_one(_trivial_benchmark(), quick=True, out_dir=tmp_path)  # type: ignore[arg-type]

    saved = list(tmp_path.glob("trivial_for_test-quick-*.json"))
    assert len(saved) == 1
    loaded = json.loads(saved[0].read_text())
    assert loaded["rounds"] == 1 and loaded["quick"] is True
    assert trivial == ["baseline", "ours"] * 2
    assert loaded["command"] == "python -m benchmarks run trivial_for_test --quick"
    machine = loaded["machine"]
    assert machine["logical_cores"] >= 1 and machine["memory_bytes"] > 0
    assert machine["python"] == sys.version.split()[0]
    assert machine["packages"]["sqlalchemy"]
    assert "commit" in machine["git"]
    assert loaded["parameters"] == {"items": 1000}
    assert loaded["series"][0]["lines"]["raw"] == [30.0, 40.0]
    assert document["path"] == str(saved[0])


def test_an_overridden_round_count_is_part_of_the_recorded_command(trivial: list[str], tmp_path: Path) -> None:
    document = run_one(_trivial_benchmark(), quick=False, out_dir=tmp_path, rounds=2)  # type: ignore[arg-type]

    assert trivial == ["baseline", "ours"] * 4
    assert document["rounds"] == 2
    assert document["command"] == "python -m benchmarks run trivial_for_test --rounds 2"


def test_a_failing_benchmark_is_recorded_not_raised(tmp_path: Path) -> None:
    @benchmark("broken_for_test", title="Broken", issue=None, summary="Raises.")
    def run(ctx: BenchmarkContext) -> None:
        raise RuntimeError("the code under test is missing")

    try:
        registry, _ = discover()
        document = run_one(registry["broken_for_test"], quick=True, out_dir=tmp_path)
    finally:
        unregister("broken_for_test")

    assert document["status"] == "failed"
    assert "the code under test is missing" in document["error"]
    assert json.loads(Path(document["path"]).read_text())["status"] == "failed"


def test_report_regenerates_its_block_and_keeps_hand_written_text(trivial: list[str], tmp_path: Path) -> None:
    results = tmp_path / "results"
    run_one(_trivial_benchmark(), quick=False, out_dir=results)  # type: ignore[arg-type]
    markdown = tmp_path / "BENCHMARKS.md"
    markdown.write_text("# Benchmarks\n\nHand-written introduction.\n")
    plots = tmp_path / "plots"

    regenerate(results_dir=results, markdown_path=markdown, plots_dir=plots)
    regenerate(results_dir=results, markdown_path=markdown, plots_dir=plots)

    text = markdown.read_text()
    assert "Hand-written introduction." in text
    assert text.count(begin_marker("trivial_for_test")) == 1 and text.count(end_marker("trivial_for_test")) == 1
    assert "`python -m benchmarks run trivial_for_test`" in text
    row = next(line for line in text.splitlines() if line.startswith("| throughput pair"))
    assert ">= 0.5 of raw" in row and "**met**" in row
    time_row = next(line for line in text.splitlines() if line.startswith("| time pair"))
    assert "**missed** (2x over 2)" in time_row
    assert "scaled down for the test" in text
    png = plots / "trivial_for_test-size.png"
    assert png.read_bytes().startswith(PNG_SIGNATURE)
    assert "](plots/trivial_for_test-size.png)" in text


def test_report_prefers_a_full_run_over_a_newer_quick_one(trivial: list[str], tmp_path: Path) -> None:
    results = tmp_path / "results"
    run_one(_trivial_benchmark(), quick=False, out_dir=results)  # type: ignore[arg-type]
    run_one(_trivial_benchmark(), quick=True, out_dir=results)  # type: ignore[arg-type]
    markdown = tmp_path / "BENCHMARKS.md"

    regenerate(results_dir=results, markdown_path=markdown, plots_dir=tmp_path / "plots")

    text = markdown.read_text()
    assert "full run, 3 round(s)" in text and "quick smoke run" not in text


def test_a_comparison_not_run_is_recorded_and_reported_with_its_reason(tmp_path: Path) -> None:
    @benchmark("half_run_for_test", title="Half run", issue=None, summary="One pair runs, one cannot.")
    def run(ctx: BenchmarkContext) -> None:
        ctx.compare(
            "runs",
            baseline=Contender("base", lambda _: Measurement(seconds=1.0, items=10)),
            ours=Contender("ours", lambda _: Measurement(seconds=1.0, items=10)),
            unit="msg",
        )
        ctx.skip_comparison(
            "vs missing tool", reason="tool not installed (apt-get install tool)", target=Target.at_least(1.0, "≥ 1x")
        )

    try:
        registry, _ = discover()
        document = run_one(registry["half_run_for_test"], quick=True, out_dir=tmp_path / "results")
    finally:
        unregister("half_run_for_test")

    assert document["status"] == "ok", document["error"]
    assert [c["name"] for c in document["comparisons"]] == ["runs"]
    assert document["not_run"] == [
        {
            "name": "vs missing tool",
            "description": "",
            "reason": "tool not installed (apt-get install tool)",
            "target": {"text": "≥ 1x", "min_ratio": 1.0, "max_ratio": None},
        }
    ]
    markdown = tmp_path / "BENCHMARKS.md"
    regenerate(results_dir=tmp_path / "results", markdown_path=markdown, plots_dir=tmp_path / "plots")
    row = next(line for line in markdown.read_text().splitlines() if line.startswith("| vs missing tool"))
    assert "not run: tool not installed (apt-get install tool)" in row and "≥ 1x" in row


@pytest.mark.slow
def test_archive_s3_without_rclone_records_the_rclone_pair_as_not_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from benchmarks.suite import archive_s3

    real_which = archive_s3.shutil.which
    monkeypatch.setattr(
        archive_s3.shutil, "which", lambda name, *a, **k: None if name == "rclone" else real_which(name, *a, **k)
    )
    registry, _ = discover()

    document = run_one(registry["archive_s3"], quick=True, out_dir=tmp_path)

    assert document["status"] == "ok", document["error"]
    assert [c["name"] for c in document["comparisons"]] == ["vs raw 4 MiB PUTs", "vs naive per-message PUTs"]
    assert [(s["name"], s["reason"]) for s in document["not_run"]] == [
        ("vs rclone copy", "rclone not installed (apt-get install rclone)")
    ]
    assert document["parameters"]["rclone"] == "not installed"


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *args],
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_cli_lists_the_suite_and_refuses_an_unknown_name(tmp_path: Path) -> None:
    listed = _cli("list")
    assert listed.returncode == 0, listed.stderr
    assert "hot_store_put" in listed.stdout

    unknown = _cli("run", "no_such_benchmark", "--out", str(tmp_path))
    assert unknown.returncode == 2
    assert "unknown benchmark(s) no_such_benchmark" in unknown.stdout
    assert not list(tmp_path.iterdir())


# serial: it holds a wall-clock budget; beside another worker on a loaded 2-core machine it took 168 s of its 180.
@pytest.mark.slow
@pytest.mark.serial
def test_quick_run_of_the_whole_suite_completes_in_budget(tmp_path: Path) -> None:
    registry, failures = discover()
    assert not failures, f"suite modules that cannot be imported: {failures}"
    started = time.monotonic()

    completed = _cli("run", "--quick", "--out", str(tmp_path / "results"), timeout=QUICK_SUITE_BUDGET_S + 30)

    elapsed = time.monotonic() - started
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-4000:]
    assert elapsed < QUICK_SUITE_BUDGET_S, f"--quick took {elapsed:.0f} s; CI allows {QUICK_SUITE_BUDGET_S} s"
    documents = [json.loads(p.read_text()) for p in (tmp_path / "results").glob("*.json")]
    by_name = {d["benchmark"]: d for d in documents if d["benchmark"] in registry}
    assert set(by_name) == {name for name in registry if not name.endswith("_for_test")}
    for name, document in by_name.items():
        assert document["status"] == "ok", f"{name}: {document['error']}"
        assert document["quick"] is True
        assert document["comparisons"] or document["figures"], f"{name} recorded nothing"
        for comparison in document["comparisons"]:
            assert len(comparison["ratio"]["values"]) == comparison["rounds"] >= 1

    markdown = tmp_path / "BENCHMARKS.md"
    report = _cli(
        "report", "--results", str(tmp_path / "results"), "--markdown", str(markdown), "--plots", str(tmp_path / "p")
    )
    assert report.returncode == 0, report.stdout + report.stderr
    for name in by_name:
        assert begin_marker(name) in markdown.read_text()


def test_hot_store_put_measures_keyed_puts_beside_raw_appends_and_beside_unkeyed_puts(tmp_path: Path) -> None:
    registry, _ = discover()

    document = run_one(registry["hot_store_put"], quick=True, out_dir=tmp_path)

    assert document["status"] == "ok", document["error"]
    comparisons = {c["name"]: c for c in document["comparisons"]}
    for suffix, put in (("", "put_message"), (" batch", "put_messages x32")):
        against_raw = comparisons[f"async{suffix} keyed"]
        assert (against_raw["baseline"]["label"], against_raw["ours"]["label"]) == (
            "raw append, fsync every 0.5 s",
            f"{put} keyed, async flush",
        )
        # The raw side appends records as large as the ones the keyed puts store.
        ours = against_raw["ours"]
        stored_bytes = ours["mb_per_s"]["values"][0] * 1e6 / ours["values"][0]
        assert stored_bytes == pytest.approx(document["parameters"]["keyed_record_bytes"])
        against_unkeyed = comparisons[f"keyed vs unkeyed{suffix}"]
        assert (against_unkeyed["baseline"]["label"], against_unkeyed["ours"]["label"]) == (
            f"{put}, async flush",
            f"{put} keyed, async flush",
        )
        assert against_unkeyed["target"]["min_ratio"] == 0.8


def test_table_bytes_counts_the_tables_parquet_files_against_the_commit_logs_bytes(tmp_path: Path) -> None:
    registry, _ = discover()

    document = run_one(registry["table_bytes"], quick=True, out_dir=tmp_path)

    assert document["status"] == "ok", document["error"]
    (comparison,) = document["comparisons"]
    assert comparison["name"] == "Parquet vs commit log, unique random bodies"
    messages = document["parameters"]["messages"]
    # Random bodies do not compress: both sides must hold every body's bytes, or they counted the wrong files.
    body_bytes = messages * 1024
    commit_log, parquet = comparison["baseline"]["values"][0], comparison["ours"]["values"][0]
    # A record's header (~100 bytes here) comes on top of its 1 KiB body, and nothing else is in the commit log.
    assert body_bytes < commit_log < 1.2 * body_bytes
    assert parquet > body_bytes
    extras = comparison["ours"]["extras"]
    assert extras["data_files"]["median"] >= 1 and extras["metadata_bytes"]["median"] > 0
