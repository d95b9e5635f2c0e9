"""Restore from S3 (issue 7): `tieredstore restore --to-store` into an empty hot store, beside raw GETs of its bytes.

The data is archived once by the real Dispatcher (1 KiB messages over 16 queues) to a moto server
in its own process. Each "ours" round runs the CLI as its own process, configured by flags and
``TIEREDSTORE_*`` variables, restoring the whole topic into an empty hot store; its throughput is
taken from its JSON summary (the restore itself, not interpreter start-up) and its process tree's
peak RSS is sampled from outside. The baseline GETs every cold commit-log chunk object in full, one
at a time: the same record bytes, nothing written. A second baseline also appends what it GETs to a
file per queue and fsyncs each one, as a restore must before it reports done: on a disk that persists
the bytes more slowly than moto serves them, that is the floor. The restore runs with its defaults (4 queues at
once, at most 32 MiB of records read and not yet written), so its peak RSS includes that much data.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks.baselines import raw_s3_get_to_files, raw_s3_ranged_get, s3_client
from benchmarks.harness import BenchmarkContext, Contender, Measurement, Target, benchmark
from benchmarks.rss import PeakRss
from benchmarks.services import MotoServer
from benchmarks.suite.cold_read_s3 import _commit_log_objects
from benchmarks.workloads import TOPIC, archive, config_environment, config_for, fill_hot_store

QUEUES = 16
BODY_BYTES = 1024
FULL_MESSAGES = 1_000_000
RSS_TARGET_MIB = 256


@benchmark(
    "restore_s3",
    title="Restore from S3 into a fresh hot store vs raw GETs",
    issue=7,
    summary=(
        f"`tieredstore -o json restore {TOPIC} --to-store DIR` as its own process restores every archived message "
        f"({BODY_BYTES} B bodies, {QUEUES} queues, on a moto S3 server in its own process) into an empty hot store, "
        "beside one raw `get_object` per cold commit-log chunk, one at a time; peak RSS of the restore process."
    ),
)
def restore_s3(ctx: BenchmarkContext) -> None:
    messages = ctx.scale(full=FULL_MESSAGES, quick=640)
    queues = ctx.scale(full=QUEUES, quick=4)
    with MotoServer(ctx.work_dir / "moto") as s3:
        bucket = s3.create_bucket("restore")
        hot = fill_hot_store(ctx.work_dir / "node", messages=messages, queues=queues, body_bytes=BODY_BYTES)
        config = config_for(hot.data_dir, cold_url=f"s3://{bucket}/archive", s3=s3, queues=queues)
        archive(config, with_index=False, expected=messages)
        client = s3_client(s3.client_options(), max_pool_connections=1)
        objects = _commit_log_objects(client, bucket)
        environment = {**os.environ, **config_environment(config)}
        ctx.parameter(
            messages=messages,
            queues=queues,
            body_bytes=BODY_BYTES,
            record_mib=round(hot.record_bytes / (1 << 20), 1),
            commit_log_objects=len(objects),
        )
        peaks: list[float] = []
        anonymous_peaks: list[float] = []

        def ours(directory: Path) -> Measurement:
            command = [
                str(Path(sys.executable).parent / "tieredstore"),
                "--data-dir",
                str(directory / "node"),
                "--cold-url",
                config.effective_cold_url,
                "--metadata-url",
                config.effective_metadata_url,
                "-o",
                "json",
                "restore",
                TOPIC,
                "--to-store",
                str(directory / "restored"),
                "--no-progress",
            ]
            restore = subprocess.Popen(
                command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            with PeakRss(restore.pid, exclude=s3.process_tree_pids()) as peak:
                stdout, stderr = restore.communicate()
            if restore.returncode != 0:
                raise RuntimeError(f"tieredstore restore failed ({restore.returncode}): {stderr[-3000:]}")
            summary = json.loads(stdout)
            if summary["messages"] != messages:
                raise RuntimeError(f"restored {summary['messages']} messages of {messages}")
            peaks.append(peak.mib)
            anonymous_peaks.append(peak.anonymous_mib)
            return Measurement(
                seconds=float(summary["seconds"]),
                items=messages,
                bytes=int(summary["bytes"]),
                extras={"peak_rss_mib": peak.mib, "peak_anonymous_rss_mib": peak.anonymous_mib},
            )

        def raw(_: Path) -> Measurement:
            fetched = raw_s3_ranged_get(client, bucket, objects, concurrency=1, items=messages)
            return Measurement(seconds=fetched.seconds, items=messages, bytes=fetched.bytes, extras=fetched.extras)

        def raw_durable(directory: Path) -> Measurement:
            return raw_s3_get_to_files(client, bucket, objects, directory / "raw", items=messages)

        ours_contender = Contender("tieredstore restore --to-store (own process)", ours)
        ctx.compare(
            "restore",
            description=f"{messages:,} messages into an empty hot store",
            baseline=Contender("raw get_object per commit-log chunk, one at a time", raw),
            ours=ours_contender,
            unit="msg",
            target=Target.at_least(0.5, "≥ 0.5 (50% of raw GETs)"),
        )
        ctx.compare(
            "restore, vs GETs written and fsynced",
            description=(
                f"{messages:,} messages; the baseline also writes what it GETs to a file per queue and fsyncs "
                "each, as a restore must before it is done: the durability-equivalent comparison"
            ),
            baseline=Contender("raw get_object per chunk, one at a time, appended to files, fsynced", raw_durable),
            ours=ours_contender,
            unit="msg",
            target=Target.at_least(0.5, "≥ 0.5 (50% of raw GETs made durable)"),
        )
    ctx.figure(
        "peak RSS of the restore process",
        peaks,
        "MiB",
        description=f"target ≤ {RSS_TARGET_MIB} MiB ({'met' if max(peaks) <= RSS_TARGET_MIB else 'missed'})",
    )
    ctx.figure(
        "peak anonymous RSS of the restore process",
        anonymous_peaks,
        "MiB",
        description="RSS less file-backed pages (the restored hot store is memory-mapped); "
        f"target ≤ {RSS_TARGET_MIB} MiB ({'met' if max(anonymous_peaks) <= RSS_TARGET_MIB else 'missed'})",
    )
