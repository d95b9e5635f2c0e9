"""Shared parts of the archiver-level reliability scenarios: scale, configs, a producer, readers, figures.

The issue's figures (200,000 messages, 100 kills, a 30 s outage) are goals; by default the scenarios
run scaled down so that the whole set stays within a few minutes on the 2-core CI machine.
``TIEREDSTORE_RELIABILITY_SCALE=full`` runs them at the issue's size.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.fixtures.s3 import S3Server
from tieredstore.config import ReadPolicy, TieredStoreConfig
from tieredstore.errors import CorruptRecordError, TieredStoreError
from tieredstore.flat import check_queue_invariant
from tieredstore.local import LocalMessageStore, PutRequest
from tieredstore.runtime import Runtime, open_runtime
from tieredstore.store import AsyncTieredMessageStore

SCALE_ENV = "TIEREDSTORE_RELIABILITY_SCALE"
FULL_SCALE = os.environ.get(SCALE_ENV, "").lower() == "full"

TOPICS = (("FaultOrders", 6), ("FaultPayments", 4))
QUEUES = [(topic, queue_id) for topic, count in TOPICS for queue_id in range(count)]


def s3_config(data_dir: Path, bucket_url: str, s3: S3Server, endpoint_url: str, **archiver: Any) -> TieredStoreConfig:
    """An archiver node on S3 reached through ``endpoint_url`` (the fault proxy), small batches and segments."""
    return TieredStoreConfig(
        data_dir=data_dir,
        cold_url=bucket_url,
        s3={
            "endpoint_url": endpoint_url,
            "region": s3.region,
            "access_key_id": s3.access_key_id,
            "secret_access_key": s3.secret_access_key,
            # Two attempts only: some commits fail past the provider and the dispatcher's retry runs too.
            "max_attempts": 2,
        },
        hot={"commit_log_file_size": 64 << 20, "consume_queue_units_per_file": 20_000},
        # Small read-ahead: readers go to S3 (through the faults) often instead of serving from the cache.
        read={"read_ahead_count": 64},
        # Small segments: commits roll commit-log and consume-queue segments many times.
        segments={"commit_log_max_size": 2 << 20, "consume_queue_max_size": 20 * 5000},
        archiver={
            "group_commit_count": 256,
            "group_commit_timeout": 0,
            "scan_interval": 0.05,
            "max_pending_commits": 8,
            "retry_initial_backoff": 0.1,
            "retry_max_backoff": 2.0,
            **archiver,
        },
    )


def message_body(rng: random.Random, n: int) -> bytes:
    return f"message {n} ".encode() + rng.randbytes(rng.randint(40, 700))


async def produce(hot: LocalMessageStore, total: int, rate: float, seed: int, stop: asyncio.Event | None = None) -> int:
    """Put ``total`` messages (batches of 50, about ``rate`` a second) over QUEUES; returns how many were put."""
    rng = random.Random(seed)
    started = time.monotonic()
    produced = 0
    while produced < total and not (stop is not None and stop.is_set()):
        batch = [
            PutRequest(*rng.choice(QUEUES), message_body(rng, n), keys=(f"key-{n}",), tags=f"t{n % 4}")
            for n in range(produced, min(total, produced + 50))
        ]
        await asyncio.to_thread(hot.put_messages, batch)
        produced += len(batch)
        ahead = produced / rate - (time.monotonic() - started)
        if ahead > 0:
            await asyncio.sleep(ahead)
    return produced


def lag(runtime: Runtime) -> int:
    """Hot messages not yet archived, over every hot queue."""
    hot = runtime.hot
    assert hot is not None
    behind = 0
    for topic, queue_id in hot.queues():
        try:
            archived = runtime.flat.get(topic, queue_id).archived_offset
        except TieredStoreError:
            archived = 0
        behind += hot.max_offset(topic, queue_id) - archived
    return behind


async def wait_caught_up(runtime: Runtime, within: float) -> float:
    """Seconds until every hot message is archived; AssertionError naming the lag after ``within`` seconds."""
    started = time.monotonic()
    while (behind := lag(runtime)) > 0:
        if time.monotonic() - started > within:
            raise AssertionError(f"{behind} messages still not archived after {within}s: a queue is stuck")
        await asyncio.sleep(0.1)
    return time.monotonic() - started


async def wait_for(condition: Callable[[], bool], within: float, what: str) -> None:
    """Return once ``condition()`` holds; AssertionError saying ``what`` did not happen after ``within`` seconds."""
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {within}s")
        await asyncio.sleep(0.05)


async def invariant_problems(runtime: Runtime) -> tuple[int, list[str]]:
    """(archived messages, problems) of every hot queue against its hot copy."""
    hot = runtime.hot
    assert hot is not None
    archived = 0
    problems: list[str] = []
    for topic, queue_id in hot.queues():
        flat_file = runtime.flat.get(topic, queue_id)
        hot_max = hot.max_offset(topic, queue_id)
        reference = {m.queue_offset: m.raw for m in hot.read_messages(topic, queue_id, 0, hot_max, 1 << 40)}
        archived += flat_file.archived_offset
        problems += [str(p) for p in await check_queue_invariant(flat_file, reference=reference)]
    return archived, problems


@dataclass
class ReaderTally:
    """What the concurrent readers saw: messages served from each tier, typed refusals, and anything wrong."""

    cold: int = 0
    hot: int = 0
    refused: int = 0
    refusals: dict[str, int] = field(default_factory=dict)
    wrong: list[str] = field(default_factory=list)


async def read_concurrently(runtime: Runtime, stop: asyncio.Event, tally: ReaderTally, seed: int) -> None:
    """Read archived ranges under FORCE (cold first) until ``stop``; every served message must equal the hot copy."""
    store = AsyncTieredMessageStore(runtime, read_policy=ReadPolicy.FORCE)
    hot = runtime.hot
    assert hot is not None
    rng = random.Random(seed)
    while not stop.is_set():
        topic, queue_id = rng.choice(QUEUES)
        try:
            archived = runtime.flat.get(topic, queue_id).archived_offset
        except TieredStoreError:
            archived = 0
        if archived == 0:
            await asyncio.sleep(0.05)
            continue
        offset = rng.randrange(archived)
        try:
            result = await store.get_messages(topic, queue_id, offset, 32)
        except TieredStoreError as error:
            tally.refused += 1
            tally.refusals[type(error).__name__] = tally.refusals.get(type(error).__name__, 0) + 1
            continue
        for position, message in enumerate(result.messages):
            expected_offset = offset + position
            original = await asyncio.to_thread(hot.get_message, topic, queue_id, message.queue_offset)
            if (
                message.queue_offset != expected_offset
                or message.record.queue_offset != expected_offset
                or message.record.body != original.body
                or (message.record.topic, message.record.queue_id) != (topic, queue_id)
            ):
                tally.wrong.append(f"{topic}/{queue_id}@{expected_offset} from {message.tier}")
            elif message.tier == "cold":
                tally.cold += 1
            else:
                tally.hot += 1
        await asyncio.sleep(0)


async def archive_state(config: TieredStoreConfig, *, follow: bool) -> tuple[dict[tuple[str, int], int], list[str]]:
    """(archived offset per queue, invariant problems) of every hot queue, after a restart's recovery."""
    archived: dict[tuple[str, int], int] = {}
    problems: list[str] = []
    async with open_runtime(config, hot_mode="follower" if follow else "writer") as runtime:
        hot = runtime.hot
        assert hot is not None
        for topic, queue_id in hot.queues():
            flat_file = runtime.flat.get(topic, queue_id)
            end = flat_file.archived_offset
            archived[(topic, queue_id)] = end
            reference = await _hot_reference(hot, topic, queue_id, end)
            problems += [str(p) for p in await check_queue_invariant(flat_file, reference=reference)]
    return archived, problems


async def _hot_reference(hot: LocalMessageStore, topic: str, queue_id: int, end: int) -> dict[int, bytes]:
    """The hot copies of offsets below ``end``, read again if a follower catches the live writer mid-recovery.

    Every offset below ``end`` is archived, so long since written. After a kill the writer's recovery
    drops the consume-queue units from its checkpoint on and rebuilds them from the commit log: until it
    is done a follower sees those queues end early (or a record read differently). That is not a lost
    message, so the reference is read again; one still short after the retries is reported as missing.
    """
    reference: dict[int, bytes] = {}
    for attempt in range(10):
        try:
            reference = {m.queue_offset: m.raw for m in hot.read_messages(topic, queue_id, 0, end, 1 << 40)}
        except CorruptRecordError:
            if attempt == 9:
                raise
        else:
            if end == 0 or end - 1 in reference:
                return reference
        await asyncio.sleep(0.5)
    return reference
