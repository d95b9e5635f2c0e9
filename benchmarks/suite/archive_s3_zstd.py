"""Archive to S3 with zstd (issue 33), beside the same archive without compression, on the same messages.

Three hot stores, each archived every round by the real Dispatcher into a fresh bucket of one moto server
(its own process), once uncompressed and once with ``[cold] compression = "zstd"`` at the default level:

- ``archive_s3``'s messages: 1 KiB random bodies over 16 queues, 16 distinct bodies in turn, so zstd
  finds each body again within a commit and shrinks the commit log about a hundredfold;
- the same shape with every body new random bytes, which zstd cannot shrink (its whole cost, none of
  its saving);
- the demo's JSON messages (``tieredstore run --demo``'s producer), which it shrinks to a few percent.

Besides messages/s, each side reports this process's CPU seconds per million messages over ``run_once``
(every thread: zstd runs in worker threads), the moto server's, the PUT requests and the bytes stored.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import psutil

from benchmarks.baselines import s3_client
from benchmarks.cold_codecs import (
    codec_label,
    codec_sections,
    fill_demo_hot_store,
    stored_in_bucket,
)
from benchmarks.harness import BenchmarkContext, Contender, Measurement, Target, benchmark
from benchmarks.services import MotoServer
from benchmarks.workloads import (
    HotData,
    archive_run,
    config_for,
    empty_bucket,
    fill_hot_store,
    node_dir_over,
    request_counts,
)
from tieredstore.config import ArchiverSettings

QUEUES = 16
BODY_BYTES = 1024
FULL_MESSAGES = 250_000
TARGET = Target.at_least(0.8, "≥ 0.8 of uncompressed")
MILLION = 1e6


def _cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


class CodecSides:
    """Archives of one hot store into fresh buckets of one moto server, with a given codec or none."""

    def __init__(self, s3: MotoServer, hot: HotData) -> None:
        self.s3 = s3
        self.hot = hot
        self.client = s3_client(s3.client_options())
        self.server = psutil.Process(s3.pid)
        self._buckets = itertools.count()

    def side(self, *, compression: bool) -> Contender:
        return Contender(codec_label(compression=compression, encrypt=False), self._run(compression))

    def _run(self, compression: bool) -> Callable[[Path], Measurement]:
        def run(directory: Path) -> Measurement:
            bucket = self.s3.create_bucket(f"zstd-{next(self._buckets)}")
            config = config_for(
                node_dir_over(self.hot, directory),
                cold_url=f"s3://{bucket}/archive",
                s3=self.s3,
                queues=self.hot.queues,
                codecs=codec_sections(directory, compression=compression, encrypt=False),
            )
            requests_before, server_before = request_counts(self.s3), _cpu_seconds(self.server)
            archived = archive_run(config, with_index=True, expected=self.hot.messages)
            server_cpu = _cpu_seconds(self.server) - server_before
            puts = (request_counts(self.s3) - requests_before).put
            stored = stored_in_bucket(self.client, bucket)
            empty_bucket(self.client, bucket)
            per_million = MILLION / self.hot.messages
            return Measurement(
                seconds=archived.seconds,
                items=self.hot.messages,
                bytes=self.hot.record_bytes,
                extras={
                    "cpu_s_per_million_messages": archived.cpu_seconds * per_million,
                    "moto_cpu_s_per_million_messages": server_cpu * per_million,
                    "put_requests": float(puts),
                    "stored_bytes": float(stored.total),
                },
            )

        return run


@benchmark(
    "archive_s3_zstd",
    title="Archive to S3 with zstd vs the same archive uncompressed",
    issue=33,
    summary=(
        "The real `Dispatcher.run_once` (key index on, SQLite metadata) archiving one hot store to a moto S3 server "
        'in its own process with `[cold] compression = "zstd"` (default level), beside the same archive without '
        f"compression, on `archive_s3`'s {BODY_BYTES} B random bodies over {QUEUES} queues (a few distinct bodies in "
        "turn), on the same with every body unique (incompressible) and on the demo's JSON messages; CPU is this "
        "process's (every thread) over `run_once`, per million messages."
    ),
)
def archive_s3_zstd(ctx: BenchmarkContext) -> None:
    _measure(ctx)
    ctx.note(
        "Messages/s and MB/s count the logical records archived; `stored_bytes` is what the bucket held after "
        "the side (commit log, consume queues, key index, descriptors). The moto server's CPU is on the same two "
        "cores, so what zstd saves it in bytes received shows in both sides' wall time."
    )


def _measure(ctx: BenchmarkContext) -> None:
    messages = ctx.scale(full=FULL_MESSAGES, quick=800)
    queues = ctx.scale(full=QUEUES, quick=4)
    repeating = fill_hot_store(ctx.work_dir / "repeating", messages=messages, queues=queues, body_bytes=BODY_BYTES)
    unique = fill_hot_store(
        ctx.work_dir / "unique", messages=messages, queues=queues, body_bytes=BODY_BYTES, unique_bodies=True
    )
    demo = fill_demo_hot_store(ctx.work_dir / "demo", messages=messages)
    workloads = (
        ("archive_s3's messages", repeating, f"{queues} queues, {min(queues, 64)} distinct random bodies in turn"),
        ("unique random bodies", unique, f"{queues} queues, every body new random bytes: incompressible"),
        ("demo JSON messages", demo, f"the demo's messages, {demo.queues} queues over two topics"),
    )
    ctx.parameter(
        messages=messages,
        queues=queues,
        body_bytes=BODY_BYTES,
        record_mib={name: round(hot.record_bytes / (1 << 20), 1) for name, hot, _ in workloads},
        max_pending_commits=ArchiverSettings().max_pending_commits,
    )
    with MotoServer(ctx.work_dir / "moto") as s3:
        for name, hot, description in workloads:
            sides = CodecSides(s3, hot)
            ctx.compare(
                f"zstd vs uncompressed, {name}",
                description=f"{messages:,} messages: {description}",
                baseline=sides.side(compression=False),
                ours=sides.side(compression=True),
                unit="msg",
                target=TARGET,
            )
