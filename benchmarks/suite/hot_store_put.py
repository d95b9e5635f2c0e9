"""Hot-store put throughput (issue 4): 1 KiB messages over 16 queues, async and sync flush, beside raw appends.

The raw baselines append the very records the store writes (same encoder, same sizes) to one file with
one ``write`` per message, under the same fsync policy: periodic for async; for sync both one fsync per
message (what group commit is measured against) and one fsync per batch of as many messages as there are
producers (the best any group commit could do).

Keyed puts carry one key and a UNIQ_KEY, as RocketMQ producers send every message, so each put adds two
items to the hot key index: they run beside the same raw appends (of records as large as theirs) and
beside our own unkeyed puts, the ratio that shows what the index costs a put.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from functools import partial
from pathlib import Path

from benchmarks.baselines import raw_append
from benchmarks.harness import BenchmarkContext, Contender, Measurement, Target, benchmark, stopwatch
from tieredstore.formats.message import PROPERTY_KEYS, PROPERTY_UNIQ_KEY, encode_properties, encode_raw
from tieredstore.local.config import LocalStoreConfig
from tieredstore.local.store import LocalMessageStore, PutRequest

TOPIC = "BenchmarkTopic"
QUEUES = 16
BODY_SIZE = 1024
FLUSH_INTERVAL_S = 0.5
BATCH_SIZE = 32
SYNC_PRODUCERS = 32
# One fsync per message costs ~0.2 ms here: a few thousand of them give a steady rate without eating the budget.
FSYNC_EACH_MESSAGES = 4000


# A client's UNIQ_KEY: 32 hex digits (address, pid, class-loader hash, time, counter); the counter part varies.
UNIQ_KEY_PREFIX = "7F0000010B5C18B4AAC2"


def _keys(index: int) -> tuple[list[str], dict[str, str]]:
    """The keys= and properties= of keyed put ``index``: one business key and the client's UNIQ_KEY."""
    return [f"order-{index:08d}"], {PROPERTY_UNIQ_KEY: f"{UNIQ_KEY_PREFIX}{index:012X}"}


def _bodies() -> list[bytes]:
    return [os.urandom(BODY_SIZE) for _ in range(QUEUES)]


def _raw_records(bodies: Sequence[bytes], count: int, *, keyed: bool = False) -> list[bytes]:
    """The records the store would write for ``count`` puts (keyed ones as large as the store's), for the
    raw baselines to append."""
    topic_raw = TOPIC.encode("ascii")
    properties_raw = b""
    if keyed:
        keys, properties = _keys(0)
        properties_raw = encode_properties({**properties, PROPERTY_KEYS: " ".join(keys)})
    per_queue = [
        encode_raw(topic_raw=topic_raw, queue_id=q, body=bodies[q], properties_raw=properties_raw)
        for q in range(QUEUES)
    ]
    return [per_queue[i % QUEUES] for i in range(count)]


def _config(flush_mode: str) -> LocalStoreConfig:
    return LocalStoreConfig(flush_mode=flush_mode, flush_interval=FLUSH_INTERVAL_S)  # type: ignore[arg-type]


def _check_all_stored(store: LocalMessageStore, expected: int) -> None:
    stored = sum(store.max_offset(topic, queue_id) for topic, queue_id in store.queues())
    if stored != expected:
        raise RuntimeError(f"the hot store holds {stored} messages after {expected} puts")


def _put_single_thread(
    directory: Path, bodies: Sequence[bytes], count: int, *, batch: int, keyed: bool = False
) -> Measurement:
    # Built before the clock starts, so a keyed put is timed on what the store does with its keys.
    keys = [_keys(i) if keyed else ((), None) for i in range(count)]
    with LocalMessageStore(directory / "store", config=_config("async")) as store:
        with stopwatch() as elapsed:
            if batch == 1:
                for i in range(count):
                    store.put_message(TOPIC, i % QUEUES, bodies[i % QUEUES], keys[i][0], properties=keys[i][1])
            else:
                for start in range(0, count, batch):
                    store.put_messages(
                        [
                            PutRequest(TOPIC, i % QUEUES, bodies[i % QUEUES], keys[i][0], None, keys[i][1])
                            for i in range(start, min(count, start + batch))
                        ]
                    )
            if keyed:
                # Timed until every put is found by key: the index work done off the put path counts.
                assert store.query_keys(TOPIC, keys[-1][0][0], 1)
        seconds = elapsed()
        _check_all_stored(store, count)
        written = store.commitlog_max_offset - store.commitlog_min_offset
    return Measurement(seconds=seconds, items=count, bytes=written)


def _put_concurrently(directory: Path, bodies: Sequence[bytes], count: int, producers: int) -> Measurement:
    """``producers`` threads share ``count`` sync puts; every put returns only once durable."""
    shares = [count // producers + (1 if p < count % producers else 0) for p in range(producers)]
    start = threading.Barrier(producers + 1)
    failures: list[BaseException] = []
    with LocalMessageStore(directory / "store", config=_config("sync")) as store:

        def produce(producer: int) -> None:
            start.wait()
            try:
                for i in range(shares[producer]):
                    queue_id = (producer + i) % QUEUES
                    store.put_message(TOPIC, queue_id, bodies[queue_id])
            except BaseException as exc:  # noqa: BLE001 - handed to the main thread, which re-raises it
                failures.append(exc)

        threads = [threading.Thread(target=produce, args=(p,), name=f"producer-{p}") for p in range(producers)]
        for thread in threads:
            thread.start()
        syncs_before = store.flush_stats.commit_log_syncs
        with stopwatch() as elapsed:
            start.wait()
            for thread in threads:
                thread.join()
        seconds = elapsed()
        if failures:
            raise failures[0]
        syncs = store.flush_stats.commit_log_syncs - syncs_before
        _check_all_stored(store, count)
        written = store.commitlog_max_offset - store.commitlog_min_offset
    return Measurement(
        seconds=seconds,
        items=count,
        bytes=written,
        extras={"commit_log_syncs": float(syncs), "puts_per_sync": count / syncs if syncs else float(count)},
    )


@benchmark(
    "hot_store_put",
    title="Hot-store put throughput",
    issue=4,
    summary=(
        f"{BODY_SIZE} B messages over {QUEUES} queues into `LocalMessageStore`, async flush (one producer "
        f"thread) and sync flush ({SYNC_PRODUCERS} producer threads, so group commit shows), each beside raw "
        "`os.write` appends of the same record bytes to one file under the same fsync policy."
    ),
)
def hot_store_put(ctx: BenchmarkContext) -> None:
    async_count = ctx.scale(full=200_000, quick=1_000)
    sync_count = ctx.scale(full=40_000, quick=500)
    fsync_each_count = ctx.scale(full=FSYNC_EACH_MESSAGES, quick=100)
    bodies = _bodies()
    async_records = _raw_records(bodies, async_count)
    sync_records = _raw_records(bodies, sync_count)
    ctx.parameter(
        body_bytes=BODY_SIZE,
        record_bytes=len(async_records[0]),
        keyed_record_bytes=len(_raw_records(bodies, 1, keyed=True)[0]),
        queues=QUEUES,
        async_messages=async_count,
        sync_messages=sync_count,
        sync_producers=SYNC_PRODUCERS,
        fsync_each_messages=fsync_each_count,
        flush_interval_s=FLUSH_INTERVAL_S,
    )

    ctx.compare(
        "async",
        description="one producer, put_message",
        baseline=Contender(
            "raw append, fsync every 0.5 s",
            lambda d: raw_append(d / "raw", async_records, fsync="periodic", flush_interval=FLUSH_INTERVAL_S),
        ),
        ours=Contender("put_message, async flush", lambda d: _put_single_thread(d, bodies, async_count, batch=1)),
        unit="msg",
        target=Target.at_least(0.5, "≥ 0.5 (50% of raw)"),
    )
    ctx.compare(
        "async batch",
        description=f"one producer, put_messages of {BATCH_SIZE}",
        baseline=Contender(
            "raw append, fsync every 0.5 s",
            lambda d: raw_append(d / "raw", async_records, fsync="periodic", flush_interval=FLUSH_INTERVAL_S),
        ),
        ours=Contender(
            f"put_messages x{BATCH_SIZE}, async flush",
            lambda d: _put_single_thread(d, bodies, async_count, batch=BATCH_SIZE),
        ),
        unit="msg",
        target=Target.at_least(0.5, "≥ 0.5 (50% of raw)"),
    )
    keyed_records = _raw_records(bodies, async_count, keyed=True)
    keyed_target = Target.at_least(0.8, "keyed put ≥ 0.8 of unkeyed put")
    for batch, suffix, put in ((1, "", "put_message"), (BATCH_SIZE, " batch", f"put_messages x{BATCH_SIZE}")):
        shape = "put_message" if batch == 1 else f"put_messages of {BATCH_SIZE}"
        keyed = Contender(
            f"{put} keyed, async flush",
            partial(_put_single_thread, bodies=bodies, count=async_count, batch=batch, keyed=True),
        )
        ctx.compare(
            f"async{suffix} keyed",
            description=f"one producer, {shape} with a key and a UNIQ_KEY each",
            baseline=Contender(
                "raw append, fsync every 0.5 s",
                lambda d: raw_append(d / "raw", keyed_records, fsync="periodic", flush_interval=FLUSH_INTERVAL_S),
            ),
            ours=keyed,
            unit="msg",
        )
        ctx.compare(
            f"keyed vs unkeyed{suffix}",
            description=f"{shape} with a key and a UNIQ_KEY each against {shape} without",
            baseline=Contender(
                f"{put}, async flush",
                partial(_put_single_thread, bodies=bodies, count=async_count, batch=batch),
            ),
            ours=keyed,
            unit="msg",
            target=keyed_target,
        )
    ctx.compare(
        "sync group commit",
        description=f"{SYNC_PRODUCERS} producers vs one fsync per message",
        baseline=Contender(
            "raw append + fsync per message",
            lambda d: raw_append(d / "raw", sync_records[:fsync_each_count], fsync="each"),
        ),
        ours=Contender(
            f"put_message, sync flush, {SYNC_PRODUCERS} threads",
            lambda d: _put_concurrently(d, bodies, sync_count, SYNC_PRODUCERS),
        ),
        unit="msg",
        target=Target.at_least(10.0, "≥ 10x one-fsync-per-message"),
    )
    ctx.compare(
        "sync vs ideal batching",
        description=f"{SYNC_PRODUCERS} producers vs raw append + one fsync per {SYNC_PRODUCERS} messages",
        baseline=Contender(
            f"raw append + fsync per {SYNC_PRODUCERS} messages",
            lambda d: raw_append(d / "raw", sync_records, fsync="batched", batch_size=SYNC_PRODUCERS),
        ),
        ours=Contender(
            f"put_message, sync flush, {SYNC_PRODUCERS} threads",
            lambda d: _put_concurrently(d, bodies, sync_count, SYNC_PRODUCERS),
        ),
        unit="msg",
    )

    producer_counts = [1, 2, 4, 8, 16, 32, 64] if not ctx.quick else [1, 8]
    per_point = ctx.scale(full=6_000, quick=100)
    sync_rates: list[float] = []
    puts_per_sync: list[float] = []
    for producers in producer_counts:
        point_dir = ctx.work_dir / f"scaling-{producers}"
        point_dir.mkdir()
        measurement = _put_concurrently(point_dir, bodies, max(per_point, producers), producers)
        sync_rates.append(measurement.items / measurement.seconds)
        puts_per_sync.append(measurement.extras["puts_per_sync"])
    fsync_each_dir = ctx.work_dir / "scaling-raw"
    fsync_each_dir.mkdir()
    fsync_each = raw_append(fsync_each_dir / "raw", sync_records[:fsync_each_count], fsync="each")
    fsync_each_rate = fsync_each.items / fsync_each.seconds
    ctx.curve(
        "sync-producers",
        title="Sync put throughput as producers grow (group commit)",
        x_label="concurrent producer threads",
        y_label="messages/s (durable on return)",
        x=producer_counts,
        lines={
            "put_message, sync flush": sync_rates,
            "raw append + fsync per message": [fsync_each_rate] * len(producer_counts),
            "target: 10x raw fsync per message": [10 * fsync_each_rate] * len(producer_counts),
        },
        log_x=True,
        log_y=True,
    )
    ctx.curve(
        "sync-puts-per-sync",
        title="Puts served per commit-log sync as producers grow",
        x_label="concurrent producer threads",
        y_label="puts per sync",
        x=producer_counts,
        lines={"put_message, sync flush": puts_per_sync},
        log_x=True,
    )
    if not ctx.quick:
        ctx.note(
            f"One fsync per message is measured over {fsync_each_count:,} messages (not {sync_count:,}): "
            "each costs a disk round trip, and the rate is steady after a few hundred."
        )
