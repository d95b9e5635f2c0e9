"""Throttled archive (issue 30): ``archiver.max_upload_bytes_per_second`` holds the archive to its cap.

For each cap a hot store holding about ``SECONDS_AT_CAP`` seconds of uploads at that cap is archived by
the real ``Dispatcher.run_once`` into a fresh POSIX cold directory, beside the same archive without a
cap (the baseline: how fast it would go). The figure that matters is achieved/cap: the bytes written to
cold storage (every commit-log, consume-queue and key-index byte, summed from the files) over the
archive's seconds, divided by the cap. The budget starts full (one second of the cap goes at once), so
over a run of N seconds achieved/cap is at most about N/(N-1) even for an exact throttle.
"""

from __future__ import annotations

import os
from pathlib import Path

from benchmarks.harness import BenchmarkContext, Contender, Measurement, benchmark
from benchmarks.workloads import HotData, archive, config_for, fill_hot_store, node_dir_over

MIB = 1 << 20
QUEUES = 16
BODY_BYTES = 1024
CAPS_MIB = (2, 8)
SECONDS_AT_CAP = 40
QUICK_BYTES = 3 * MIB
RECORD_OVERHEAD = 110  # header, topic and properties of a 1 KiB message, for sizing the workload


def cold_bytes(data_dir: Path) -> int:
    """Bytes the archive wrote: every file under the node's POSIX cold directory."""
    return sum(
        os.path.getsize(os.path.join(folder, name)) for folder, _, names in os.walk(data_dir / "cold") for name in names
    )


def _archive(hot: HotData, directory: Path, cap: int | None, ratios: list[float]) -> Measurement:
    archiver = {"max_upload_bytes_per_second": cap} if cap is not None else {}
    data_dir = node_dir_over(hot, directory)
    config = config_for(data_dir, queues=hot.queues, archiver=archiver)
    seconds = archive(config, with_index=True, expected=hot.messages)
    uploaded = cold_bytes(data_dir)
    if cap is not None:
        ratios.append(uploaded / seconds / cap)
    return Measurement(seconds=seconds, items=hot.messages, bytes=uploaded)


@benchmark(
    "archive_throttle",
    title="Throttled archive vs its cap",
    issue=30,
    summary=(
        f"{BODY_BYTES} B messages over {QUEUES} queues archived to POSIX by the real `Dispatcher.run_once` with "
        f"`archiver.max_upload_bytes_per_second` at {' and '.join(str(c) for c in CAPS_MIB)} MiB/s, each beside the "
        f"same archive uncapped; the hot store holds about {SECONDS_AT_CAP} s of uploads at the cap. The figure "
        "achieved/cap is the bytes written to cold storage per second over the cap (target: within 5%)."
    ),
)
def archive_throttle(ctx: BenchmarkContext) -> None:
    ctx.parameter(
        queues=QUEUES,
        body_bytes=BODY_BYTES,
        caps_mib_per_s=list(CAPS_MIB),
        seconds_at_cap=0 if ctx.quick else SECONDS_AT_CAP,
        cold_tier="POSIX (local directory, same file system)",
        metadata="SQLite",
    )
    for cap_mib in CAPS_MIB:
        cap = cap_mib * MIB
        target_bytes = ctx.scale(full=cap * SECONDS_AT_CAP, quick=QUICK_BYTES)
        messages = target_bytes // (BODY_BYTES + RECORD_OVERHEAD)
        hot = fill_hot_store(
            ctx.work_dir / f"source-{cap_mib}", messages=messages, queues=QUEUES, body_bytes=BODY_BYTES
        )
        ratios: list[float] = []
        ctx.compare(
            f"archive capped at {cap_mib} MiB/s",
            description=f"{messages:,} messages ({hot.record_bytes / MIB:.0f} MiB of records), {QUEUES} queues",
            baseline=Contender("Dispatcher.run_once, no cap", lambda d, hot=hot: _archive(hot, d, None, [])),  # type: ignore[misc]
            ours=Contender(
                f"Dispatcher.run_once, max_upload_bytes_per_second = {cap_mib} MiB/s",
                lambda d, hot=hot, cap=cap, ratios=ratios: _archive(hot, d, cap, ratios),  # type: ignore[misc]
            ),
            unit="msg",
        )
        ctx.figure(
            f"achieved/cap at {cap_mib} MiB/s",
            ratios,
            "ratio",
            description="bytes written to cold storage a second by the capped archive, over the cap (target 0.95-1.05)",
        )
