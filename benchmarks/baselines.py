"""Raw baselines the benchmarks compare against: file appends with an fsync policy, ``cp``, raw S3 PUTs and GETs.

Each returns a :class:`~benchmarks.harness.Measurement` of only the timed work (data preparation is the
caller's, before the call). They are deliberately the simplest fast way to move the same bytes, so a
ratio against them shows what our layers cost.
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from benchmarks.harness import Measurement, stopwatch
from tieredstore.local.mapped_file import fsync_directory

OBJECT_SIZE = 4 << 20
FsyncPolicy = Literal["none", "periodic", "each", "batched"]


def raw_append(
    path: Path,
    records: Sequence[bytes],
    *,
    fsync: FsyncPolicy,
    flush_interval: float = 0.5,
    batch_size: int = 1,
) -> Measurement:
    """Append ``records`` to one file, one ``write`` each, and fsync by ``fsync``:

    ``none`` never; ``periodic`` from a background thread every ``flush_interval`` seconds, as an
    async-flushing store does; ``each`` after every record (one fsync per message); ``batched`` after every
    ``batch_size`` records (the best a group commit could do). The time covers the appends and the
    fsyncs a caller waits for, not the final close.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    stop = threading.Event()
    flusher: threading.Thread | None = None
    fsyncs = 0
    if fsync == "periodic":

        def flush_periodically() -> None:
            nonlocal fsyncs
            while not stop.wait(flush_interval):
                os.fsync(fd)
                fsyncs += 1

        flusher = threading.Thread(target=flush_periodically, name="raw-append-flush", daemon=True)
    try:
        if flusher is not None:
            flusher.start()
        with stopwatch() as elapsed:
            if fsync == "each":
                for record in records:
                    os.write(fd, record)
                    os.fsync(fd)
                fsyncs = len(records)
            elif fsync == "batched":
                pending = 0
                for record in records:
                    os.write(fd, record)
                    pending += 1
                    if pending == batch_size:
                        os.fsync(fd)
                        fsyncs += 1
                        pending = 0
                if pending:
                    os.fsync(fd)
                    fsyncs += 1
            else:
                for record in records:
                    os.write(fd, record)
        seconds = elapsed()
    finally:
        stop.set()
        if flusher is not None:
            flusher.join()
        os.close(fd)
    return Measurement(
        seconds=seconds,
        items=len(records),
        bytes=sum(len(r) for r in records),
        extras={"fsyncs": float(fsyncs)},
    )


def tree_bytes(paths: Sequence[Path]) -> int:
    """Total size of the regular files at or under ``paths``."""
    total = 0
    for path in paths:
        if path.is_file():
            total += path.stat().st_size
        else:
            total += sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return total


def raw_cp(sources: Sequence[Path], destination: Path, *, items: int, fsync: bool = False) -> Measurement:
    """``cp -r`` of ``sources`` into the directory ``destination``; ``items`` is what the bytes hold (messages).

    ``fsync``: then make the copy durable, each copied file and directory fsynced (timed too), as a
    store must before it acknowledges: the durability-equivalent of what the archiver does per commit.
    """
    destination.mkdir(parents=True, exist_ok=True)
    with stopwatch() as elapsed:
        subprocess.run(["cp", "-r", "--", *map(str, sources), str(destination)], check=True)
        if fsync:
            fsync_tree(destination)
    return Measurement(seconds=elapsed(), items=items, bytes=tree_bytes(sources))


def fsync_tree(root: Path) -> None:
    """fsync every regular file under ``root``, then every directory (so the new entries are durable too)."""
    directories = [root]
    for path in sorted(root.rglob("*")):
        if path.is_dir():
            directories.append(path)
        elif path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    for directory in directories:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def s3_client(client_options: dict[str, Any], *, max_pool_connections: int = 10) -> Any:
    """A boto3 S3 client with a connection pool large enough for ``max_pool_connections`` threads."""
    import boto3
    from botocore.config import Config

    config = Config(max_pool_connections=max(10, max_pool_connections), retries={"max_attempts": 3})
    return boto3.client("s3", config=config, **client_options)


def split_objects(data: bytes | memoryview, object_size: int = OBJECT_SIZE) -> list[memoryview]:
    """``data`` cut into consecutive pieces of ``object_size`` bytes (the last may be shorter)."""
    view = memoryview(data)
    return [view[start : start + object_size] for start in range(0, len(view), object_size)]


def raw_s3_put(
    client: Any,
    bucket: str,
    objects: Sequence[bytes | memoryview],
    *,
    key_prefix: str,
    concurrency: int,
    items: int | None = None,
) -> Measurement:
    """PUT every object under ``key_prefix`` with ``concurrency`` threads; ``items`` defaults to the object count."""

    def put(index: int) -> None:
        client.put_object(Bucket=bucket, Key=f"{key_prefix}/{index:020d}", Body=bytes(objects[index]))

    with stopwatch() as elapsed, ThreadPoolExecutor(max_workers=concurrency) as pool:
        for future in [pool.submit(put, i) for i in range(len(objects))]:
            future.result()
    return Measurement(
        seconds=elapsed(),
        items=len(objects) if items is None else items,
        bytes=sum(len(o) for o in objects),
        extras={"put_requests": float(len(objects))},
    )


@dataclass(frozen=True, slots=True)
class RangedGet:
    """One ranged GET: ``length`` bytes of ``key`` from ``start``."""

    key: str
    start: int
    length: int


def _get_body(client: Any, bucket: str, ranged: RangedGet) -> bytes:
    """One ranged ``get_object``, its body read whole."""
    response = client.get_object(
        Bucket=bucket, Key=ranged.key, Range=f"bytes={ranged.start}-{ranged.start + ranged.length - 1}"
    )
    return bytes(response["Body"].read())


def raw_s3_ranged_get(
    client: Any, bucket: str, ranges: Sequence[RangedGet], *, concurrency: int, items: int | None = None
) -> Measurement:
    """GET every range with ``concurrency`` threads, reading each body fully."""

    def get(ranged: RangedGet) -> int:
        return len(_get_body(client, bucket, ranged))

    with stopwatch() as elapsed, ThreadPoolExecutor(max_workers=concurrency) as pool:
        received = sum(pool.map(get, ranges))
    return Measurement(
        seconds=elapsed(),
        items=len(ranges) if items is None else items,
        bytes=received,
        extras={"get_requests": float(len(ranges))},
    )


def raw_s3_get_to_files(
    client: Any, bucket: str, ranges: Sequence[RangedGet], directory: Path, *, items: int | None = None
) -> Measurement:
    """GET every range one at a time and append its body to a file per folder of keys, each fsynced when done.

    What a restore must at least do to make the same bytes durable on this disk: the fetch of
    ``raw_s3_ranged_get`` plus writing them and syncing each file (and the directory) before calling
    it finished. Ranges of one folder (a queue's commit log) are expected one after another.
    """
    directory.mkdir(parents=True, exist_ok=True)
    received = 0
    with stopwatch() as elapsed:
        fd: int | None = None
        folder: str | None = None
        try:
            for number, ranged in enumerate(ranges):
                key_folder = ranged.key.rpartition("/")[0]
                if key_folder != folder:
                    if fd is not None:
                        os.fsync(fd)
                        os.close(fd)
                    folder = key_folder
                    fd = os.open(directory / f"{number:06d}.log", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                body = _get_body(client, bucket, ranged)
                assert fd is not None
                with memoryview(body) as view:
                    written = 0
                    while written < len(view):
                        written += os.write(fd, view[written:])
                received += len(body)
        finally:
            if fd is not None:
                os.fsync(fd)
                os.close(fd)
        fsync_directory(directory)
    return Measurement(
        seconds=elapsed(),
        items=len(ranges) if items is None else items,
        bytes=received,
        extras={"get_requests": float(len(ranges))},
    )
