"""Shared benchmark workloads: filled hot stores, node configs, the real archiver, S3 request counts.

Every archive-side benchmark starts from the same shape of data: a hot store holding ``messages``
records spread round-robin over ``queues`` queues of one topic, with random bodies and optionally a
unique key per message (so the key index has work). By default the bodies are a few distinct random
ones in turn: nothing compresses one body, but a compressor whose window spans several messages
(zstd over a commit) finds each again; ``unique_bodies`` makes every body new random bytes. The configs keep
hot files small enough that copying the hot directory (``cp``, ``rclone``) moves little beyond the
records themselves: preallocated but unused file space would otherwise flatter or penalise a baseline.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness import stopwatch
from benchmarks.services import S3_CREDENTIALS, S3_REGION, MotoServer
from tieredstore.config import TieredStoreConfig
from tieredstore.dispatcher import Dispatcher, OnceResult
from tieredstore.local.store import PutRequest
from tieredstore.runtime import open_hot_store, open_runtime

TOPIC = "BenchmarkTopic"
BUCKET = "tieredstore-bench"
# Small hot files: copying the hot directory then moves the records, not gigabytes of preallocated zeroes.
HOT_COMMIT_LOG_FILE_BYTES = 64 << 20
HOT_UNITS_PER_CONSUME_QUEUE_FILE = 16_384
PUT_BATCH = 256


@dataclass(frozen=True, slots=True)
class HotData:
    """A filled hot store: where it is and what it holds."""

    data_dir: Path
    messages: int
    queues: int
    record_bytes: int  # the records' total size, what every side of a comparison moves

    @property
    def hot_dir(self) -> Path:
        return self.data_dir / "hot"


def config_for(
    data_dir: Path,
    *,
    cold_url: str | None = None,
    s3: MotoServer | None = None,
    metadata_url: str | None = None,
    queues: int = 16,
    max_message_bytes: int = 4 << 20,
    archiver: Mapping[str, Any] | None = None,
    index: Mapping[str, Any] | None = None,
    read: Mapping[str, Any] | None = None,
    codecs: Mapping[str, Mapping[str, Any]] | None = None,
    table: Mapping[str, Any] | None = None,
) -> TieredStoreConfig:
    """A node config under ``data_dir`` (POSIX cold tier and SQLite in it unless given), hot files kept small.

    ``codecs``: the ``cold`` and ``encryption`` sections (:func:`codec_sections`), framing new segments;
    ``table``: the ``[table]`` section (a namespace per round keeps each round's Iceberg table apart).
    """
    values: dict[str, Any] = {
        "data_dir": data_dir,
        "hot": {
            "commit_log_file_size": max(HOT_COMMIT_LOG_FILE_BYTES, 2 * max_message_bytes),
            "consume_queue_units_per_file": HOT_UNITS_PER_CONSUME_QUEUE_FILE,
            "max_queues_per_topic": max(1024, queues),
            "max_message_size": max_message_bytes,
        },
        "archiver": dict(archiver or {}),
        "index": dict(index or {}),
        "read": dict(read or {}),
        "table": dict(table or {}),
    }
    values.update(codecs or {})
    if cold_url is not None:
        values["cold_url"] = cold_url
    if metadata_url is not None:
        values["metadata_url"] = metadata_url
    if s3 is not None:
        values["s3"] = s3_settings(s3)
    return TieredStoreConfig.model_validate(values)


def s3_settings(s3: MotoServer) -> dict[str, Any]:
    return {
        "endpoint_url": s3.endpoint_url,
        "region": S3_REGION,
        "access_key_id": S3_CREDENTIALS["aws_access_key_id"],
        "secret_access_key": S3_CREDENTIALS["aws_secret_access_key"],
        "addressing_style": "path",
    }


def s3_environment(s3: MotoServer) -> dict[str, str]:
    """``TIEREDSTORE_S3__*`` variables for a ``tieredstore`` subprocess talking to ``s3``."""
    return {f"TIEREDSTORE_S3__{name.upper()}": str(value) for name, value in s3_settings(s3).items()}


def fill_hot_store(
    data_dir: Path,
    *,
    messages: int,
    queues: int,
    body_bytes: int,
    keys: bool = False,
    topic: str = TOPIC,
    unique_bodies: bool = False,
) -> HotData:
    """Put ``messages`` random-bodied messages round-robin over ``queues`` queues (``keys``: one unique key each;
    ``unique_bodies``: no two bodies alike, so nothing compresses)."""
    config = config_for(data_dir, queues=queues, max_message_bytes=max(4096, 2 * body_bytes))
    distinct_bodies = [os.urandom(body_bytes) for _ in range(min(queues, 64))]

    def body(number: int) -> bytes:
        return os.urandom(body_bytes) if unique_bodies else distinct_bodies[number % len(distinct_bodies)]

    with open_hot_store(config) as hot:
        for start in range(0, messages, PUT_BATCH):
            hot.put_messages(
                [
                    PutRequest(
                        topic,
                        number % queues,
                        body(number),
                        (f"key-{number}",) if keys else (),
                    )
                    for number in range(start, min(messages, start + PUT_BATCH))
                ]
            )
        hot.flush()
        record_bytes = hot.commitlog_max_offset - hot.commitlog_min_offset
    return HotData(data_dir, messages, queues, record_bytes)


def hot_records(hot: HotData) -> bytes:
    """The hot commit log's record bytes, concatenated (what raw PUTs and ``cp`` move)."""
    files = sorted((hot.hot_dir / "commitlog").iterdir())
    remaining = hot.record_bytes
    pieces = []
    for path in files:
        with path.open("rb") as handle:
            # A record never straddles files: a file ends in a blank record when the next does not fit.
            piece = handle.read(min(remaining, path.stat().st_size))
        pieces.append(piece)
        remaining -= len(piece)
        if remaining <= 0:
            break
    return b"".join(pieces)


def node_dir_over(hot: HotData, directory: Path) -> Path:
    """A fresh node data dir whose hot store is ``hot``'s (a symlink): every round archives the same data anew."""
    data_dir = directory / "node"
    data_dir.mkdir(parents=True)
    (data_dir / "hot").symlink_to(hot.hot_dir.resolve(), target_is_directory=True)
    return data_dir


@dataclass(frozen=True, slots=True)
class ArchiveRun:
    """One ``run_once``: its wall seconds and this process's CPU seconds over it (every thread)."""

    seconds: float
    cpu_seconds: float


async def _archive(config: TieredStoreConfig, *, with_index: bool) -> tuple[ArchiveRun, OnceResult]:
    async with open_runtime(config, recover=False) as runtime:
        if with_index:
            dispatcher = Dispatcher.from_runtime(runtime, settings=config.archiver)
        else:
            assert runtime.hot is not None
            dispatcher = Dispatcher(
                runtime.hot, runtime.flat, metadata=runtime.metadata, index=None, settings=config.archiver
            )
        cpu_before = time.process_time()
        with stopwatch() as elapsed:
            result = await dispatcher.run_once()
        measured = ArchiveRun(elapsed(), time.process_time() - cpu_before)
    if result.failed:
        raise RuntimeError(f"the archiver gave up on {len(result.failed)} queue(s): {result.failed}")
    return measured, result


def archive_run(config: TieredStoreConfig, *, with_index: bool, expected: int) -> ArchiveRun:
    """Run the real Dispatcher's ``run_once`` over ``config``; the wall and CPU seconds ``run_once`` took."""
    measured, result = asyncio.run(_archive(config, with_index=with_index))
    if result.stats.messages != expected:
        raise RuntimeError(f"the archiver archived {result.stats.messages} messages of {expected}")
    return measured


def archive(config: TieredStoreConfig, *, with_index: bool, expected: int) -> float:
    """Run the real Dispatcher's ``run_once`` over ``config``; the seconds ``run_once`` took."""
    return archive_run(config, with_index=with_index, expected=expected).seconds


# ---- S3 requests, counted from the moto server's request log ----------------------------------------

_REQUEST_LINE = re.compile(r'"(?:\x1b\[[0-9;]*m)*(GET|PUT|POST|HEAD|DELETE) (\S+) HTTP/')


@dataclass(frozen=True, slots=True)
class RequestCounts:
    """S3 requests by billing class: PUT/POST (writes), GET of an object, LIST, HEAD, DELETE."""

    put: int = 0
    get: int = 0
    list: int = 0
    head: int = 0
    delete: int = 0

    def __sub__(self, other: RequestCounts) -> RequestCounts:
        return RequestCounts(
            self.put - other.put,
            self.get - other.get,
            self.list - other.list,
            self.head - other.head,
            self.delete - other.delete,
        )


def _classify(method: str, target: str) -> str:
    if method in ("PUT", "POST"):
        return "put"
    if method == "GET":
        path, _, query = target.partition("?")
        is_bucket = path.strip("/").count("/") == 0
        return "list" if is_bucket or "list-type" in query else "get"
    return method.lower()


def request_counts(s3: MotoServer) -> RequestCounts:
    """Every S3 request the server has logged so far, once its log has stopped growing."""
    previous = -1
    text = ""
    deadline = time.monotonic() + 3.0
    # The server logs a request after answering it: wait for the last lines to land.
    while time.monotonic() < deadline:
        text = s3.log_path.read_text(encoding="utf-8", errors="replace")
        if len(text) == previous:
            break
        previous = len(text)
        time.sleep(0.15)
    tally = {"put": 0, "get": 0, "list": 0, "head": 0, "delete": 0}
    for match in _REQUEST_LINE.finditer(text):
        kind = _classify(match.group(1), match.group(2))
        if kind in tally:
            tally[kind] += 1
    return RequestCounts(**tally)


def per_thousand(count: int, messages: int) -> float:
    return 1000.0 * count / messages if messages else 0.0


def split_records(data: bytes, limit: int | None = None) -> list[bytes]:
    """The first ``limit`` (default all) records of a commit-log byte run, each by its TOTALSIZE header."""
    records: list[bytes] = []
    position = 0
    view = memoryview(data)
    while position + 4 <= len(data) and (limit is None or len(records) < limit):
        size = int.from_bytes(view[position : position + 4], "big")
        if size <= 0 or position + size > len(data):
            break
        records.append(bytes(view[position : position + size]))
        position += size
    return records


def empty_bucket(client: Any, bucket: str) -> None:
    """Delete every object of ``bucket`` (the moto server keeps them in memory; later rounds need it back)."""
    paginator = client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=bucket):
        keys = [{"Key": item["Key"]} for item in page.get("Contents", [])]
        for start in range(0, len(keys), 1000):
            client.delete_objects(Bucket=bucket, Delete={"Objects": keys[start : start + 1000], "Quiet": True})


def config_environment(config: TieredStoreConfig) -> dict[str, str]:
    """``TIEREDSTORE_*`` variables that give a ``tieredstore`` subprocess the same node as ``config``."""
    environment = {
        "TIEREDSTORE_DATA_DIR": str(config.data_dir),
        "TIEREDSTORE_COLD_URL": config.effective_cold_url,
        "TIEREDSTORE_METADATA_URL": config.effective_metadata_url,
    }
    for section in ("hot", "archiver", "index", "read"):
        for name, value in getattr(config, section).model_dump(mode="json", exclude_defaults=True).items():
            environment[f"TIEREDSTORE_{section.upper()}__{name.upper()}"] = str(value)
    for name, value in config.s3.model_dump(mode="json", exclude_defaults=True).items():
        secret = getattr(config.s3, name)
        plain = secret.get_secret_value() if hasattr(secret, "get_secret_value") else value
        environment[f"TIEREDSTORE_S3__{name.upper()}"] = str(plain)
    return environment
