"""The archiver on faulty S3: random faults all run long, then a storage outage, then verify on the result.

The Dispatcher runs in the test process with the hot store it owns (the embedded setup); a producer
puts while it archives and readers read archived ranges concurrently with the FORCE policy (cold
first), all through the fault proxy in front of moto. Scale: see ``tests/reliability/archiver_run.py``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from tests.archiver.processes import child_env, run_tieredstore
from tests.fixtures.faultproxy import Fault, FaultProxy, FaultRates, FaultRule
from tests.fixtures.s3 import S3Server
from tests.reliability.archiver_run import (
    FULL_SCALE,
    ReaderTally,
    invariant_problems,
    lag,
    produce,
    read_concurrently,
    s3_config,
    wait_caught_up,
    wait_for,
)
from tests.reliability.figures import Sampler, save_figure
from tests.reliability.test_corrupt_cold import flip_body_bit
from tieredstore.cli.app import EXIT_INTEGRITY
from tieredstore.dispatcher import Dispatcher
from tieredstore.errors import CorruptRecordError
from tieredstore.formats.message import decode
from tieredstore.formats.naming import parse_segment_name
from tieredstore.runtime import open_runtime

pytestmark = [pytest.mark.reliability, pytest.mark.slow, pytest.mark.timeout(900 if FULL_SCALE else 300)]

ISSUE_RATES = FaultRates(internal_error=0.05, slow_down=0.02, reset=0.01)
FAULT_MESSAGES = 200_000 if FULL_SCALE else 100_000
OUTAGE_SECONDS = 30.0 if FULL_SCALE else 10.0


@pytest.fixture
def every_log_level() -> Iterator[None]:
    """Info lines reach ``capture_logs``, and the rest a live stream, whatever an earlier CLI test configured."""
    saved = structlog.get_config()
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
        logger_factory=structlog.PrintLoggerFactory(),
    )
    yield
    structlog.configure(**saved)


def metric(runtime: Any, name: str, **labels: str) -> float:
    value = runtime.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else float(value)


def commit_failures(runtime: Any) -> float:
    return sum(
        sample.value
        for family in runtime.metrics.registry.collect()
        if family.name == "tieredstore_commit_failures"
        for sample in family.samples
        if sample.name == "tieredstore_commit_failures_total"
    )


async def burst_of_put_failures(proxy: FaultProxy, dispatcher: Dispatcher) -> FaultRule:
    """Once the archiver commits, fail the next 60 PUTs: more than its commits can absorb in retries.

    Random faults alone let every commit through the provider's two attempts on a lucky run. With at most
    ``max_pending_commits`` (8) commits in flight, each taking at most two attempts, at most 16 of 60
    consecutive failed PUTs belong to a commit with an attempt outside them; the other 44 are both attempts
    of at least 22 commits, which fail past the provider and are retried by the dispatcher.
    """
    await wait_for(lambda: dispatcher.stats.commits >= 3, within=120, what="the archiver's first commits")
    return proxy.fail(FaultRule("PUT", 500, "InternalError", times=60))


async def test_the_archiver_finishes_through_s3_faults_and_readers_never_get_bad_data(
    tmp_path: Path,
    s3_server: S3Server,
    s3_bucket: str,
    s3_bucket_url: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    data_dir = tmp_path / "data"
    started = time.monotonic()
    async with FaultProxy(s3_server.endpoint_url, rates=ISSUE_RATES, seed=9).running() as proxy:
        config = s3_config(data_dir, s3_bucket_url, s3_server, proxy.endpoint_url)
        async with open_runtime(config) as runtime:
            assert runtime.hot is not None
            dispatcher = Dispatcher.from_runtime(runtime)
            stop_archiver, stop_readers = asyncio.Event(), asyncio.Event()
            tally = ReaderTally()
            archiver = asyncio.create_task(dispatcher.run(stop_archiver))
            readers = [asyncio.create_task(read_concurrently(runtime, stop_readers, tally, seed)) for seed in (1, 2)]
            outage = asyncio.create_task(burst_of_put_failures(proxy, dispatcher))
            produced = await produce(runtime.hot, FAULT_MESSAGES, rate=20_000, seed=7)
            burst = await outage
            caught_up_in = await wait_caught_up(runtime, within=300)
            stop_readers.set()
            await asyncio.gather(*readers)
            stop_archiver.set()
            stats = await archiver
            faults = proxy.summary()
            proxy.rates = FaultRates()  # the checker is not the reader under test: it reads once, cleanly
            archived, problems = await invariant_problems(runtime)
    seconds = time.monotonic() - started

    assert problems == []
    assert archived == produced == FAULT_MESSAGES == stats.messages  # every message once, none twice
    assert tally.wrong == []  # never a partial, corrupt or wrong message
    assert tally.cold > 1000, tally  # the readers really read cold data under the faults
    assert faults[str(Fault.INTERNAL_ERROR)] > 20 and faults[str(Fault.SLOW_DOWN)] > 5 and faults[str(Fault.RESET)] > 2
    assert burst.times == 0  # the scripted burst was spent on the archiver's PUTs ...
    assert stats.commit_failures > 0  # ... so some commits failed past the provider's retries and were retried
    with capsys.disabled():
        print(
            f"\nfigures archiver-s3-faults: {produced:,} messages in {seconds:.1f}s "
            f"(caught up {caught_up_in:.1f}s after the last put), {stats.commits:,} commits, "
            f"{stats.commit_failures} commits failed past the provider and were retried; proxy {faults}; "
            f"readers: {tally.cold:,} messages served cold, {tally.hot:,} hot, {tally.refused} reads refused "
            f"{tally.refusals}, 0 wrong"
        )

    # verify --deep on the final archive (directly on moto, as its own process), then after flipping a bit.
    env = child_env(
        {
            "TIEREDSTORE_DATA_DIR": data_dir,
            "TIEREDSTORE_COLD_URL": s3_bucket_url,
            **{f"TIEREDSTORE_S3__{name.upper()}": value for name, value in s3_server.provider_options().items()},
        }
    )
    verify = ["--output", "json", "verify", "--deep"]
    clean = await asyncio.to_thread(run_tieredstore, verify, env, 300)
    assert clean.returncode == 0, clean.stderr
    clean_report = json.loads(clean.stdout)
    assert clean_report["problems"] == [] and clean_report["records"] == FAULT_MESSAGES

    key, queue_offset = await _corrupt_one_chunk(data_dir, config, s3_server, s3_bucket)
    damaged = await asyncio.to_thread(run_tieredstore, verify, env, 300)
    assert damaged.returncode == EXIT_INTEGRITY, damaged.stderr
    report = json.loads(damaged.stdout)
    (problem,) = report["problems"]
    assert problem["kind"] == "CORRUPT_RECORD" and "CRC" in problem["detail"]
    topic, queue_id = key.split("/")[-5], int(key.split("/")[-4])
    assert (problem["topic"], problem["queue_id"], problem["queue_offset"]) == (topic, queue_id, queue_offset)
    assert f"{topic}/{queue_id}" in problem["location"], problem
    with capsys.disabled():
        print(f"figures verify-deep: clean archive exit 0; after flipping a bit in {key}: exit 5, {problem}")


async def _corrupt_one_chunk(data_dir: Path, config: Any, s3_server: S3Server, bucket: str) -> tuple[str, int]:
    """Flip a body bit of the first record of a commit-log chunk that is not a segment's first; (key, its offset)."""
    client = s3_server.client()
    keys = [
        item["Key"]
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
        for item in page.get("Contents", [])
        if "/COMMIT_LOG/" in item["Key"] and item["Key"].rsplit("/", 1)[1].isdigit()
    ]
    candidates = sorted(key for key in keys if int(key.rsplit("/", 1)[1]) > 0)
    clean = config.model_copy(update={"s3": config.s3.model_copy(update={"endpoint_url": s3_server.endpoint_url})})
    async with open_runtime(clean, hot=False) as runtime:
        for key in candidates[len(candidates) // 2 :]:
            parts = key.split("/")
            topic, queue_id, segment, chunk = parts[-5], int(parts[-4]), parts[-2], int(parts[-1])
            base = parse_segment_name(segment)
            assert base is not None
            flat_file = runtime.flat.get(topic, queue_id)
            units = await flat_file.read_units(flat_file.min_offset, flat_file.archived_offset - flat_file.min_offset)
            at = [n for n, unit in enumerate(units) if unit.commitlog_offset == base + chunk]
            if not at:
                continue  # a chunk that began mid-record (a retried partial commit): pick another
            stored = client.get_object(Bucket=bucket, Key=key)["Body"].read()
            damaged = flip_body_bit(stored, 0)
            with pytest.raises(CorruptRecordError, match="CRC"):
                decode(damaged[: units[at[0]].size])
            client.put_object(Bucket=bucket, Key=key, Body=damaged)
            return key, flat_file.min_offset + at[0]
    raise AssertionError("no commit-log chunk starts at a record")


async def test_a_storage_outage_is_reported_backed_off_and_caught_up_while_puts_go_on(
    tmp_path: Path, s3_server: S3Server, s3_bucket_url: str, capsys: pytest.CaptureFixture[str], every_log_level: None
) -> None:
    async with FaultProxy(s3_server.endpoint_url).running() as proxy:
        config = s3_config(tmp_path / "data", s3_bucket_url, s3_server, proxy.endpoint_url)
        async with open_runtime(config) as runtime:
            hot = runtime.hot
            assert hot is not None
            dispatcher = Dispatcher.from_runtime(runtime)
            stop_archiver, stop_producer = asyncio.Event(), asyncio.Event()
            archiver = asyncio.create_task(dispatcher.run(stop_archiver))
            producer = asyncio.create_task(produce(hot, 10**9, rate=1_000, seed=3, stop=stop_producer))
            sampler = Sampler(
                {
                    "put": lambda: sum(hot.max_offset(t, q) for t, q in hot.queues()),
                    "archived": lambda: dispatcher.stats.messages,
                    "cold_storage_up": lambda: metric(runtime, "tieredstore_cold_storage_up"),
                    "commit_failures": lambda: commit_failures(runtime),
                }
            )
            sampler.start()
            with structlog.testing.capture_logs() as logs:
                await wait_for(lambda: dispatcher.stats.messages >= 2_000, 60, "archiving 2,000 messages")
                assert metric(runtime, "tieredstore_cold_storage_up") == 1
                archived_before, puts_before = (
                    dispatcher.stats.messages,
                    sum(hot.max_offset(t, q) for t, q in hot.queues()),
                )
                outage_started = time.monotonic()
                sampler.mark("outage began")
                with proxy.outage():
                    storage_down_seen = False
                    while time.monotonic() - outage_started < OUTAGE_SECONDS:
                        await asyncio.sleep(0.1)
                        storage_down_seen |= metric(runtime, "tieredstore_cold_storage_up") == 0
                        assert not producer.done(), "the producer stopped during the outage"
                    archived_in_outage = dispatcher.stats.messages - archived_before
                    lag_at_end = lag(runtime)
                    failures_in_outage = commit_failures(runtime)
                    put_in_outage = sum(hot.max_offset(t, q) for t, q in hot.queues()) - puts_before
                outage_ended = time.monotonic()
                sampler.mark("outage ended")
                storage_down_at_end = metric(runtime, "tieredstore_cold_storage_up") == 0
                await asyncio.sleep(2)
                stop_producer.set()
                produced = await producer
                sampler.mark("last put")
                caught_up_in = await wait_caught_up(runtime, within=120)
                sampler.mark("caught up")
                await asyncio.sleep(0.5)  # a few samples after it, for the plot's right edge
                await sampler.stop()
                assert metric(runtime, "tieredstore_cold_storage_up") == 1
            stop_archiver.set()
            stats = await archiver
            archived, problems = await invariant_problems(runtime)

    failed = [e for e in logs if e["event"] == "commit failed; retrying with backoff"]
    resumed = [e for e in logs if e["event"] == "commits resumed"]
    per_queue: dict[tuple[str, int], int] = {}
    for event in failed:
        per_queue[(event["topic"], event["queue_id"])] = per_queue.get((event["topic"], event["queue_id"]), 0) + 1
    assert storage_down_seen and storage_down_at_end  # the gauge said so for the outage
    assert failures_in_outage >= len(per_queue) > 0  # the commit-failure counter went up
    assert failed and all("StorageUnavailableError" in e["error"] for e in failed)  # and the log said why
    # Backoff: without it each failing queue would retry every scan (50 ms), OUTAGE_SECONDS / 0.05 times.
    backoff_bound = 6 + OUTAGE_SECONDS / 2.0 * 1.5
    assert max(per_queue.values()) <= backoff_bound, per_queue
    assert archived_in_outage <= 256 * 8  # at most the batches in flight when it began got through
    assert put_in_outage > 0.5 * 1_000 * OUTAGE_SECONDS  # puts went on at the producer's rate
    assert lag_at_end >= put_in_outage * 0.9
    assert {(e["topic"], e["queue_id"]) for e in resumed} == set(per_queue)  # each failing queue resumed
    assert problems == [] and archived == produced == stats.messages
    save_figure("archiver-outage", sampler.figure(outage_seconds=OUTAGE_SECONDS, producer_rate=1_000))
    with capsys.disabled():
        print(
            f"\nfigures archiver-outage: {OUTAGE_SECONDS:.0f}s outage; {put_in_outage:,} puts accepted during it "
            f"(lag {lag_at_end:,} at its end); {len(failed)} failed commits over {len(per_queue)} "
            f"queues (at most {max(per_queue.values())} per queue); cold_storage_up 0 during the outage; "
            f"caught up {caught_up_in:.1f}s after the last put ({outage_ended - outage_started:.1f}s outage); "
            f"{produced:,} messages archived exactly once"
        )
