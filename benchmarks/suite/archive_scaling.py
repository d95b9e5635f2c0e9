"""Archive scaling curves (issue 10): S3 archive throughput and PUTs per 1,000 messages by message size and queue count.

Each point is its own hot store, archived once by the real ``Dispatcher.run_once`` into a fresh
bucket of one moto server (own process); beside it, raw ``put_object`` of the same record bytes in
4 MiB objects gives the ceiling at that point. The PUT count per 1,000 messages is what S3 bills
per write and comes from the moto server's request log.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

from benchmarks.baselines import raw_s3_put, s3_client, split_objects
from benchmarks.harness import BenchmarkContext, benchmark
from benchmarks.services import MotoServer
from benchmarks.workloads import (
    archive,
    config_for,
    empty_bucket,
    fill_hot_store,
    hot_records,
    per_thousand,
    request_counts,
)
from tieredstore.config import ArchiverSettings

BODY_SIZES = (128, 1024, 8192, 65536)
QUEUE_COUNTS = (1, 16, 256, 4096)
SIZE_CURVE_QUEUES = 16
QUEUE_CURVE_BODY = 1024
MESSAGES_PER_QUEUE_AT_LEAST = 8
CONCURRENCY = ArchiverSettings().max_pending_commits


class Point:
    """One archived point of a curve: rates and requests."""

    def __init__(self, messages: int, record_bytes: int, seconds: float, puts: int, raw_seconds: float) -> None:
        self.messages = messages
        self.record_bytes = record_bytes
        self.seconds = seconds
        self.puts = puts
        self.raw_seconds = raw_seconds

    @property
    def messages_per_s(self) -> float:
        return self.messages / self.seconds

    @property
    def mb_per_s(self) -> float:
        return self.record_bytes / self.seconds / 1e6

    @property
    def raw_mb_per_s(self) -> float:
        return self.record_bytes / self.raw_seconds / 1e6

    @property
    def puts_per_1000(self) -> float:
        return per_thousand(self.puts, self.messages)


def _measure_point(
    s3: MotoServer, directory: Path, bucket_number: int, *, messages: int, queues: int, body_bytes: int
) -> Point:
    hot = fill_hot_store(directory, messages=messages, queues=queues, body_bytes=body_bytes)
    client = s3_client(s3.client_options(), max_pool_connections=CONCURRENCY)
    bucket = s3.create_bucket(f"scaling-{bucket_number}")
    config = config_for(
        hot.data_dir,
        cold_url=f"s3://{bucket}/archive",
        s3=s3,
        queues=queues,
        max_message_bytes=max(4096, 2 * body_bytes),
    )
    before = request_counts(s3)
    seconds = archive(config, with_index=True, expected=messages)
    puts = (request_counts(s3) - before).put
    raw = raw_s3_put(client, bucket, split_objects(hot_records(hot)), key_prefix="raw", concurrency=CONCURRENCY)
    empty_bucket(client, bucket)
    return Point(messages, hot.record_bytes, seconds, puts, raw.seconds)


def _curves(
    ctx: BenchmarkContext, name: str, what: str, x_label: str, x: Sequence[int], points: Sequence[Point]
) -> None:
    ctx.curve(
        f"{name}-throughput",
        title=f"Archive to S3: MB/s as {what} grows",
        x_label=x_label,
        y_label="MB/s of records",
        x=list(x),
        lines={
            "Dispatcher.run_once": [p.mb_per_s for p in points],
            "raw put_object, 4 MiB objects": [p.raw_mb_per_s for p in points],
        },
        log_x=True,
        log_y=True,
    )
    ctx.curve(
        f"{name}-messages",
        title=f"Archive to S3: messages/s as {what} grows",
        x_label=x_label,
        y_label="messages/s",
        x=list(x),
        lines={"Dispatcher.run_once": [p.messages_per_s for p in points]},
        log_x=True,
        log_y=True,
    )
    ctx.curve(
        f"{name}-puts",
        title=f"Archive to S3: PUT requests per 1,000 messages as {what} grows",
        x_label=x_label,
        y_label="PUT requests per 1,000 messages",
        x=list(x),
        lines={"Dispatcher.run_once": [p.puts_per_1000 for p in points]},
        log_x=True,
        log_y=True,
    )


@benchmark(
    "archive_scaling",
    title="Archive to S3: scaling by message size and queue count",
    issue=10,
    summary=(
        f"Archive throughput and PUT requests per 1,000 messages to a moto S3 server (own process) by the real "
        f"`Dispatcher.run_once`, as the body grows ({', '.join(map(str, BODY_SIZES))} B over {SIZE_CURVE_QUEUES} "
        f"queues) and as the queue count grows ({', '.join(map(str, QUEUE_COUNTS))} queues of "
        f"{QUEUE_CURVE_BODY} B messages); beside each point raw 4 MiB `put_object` of the same bytes."
    ),
)
def archive_scaling(ctx: BenchmarkContext) -> None:
    bytes_per_point = ctx.scale(full=32 << 20, quick=128 << 10)
    body_sizes = BODY_SIZES if not ctx.quick else (128, 8192)
    queue_counts = QUEUE_COUNTS if not ctx.quick else (1, 16)
    ctx.parameter(
        mib_per_point=bytes_per_point >> 20,
        body_sizes=list(body_sizes),
        queue_counts=list(queue_counts),
        min_messages_per_queue=MESSAGES_PER_QUEUE_AT_LEAST,
        concurrency=CONCURRENCY,
    )
    numbers = itertools.count()
    with MotoServer(ctx.work_dir / "moto") as s3:
        by_size: list[Point] = []
        for body_bytes in body_sizes:
            messages = max(SIZE_CURVE_QUEUES, bytes_per_point // body_bytes)
            number = next(numbers)
            by_size.append(
                _measure_point(
                    s3,
                    ctx.work_dir / f"point-{number}",
                    number,
                    messages=messages,
                    queues=SIZE_CURVE_QUEUES,
                    body_bytes=body_bytes,
                )
            )
        by_queues: list[Point] = []
        for queues in queue_counts:
            messages = max(bytes_per_point // QUEUE_CURVE_BODY, queues * MESSAGES_PER_QUEUE_AT_LEAST)
            number = next(numbers)
            by_queues.append(
                _measure_point(
                    s3,
                    ctx.work_dir / f"point-{number}",
                    number,
                    messages=messages,
                    queues=queues,
                    body_bytes=QUEUE_CURVE_BODY,
                )
            )
    _curves(ctx, "size", "the message body", "message body bytes", body_sizes, by_size)
    _curves(ctx, "queues", "the queue count", f"queues ({QUEUE_CURVE_BODY} B messages)", queue_counts, by_queues)
    for label, x, points in (("body", body_sizes, by_size), ("queues", queue_counts, by_queues)):
        for value, point in zip(x, points, strict=True):
            ctx.figure(
                f"{label} {value}: PUTs per 1,000 messages",
                [point.puts_per_1000],
                "PUT/1000 msg",
                description=(
                    f"{point.messages:,} messages, {point.mb_per_s:.1f} MB/s, {point.messages_per_s:,.0f} msg/s"
                ),
            )
    ctx.note(
        f"Each point archives about {bytes_per_point >> 20} MiB of bodies (at least {MESSAGES_PER_QUEUE_AT_LEAST} "
        "messages per queue) once; the points are single runs, not alternated rounds."
    )
