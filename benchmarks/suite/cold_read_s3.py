"""Sequential cold read from S3 (issue 6): get_messages in batches of 32 under FORCE, beside raw GETs of the same bytes.

The data is archived once by the real Dispatcher (1 KiB messages over 16 queues) to a moto server
in its own process. Each "ours" round opens a fresh ``AsyncTieredMessageStore`` (cold side only, so
its read-ahead cache starts empty) and reads every queue from its first offset to its end, one queue
after another, 32 messages per call, as a consumer catching up would. The baseline GETs every cold
commit-log chunk object in full, one at a time in the same order: the same record bytes, one
request each, nothing decoded or checked.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.baselines import RangedGet, raw_s3_ranged_get, s3_client
from benchmarks.harness import BenchmarkContext, Contender, Measurement, Target, benchmark, stopwatch
from benchmarks.services import MotoServer
from benchmarks.workloads import TOPIC, archive, config_for, fill_hot_store, per_thousand, request_counts
from tieredstore.config import ReadPolicy, TieredStoreConfig
from tieredstore.fetcher import GetMessageStatus
from tieredstore.store import AsyncTieredMessageStore

QUEUES = 16
BODY_BYTES = 1024
BATCH = 32
FULL_MESSAGES = 160_000


async def read_queues(config: TieredStoreConfig, queues: Sequence[tuple[str, int]]) -> tuple[float, float, int, int]:
    """Read every (topic, queue) sequentially from cold storage; (seconds, CPU seconds of this process, messages,
    bytes)."""
    async with AsyncTieredMessageStore.open(config, hot=False, read_policy=ReadPolicy.FORCE) as store:
        messages = received = 0
        cpu_before = time.process_time()
        with stopwatch() as elapsed:
            for topic, queue_id in queues:
                offset = await store.get_min_offset(topic, queue_id)
                while True:
                    result = await store.get_messages(topic, queue_id, offset, BATCH)
                    if result.status is not GetMessageStatus.FOUND:
                        break
                    messages += len(result.messages)
                    received += sum(len(m.raw) for m in result.messages)
                    offset = result.next_begin_offset
        return elapsed(), time.process_time() - cpu_before, messages, received


def measured_read(
    s3: MotoServer,
    config: TieredStoreConfig,
    queues: Sequence[tuple[str, int]],
    *,
    expected: int,
    moved: int | None = None,
) -> Measurement:
    """One round of :func:`read_queues` with its S3 requests; ``bytes`` is what it returned unless ``moved``
    (stored bytes fetched) is given, which then also records the returned bytes as an extra."""
    before = request_counts(s3)
    seconds, cpu_seconds, read, received = asyncio.run(read_queues(config, queues))
    counts = request_counts(s3) - before
    if read != expected:
        raise RuntimeError(f"read {read} messages of {expected}")
    extras = {
        "get_requests": float(counts.get),
        "get_requests_per_4096_messages": per_thousand(counts.get, read) * 4.096,
        "list_requests": float(counts.list),
        # Our own CPU per message: what the read path costs apart from waiting on the server.
        "cpu_us_per_message": cpu_seconds / read * 1e6,
    }
    if moved is not None:
        extras["logical_bytes_read"] = float(received)
    return Measurement(seconds=seconds, items=read, bytes=received if moved is None else moved, extras=extras)


def _commit_log_objects(client: Any, bucket: str) -> list[RangedGet]:
    """Every cold commit-log chunk object, in key order (queue by queue, chunk by chunk)."""
    ranges = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for item in page.get("Contents", []):
            if "/COMMIT_LOG/" in item["Key"]:
                ranges.append(RangedGet(item["Key"], 0, int(item["Size"])))
    return sorted(ranges, key=lambda r: r.key)


@benchmark(
    "cold_read_s3",
    title="Sequential cold read from S3 vs raw GETs",
    issue=6,
    summary=(
        f"Every archived message ({BODY_BYTES} B bodies, {QUEUES} queues, archived by the Dispatcher to a moto S3 "
        f"server in its own process) read back queue by queue with `get_messages(..., {BATCH})` under "
        "`ReadPolicy.FORCE` from a fresh store, beside one raw `get_object` per cold commit-log chunk, one at a "
        "time, of the same bytes."
    ),
)
def cold_read_s3(ctx: BenchmarkContext) -> None:
    messages = ctx.scale(full=FULL_MESSAGES, quick=640)
    queues = ctx.scale(full=QUEUES, quick=4)
    with MotoServer(ctx.work_dir / "moto") as s3:
        bucket = s3.create_bucket("cold-read")
        hot = fill_hot_store(ctx.work_dir / "node", messages=messages, queues=queues, body_bytes=BODY_BYTES)
        config = config_for(hot.data_dir, cold_url=f"s3://{bucket}/archive", s3=s3, queues=queues)
        archive(config, with_index=False, expected=messages)
        client = s3_client(s3.client_options(), max_pool_connections=1)
        objects = _commit_log_objects(client, bucket)
        ctx.parameter(
            messages=messages,
            queues=queues,
            body_bytes=BODY_BYTES,
            batch=BATCH,
            record_mib=round(hot.record_bytes / (1 << 20), 1),
            commit_log_objects=len(objects),
            read_ahead_count=config.read.read_ahead_count,
            read_ahead_mib=config.read.read_ahead_size >> 20,
        )

        def ours(_: Path) -> Measurement:
            return measured_read(s3, config, [(TOPIC, queue_id) for queue_id in range(queues)], expected=messages)

        def raw(_: Path) -> Measurement:
            fetched = raw_s3_ranged_get(client, bucket, objects, concurrency=1, items=messages)
            return Measurement(seconds=fetched.seconds, items=messages, bytes=fetched.bytes, extras=fetched.extras)

        ctx.compare(
            "sequential read",
            description=f"{messages:,} messages, one queue after another, batches of {BATCH}",
            baseline=Contender("raw get_object per commit-log chunk, one at a time", raw),
            ours=Contender(f"get_messages x{BATCH}, FORCE, fresh store", ours),
            unit="msg",
            target=Target.at_least(0.6, "≥ 0.6 (60% of raw GETs)"),
        )
    ctx.note(
        "Ours' GET and LIST counts include opening the store (a LIST per cold segment when it is first read); "
        "the requests are counted from the moto server's log. Ours reads up to two windows of a queue ahead of "
        "its reader, each window's GET sent as soon as the one before it has been split, so only each queue's "
        "first GET is waited for with nothing else to do, and each window leaves the cache once read through "
        "(`read_ahead_readers` = 1, the default), so later windows land in memory freed by earlier ones; the "
        "store is opened (its S3 client built) before the clock starts, as the baseline's client is made "
        "before its own; cpu_us_per_message is the reading "
        "process's own CPU (the moto server's is not in it)."
    )
