"""The benchmark services and meters: the moto server in its own process, and peak RSS of a process tree."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psutil

from benchmarks.baselines import RangedGet, raw_s3_put, raw_s3_ranged_get, s3_client, split_objects
from benchmarks.rss import PeakRss
from benchmarks.services import MotoServer

ALLOCATION_MIB = 200
# Hold ALLOCATION_MIB of touched memory for a while, then exit.
ALLOCATOR = f"import time; block = bytearray({ALLOCATION_MIB} << 20); time.sleep(1.5)"


def test_moto_server_runs_in_its_own_process_and_is_gone_after_exit(tmp_path: Path) -> None:
    with MotoServer(tmp_path) as s3:
        pid = s3.pid
        assert pid != psutil.Process().pid
        s3.create_bucket("bench")
        client = s3_client(s3.client_options(), max_pool_connections=4)
        data = bytes(range(256)) * 40_000
        put = raw_s3_put(client, "bench", split_objects(data, 4 << 20), key_prefix="p", concurrency=4)
        got = raw_s3_ranged_get(client, "bench", [RangedGet("p/00000000000000000001", 10, 100)], concurrency=1, items=1)
        assert put.extras["put_requests"] == 3 and put.bytes == len(data)
        assert got.bytes == 100

    deadline = time.monotonic() + 5
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the moto server outlived its context"
        time.sleep(0.05)


def test_peak_rss_counts_children_unless_excluded() -> None:
    with PeakRss() as counted:
        child = subprocess.Popen([sys.executable, "-c", ALLOCATOR])
        child.wait()
    child = subprocess.Popen([sys.executable, "-c", ALLOCATOR])
    with PeakRss(exclude=[child.pid]) as excluded:
        child.wait()

    own = psutil.Process().memory_info().rss
    assert counted.bytes >= own + (ALLOCATION_MIB << 20) * 0.9
    assert excluded.bytes < own + (ALLOCATION_MIB << 20) * 0.5
