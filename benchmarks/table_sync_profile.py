"""Where a table sync's time goes: ``python -m benchmarks.table_sync_profile [messages] [--unique] [--s3]``.

The data is shaped as in ``table_sync`` (1 KiB bodies over 16 queues, archived by the real Dispatcher with
the key index), on a POSIX cold tier or (``--s3``) a moto server in its own process. The archive's time is
printed, then one sync of a new table (``sync_topic``, as the benchmark times it) runs under cProfile, with
its wall time, this process's CPU (every thread) and the moto server's CPU over it, and the functions that
took longest. ``--unique`` makes every body new random bytes (incompressible).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import tempfile
import time
from pathlib import Path

import psutil

from benchmarks.services import MotoServer
from benchmarks.suite.table_sync import BODY_BYTES, QUEUES
from benchmarks.tables import fresh_namespace, sync_tables
from benchmarks.workloads import archive, config_for, fill_hot_store, node_dir_over


def _cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("messages", type=int, nargs="?", default=100_000)
    parser.add_argument("--unique", action="store_true", help="every body new random bytes")
    parser.add_argument("--s3", action="store_true", help="archive and table on a moto S3 server")
    parser.add_argument("--lines", type=int, default=40, help="profile lines to print")
    arguments = parser.parse_args()
    messages = arguments.messages
    with tempfile.TemporaryDirectory(prefix="tieredstore-table-sync-profile-") as work, MotoServer(Path(work)) as s3:
        work_dir = Path(work)
        hot = fill_hot_store(
            work_dir / "source", messages=messages, queues=QUEUES, body_bytes=BODY_BYTES, unique_bodies=arguments.unique
        )
        cold = {"cold_url": f"s3://{s3.create_bucket('profile')}/archive", "s3": s3} if arguments.s3 else {}
        config = config_for(node_dir_over(hot, work_dir / "archived"), queues=QUEUES, table=fresh_namespace(), **cold)
        server = psutil.Process(s3.pid)
        server_before = _cpu_seconds(server)
        archive_cpu_before = time.process_time()
        archived = archive(config, with_index=True, expected=messages)
        archive_cpu = time.process_time() - archive_cpu_before
        archive_server_cpu = _cpu_seconds(server) - server_before
        server_before = _cpu_seconds(server)
        cpu_before = time.process_time()
        profiler = cProfile.Profile()
        synced = profiler.runcall(sync_tables, config, expected=messages)
        cpu = time.process_time() - cpu_before
        server_cpu = _cpu_seconds(server) - server_before
    where = "S3 (moto)" if arguments.s3 else "POSIX"
    bodies = "unique random" if arguments.unique else "16 distinct random"
    print(f"{messages:,} messages, {bodies} bodies, {where}")
    print(
        f"archive (run_once): {archived:.2f} s, {messages / archived:,.0f} msg/s; CPU of this process "
        f"{archive_cpu:.2f} s, of the moto server {archive_server_cpu:.2f} s"
    )
    print(
        f"table sync (sync_topic): {synced.seconds:.2f} s, {messages / synced.seconds:,.0f} msg/s, "
        f"{synced.commits} commits; CPU of this process {cpu:.2f} s, of the moto server {server_cpu:.2f} s"
    )
    statistics = pstats.Stats(profiler)
    statistics.sort_stats("cumulative").print_stats(arguments.lines)


if __name__ == "__main__":
    main()
