"""Archiver peak RSS (issue 5): ``tieredstore run --once`` archiving about 1 GiB to S3, sampled from outside.

The archiver runs as its own process, configured by ``TIEREDSTORE_*`` environment variables only,
against a moto server in another process; PeakRss samples the archiver's process tree (the moto
server is not part of it) every 50 ms. Its own JSON summary gives the messages/s it reached.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks.harness import BenchmarkContext, benchmark
from benchmarks.rss import PeakRss
from benchmarks.services import MotoServer
from benchmarks.workloads import config_environment, config_for, fill_hot_store

QUEUES = 16
BODY_BYTES = 1024
TARGET_MIB = 256


@benchmark(
    "archiver_rss",
    title="Archiver peak RSS while archiving 1 GiB to S3",
    issue=5,
    summary=(
        f"`tieredstore -o json run --once` in its own process archives {BODY_BYTES} B messages over {QUEUES} queues "
        "(about 1 GiB of records) to a moto S3 server in another process; its process tree's peak RSS is sampled "
        "every 50 ms."
    ),
)
def archiver_rss(ctx: BenchmarkContext) -> None:
    target_bytes = ctx.scale(full=1 << 30, quick=1 << 20)
    messages = target_bytes // (BODY_BYTES + 100)
    hot = fill_hot_store(ctx.work_dir / "node", messages=messages, queues=QUEUES, body_bytes=BODY_BYTES)
    ctx.parameter(
        messages=messages,
        queues=QUEUES,
        body_bytes=BODY_BYTES,
        record_mib=round(hot.record_bytes / (1 << 20), 1),
        runs=ctx.rounds if ctx.quick else 1,
    )
    peaks: list[float] = []
    anonymous_peaks: list[float] = []
    rates: list[float] = []
    with MotoServer(ctx.work_dir / "moto") as s3:
        for run in range(1 if not ctx.quick else ctx.rounds):
            bucket = s3.create_bucket(f"rss-{run}")
            config = config_for(
                hot.data_dir,
                cold_url=f"s3://{bucket}/archive",
                s3=s3,
                metadata_url=f"sqlite:///{(ctx.work_dir / f'metadata-{run}.db').resolve()}",
                queues=QUEUES,
            )
            environment = {**os.environ, **config_environment(config)}
            command = [str(Path(sys.executable).parent / "tieredstore"), "-o", "json", "run", "--once", "--no-demo"]
            archiver = subprocess.Popen(
                command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            # Rooted at the archiver: neither this benchmark process nor the moto server is counted.
            with PeakRss(archiver.pid, exclude=s3.process_tree_pids()) as peak:
                stdout, stderr = archiver.communicate()
            if archiver.returncode != 0:
                raise RuntimeError(f"tieredstore run --once failed ({archiver.returncode}): {stderr[-3000:]}")
            summary = json.loads(stdout)
            if summary["messages"] != messages:
                raise RuntimeError(f"the archiver archived {summary['messages']} of {messages} messages")
            peaks.append(peak.mib)
            anonymous_peaks.append(peak.anonymous_mib)
            rates.append(float(summary["messages_per_second"]))
    ctx.figure(
        "peak RSS of the archiver process",
        peaks,
        "MiB",
        description=f"while archiving {hot.record_bytes / (1 << 30):.2f} GiB; target ≤ {TARGET_MIB} MiB "
        f"({'met' if max(peaks) <= TARGET_MIB else 'missed'})",
    )
    ctx.figure(
        "peak anonymous RSS of the archiver process",
        anonymous_peaks,
        "MiB",
        description="RSS less file-backed pages: the mapped hot commit log read while archiving is page cache, "
        f"not archiver memory; target ≤ {TARGET_MIB} MiB ({'met' if max(anonymous_peaks) <= TARGET_MIB else 'missed'})",
    )
    ctx.figure("archiver throughput (its own summary)", rates, "msg/s", description="messages/s over `run --once`")
    if not ctx.quick:
        ctx.note("One run at full size (it archives about 1 GiB through moto, several minutes on two cores).")
