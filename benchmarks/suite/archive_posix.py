"""Archive to POSIX (issue 5): the real Dispatcher moving 1 KiB messages over 16 queues, beside ``cp`` of the hot files.

One hot store is filled once; every round archives all of it into a fresh cold directory and a
fresh SQLite metadata database (the round's node directory links to the shared hot store). The
baseline copies the hot commit-log files with ``cp -r`` into the round's directory: the same record
bytes, none of the work (consume queues, metadata, PHYSICALOFFSET rewrite). "Ours" runs twice: without
the key index (the archiver's own cost) and with it (as ``tieredstore run`` is wired; the messages
carry no keys, so it measures the index's overhead on a key-less workload).

Plain ``cp`` never fsyncs: it leaves the copy in the page cache, while the archiver makes every commit
durable before it records it. A second baseline, ``cp -r`` followed by an fsync of every copied file
and directory, is the fair durability-equivalent comparison and the only one with a target. The plain
``cp`` rows stay, without a target, to show what the durability itself costs the copy.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.baselines import raw_cp
from benchmarks.harness import BenchmarkContext, Contender, Measurement, Target, benchmark
from benchmarks.workloads import HotData, archive, config_for, fill_hot_store, node_dir_over

QUEUES = 16
BODY_BYTES = 1024
FULL_MESSAGES = 1_000_000
FSYNC_TARGET = Target.at_least(0.8, "≥ 0.8 (80% of cp + fsync: the fair durability-equivalent comparison)")


def _cp(hot: HotData, directory: Path, *, fsync: bool = False) -> Measurement:
    copied = raw_cp([hot.hot_dir / "commitlog"], directory / "copy", items=hot.messages, fsync=fsync)
    # cp moves whole (partly sparse) files; the comparison is about the records both sides carry.
    return Measurement(seconds=copied.seconds, items=hot.messages, bytes=hot.record_bytes)


def _archive(hot: HotData, directory: Path, *, with_index: bool) -> Measurement:
    config = config_for(node_dir_over(hot, directory), queues=hot.queues)
    seconds = archive(config, with_index=with_index, expected=hot.messages)
    return Measurement(seconds=seconds, items=hot.messages, bytes=hot.record_bytes)


@benchmark(
    "archive_posix",
    title="Archive to POSIX vs cp",
    issue=5,
    summary=(
        f"{BODY_BYTES} B messages over {QUEUES} queues archived from the hot store to a POSIX cold directory by the "
        "real `Dispatcher.run_once` (SQLite metadata), beside `cp -r` of the hot commit-log files, and beside "
        "`cp -r` then fsync of every copied file (the fair durability-equivalent comparison: the archiver fsyncs "
        "every commit). Ours runs without and with the key index."
    ),
)
def archive_posix(ctx: BenchmarkContext) -> None:
    messages = ctx.scale(full=FULL_MESSAGES, quick=2_000)
    hot = fill_hot_store(ctx.work_dir / "source", messages=messages, queues=QUEUES, body_bytes=BODY_BYTES)
    ctx.parameter(
        messages=messages,
        queues=QUEUES,
        body_bytes=BODY_BYTES,
        record_mib=round(hot.record_bytes / (1 << 20), 1),
        cold_tier="POSIX (local directory, same file system)",
        metadata="SQLite",
    )
    for with_index in (False, True):
        label = "with key index" if with_index else "no key index"
        ctx.compare(
            f"archive, {label}",
            description=f"{messages:,} messages, {QUEUES} queues",
            baseline=Contender("cp -r of the hot commit log", lambda d: _cp(hot, d)),
            ours=Contender(
                f"Dispatcher.run_once, {label}",
                lambda d, with_index=with_index: _archive(hot, d, with_index=with_index),  # type: ignore[misc]
            ),
            unit="msg",
        )
        ctx.compare(
            f"archive, {label}, vs cp + fsync",
            description=f"{messages:,} messages, {QUEUES} queues; the copy fsynced as the archiver's commits are",
            baseline=Contender(
                "cp -r of the hot commit log, then fsync of every copied file", lambda d: _cp(hot, d, fsync=True)
            ),
            ours=Contender(
                f"Dispatcher.run_once, {label}",
                lambda d, with_index=with_index: _archive(hot, d, with_index=with_index),  # type: ignore[misc]
            ),
            unit="msg",
            target=FSYNC_TARGET,
        )
