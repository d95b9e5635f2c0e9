"""Archive to S3 (issue 5): the real Dispatcher against a moto server in its own process, beside three baselines.

The same filled hot store (1 KiB messages over 16 queues) is archived in every round into a fresh
bucket, beside:

- raw ``put_object`` of the hot commit log's bytes in 4 MiB objects with as many threads as the
  archiver's ``max_pending_commits`` (the floor any S3 archiver stands on; target ≥ 0.8);
- a naive archiver that PUTs one object per message at the same concurrency (target: ours ≥ 20x);
  it runs on the first messages only, and its rate stands for the whole set;
- ``rclone copy`` of the hot directory (Debian's rclone, same transfer count; target ≥ 1x); on a machine
  without rclone this pair is recorded as not run and the others still are.

Requests are counted from the moto server's request log, per side and round. Buckets are emptied
after each side so the server's memory stays flat across rounds.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.baselines import raw_s3_put, s3_client, split_objects, tree_bytes
from benchmarks.harness import BenchmarkContext, Contender, Measurement, Target, benchmark, stopwatch
from benchmarks.services import S3_CREDENTIALS, S3_REGION, MotoServer
from benchmarks.workloads import (
    HotData,
    archive,
    config_for,
    empty_bucket,
    fill_hot_store,
    hot_records,
    node_dir_over,
    per_thousand,
    request_counts,
    split_records,
)
from tieredstore.config import ArchiverSettings

QUEUES = 16
BODY_BYTES = 1024
FULL_MESSAGES = 1_000_000
NAIVE_MESSAGES = 4_000
CONCURRENCY = ArchiverSettings().max_pending_commits
RCLONE_REMOTE = "bench"
RCLONE_MISSING = "rclone not installed (apt-get install rclone)"
RCLONE_TARGET = Target.at_least(1.0, "≥ 1x")


def rclone_environment(s3: MotoServer) -> dict[str, str]:
    """rclone configured entirely by environment variables: an S3 remote ``bench`` on the moto endpoint."""
    prefix = f"RCLONE_CONFIG_{RCLONE_REMOTE.upper()}_"
    # rclone's S3 backend reads AWS_* variables too; a CA bundle meant for real AWS breaks its plain-HTTP client.
    inherited = {name: value for name, value in os.environ.items() if not name.startswith("AWS_")}
    return {
        **inherited,
        f"{prefix}TYPE": "s3",
        f"{prefix}PROVIDER": "Other",
        f"{prefix}ENDPOINT": s3.endpoint_url,
        f"{prefix}REGION": S3_REGION,
        f"{prefix}ACCESS_KEY_ID": S3_CREDENTIALS["aws_access_key_id"],
        f"{prefix}SECRET_ACCESS_KEY": S3_CREDENTIALS["aws_secret_access_key"],
        f"{prefix}FORCE_PATH_STYLE": "true",
    }


def rclone_binary() -> str | None:
    """rclone's path, or None on a machine without it (the rclone pair is then recorded as not run)."""
    return shutil.which("rclone")


class S3Sides:
    """The sides of the comparisons, sharing one moto server, one hot store and a fresh bucket per run."""

    def __init__(self, s3: MotoServer, hot: HotData) -> None:
        self.s3 = s3
        self.hot = hot
        self.client = s3_client(s3.client_options(), max_pool_connections=CONCURRENCY)
        self._bucket_numbers = itertools.count()
        self.records = hot_records(hot)
        self.naive_records = split_records(self.records, NAIVE_MESSAGES)

    def _measured(self, run: Callable[[str], tuple[float, int, int]]) -> Measurement:
        """Run ``run(bucket)`` (-> seconds, messages, bytes) in a fresh bucket, counting its requests."""
        bucket = self.s3.create_bucket(f"bench-{next(self._bucket_numbers)}")
        before = request_counts(self.s3)
        seconds, messages, moved = run(bucket)
        counts = request_counts(self.s3) - before
        empty_bucket(self.client, bucket)
        return Measurement(
            seconds=seconds,
            items=messages,
            bytes=moved,
            extras={
                "put_requests": float(counts.put),
                "put_requests_per_1000_messages": per_thousand(counts.put, messages),
                "other_requests": float(counts.get + counts.list + counts.head),
            },
        )

    def ours(self, directory: Path) -> Measurement:
        def run(bucket: str) -> tuple[float, int, int]:
            config = config_for(
                node_dir_over(self.hot, directory),
                cold_url=f"s3://{bucket}/archive",
                s3=self.s3,
                queues=self.hot.queues,
            )
            seconds = archive(config, with_index=True, expected=self.hot.messages)
            return seconds, self.hot.messages, self.hot.record_bytes

        return self._measured(run)

    def raw_put(self, _: Path) -> Measurement:
        def run(bucket: str) -> tuple[float, int, int]:
            objects = split_objects(self.records)
            put = raw_s3_put(self.client, bucket, objects, key_prefix="raw", concurrency=CONCURRENCY)
            return put.seconds, self.hot.messages, self.hot.record_bytes

        return self._measured(run)

    def naive(self, _: Path) -> Measurement:
        records: Sequence[bytes] = self.naive_records

        def run(bucket: str) -> tuple[float, int, int]:
            def put(number: int) -> None:
                key = f"naive/{number % self.hot.queues}/{number // self.hot.queues:020d}"
                self.client.put_object(Bucket=bucket, Key=key, Body=records[number])

            with stopwatch() as elapsed, ThreadPoolExecutor(max_workers=CONCURRENCY) as pool:
                for future in [pool.submit(put, n) for n in range(len(records))]:
                    future.result()
            return elapsed(), len(records), sum(len(r) for r in records)

        return self._measured(run)

    def rclone(self, _: Path) -> Measurement:
        binary = rclone_binary()
        if binary is None:
            raise RuntimeError(RCLONE_MISSING)
        environment = rclone_environment(self.s3)

        def run(bucket: str) -> tuple[float, int, int]:
            command = [
                binary,
                "copy",
                str(self.hot.hot_dir),
                f"{RCLONE_REMOTE}:{bucket}/rclone",
                "--transfers",
                str(CONCURRENCY),
                "--s3-no-check-bucket",
                "--config",
                os.devnull,
            ]
            with stopwatch() as elapsed:
                completed = subprocess.run(command, env=environment, capture_output=True, text=True, check=False)
            if completed.returncode != 0:
                raise RuntimeError(f"rclone copy failed ({completed.returncode}): {completed.stderr[-2000:]}")
            return elapsed(), self.hot.messages, tree_bytes([self.hot.hot_dir])

        return self._measured(run)


@benchmark(
    "archive_s3",
    title="Archive to S3 vs raw PUTs, naive per-message PUTs and rclone",
    issue=5,
    summary=(
        f"{BODY_BYTES} B messages over {QUEUES} queues archived by the real `Dispatcher.run_once` (with the key "
        f"index, SQLite metadata) to a moto S3 server in its own process, beside raw `put_object` of the same "
        f"bytes in 4 MiB objects ({CONCURRENCY} threads = `max_pending_commits`), a naive archiver putting one "
        f"object per message ({CONCURRENCY} threads), and `rclone copy` of the hot directory "
        f"(`--transfers {CONCURRENCY}`)."
    ),
)
def archive_s3(ctx: BenchmarkContext) -> None:
    messages = ctx.scale(full=FULL_MESSAGES, quick=800)
    queues = ctx.scale(full=QUEUES, quick=4)
    naive_messages = min(messages, ctx.scale(full=NAIVE_MESSAGES, quick=64))
    hot = fill_hot_store(ctx.work_dir / "source", messages=messages, queues=queues, body_bytes=BODY_BYTES)
    rclone = rclone_binary()
    rclone_version = "not installed"
    if rclone is not None:
        version = subprocess.run([rclone, "version"], capture_output=True, text=True, check=True)
        rclone_version = version.stdout.splitlines()[0] if version.stdout else "unknown"
    ctx.parameter(
        messages=messages,
        queues=queues,
        body_bytes=BODY_BYTES,
        record_mib=round(hot.record_bytes / (1 << 20), 1),
        concurrency=CONCURRENCY,
        naive_messages=naive_messages,
        rclone=rclone_version,
    )
    with MotoServer(ctx.work_dir) as s3:
        sides = S3Sides(s3, hot)
        sides.naive_records = sides.naive_records[:naive_messages]
        ours = Contender("Dispatcher.run_once", sides.ours)
        ctx.compare(
            "vs raw 4 MiB PUTs",
            description=f"{messages:,} messages, {CONCURRENCY} concurrent PUTs",
            baseline=Contender(f"put_object of 4 MiB objects, {CONCURRENCY} threads", sides.raw_put),
            ours=ours,
            unit="msg",
            target=Target.at_least(0.8, "≥ 0.8 (80% of raw PUTs)"),
        )
        ctx.compare(
            "vs naive per-message PUTs",
            description=f"naive side on the first {naive_messages:,} messages, its rate extrapolated",
            baseline=Contender(f"one put_object per message, {CONCURRENCY} threads", sides.naive),
            ours=ours,
            unit="msg",
            target=Target.at_least(20.0, "≥ 20x"),
        )
        rclone_description = f"rclone copy of the hot directory, --transfers {CONCURRENCY}"
        if rclone is None:
            ctx.skip_comparison(
                "vs rclone copy", reason=RCLONE_MISSING, target=RCLONE_TARGET, description=rclone_description
            )
        else:
            ctx.compare(
                "vs rclone copy",
                description=rclone_description,
                baseline=Contender("rclone copy", sides.rclone),
                ours=ours,
                unit="msg",
                target=RCLONE_TARGET,
            )
    ctx.note(
        f"The naive per-message archiver runs on the first {naive_messages:,} messages only (one PUT each); its "
        "messages/s stands for the whole set."
    )
    ctx.note(
        "rclone uploads the hot files whole: the commit log in 64 MiB files (the last one partly unused) and the "
        "consume queues, so it moves somewhat more bytes than the records; its MB/s counts what it uploaded."
    )
    if not ctx.quick:
        ctx.note(
            f"At the issue's {messages:,} messages: the archiver's fixed costs (opening {queues} cold queues, the last "
            "commits finishing with fewer PUTs in flight) weigh on a run of a second; peak RSS while archiving 1 GiB "
            "is `archiver_rss`."
        )
