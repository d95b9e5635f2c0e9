"""Sequential cold read from S3 of zstd-compressed, AES-256-GCM-sealed segments (issue 33), beside raw GETs
of the same stored objects.

Each hot store is archived once by the real Dispatcher with ``[cold] compression = "zstd"`` and
``[encryption]`` on (a keyring file's fixed test key) to a moto server in its own process. "Ours" is
``cold_read_s3``'s reader: a fresh ``AsyncTieredMessageStore`` per round reading every queue from its first
offset to its end, 32 messages per call, under FORCE. The baseline GETs, one at a time, every object that
read fetches, whole, as the reader fetches a frame: each commit-log segment's ``.codec`` descriptor and
every chunk object (one frame each; the sequential read walks the commit log and fetches no consume-queue
object), so the same stored bytes in the same request sizes, with nothing decompressed, decrypted or parsed.

Beside each pair, the same read of the same messages archived without codecs (no target): what reading
sealed segments costs our reader apart from the bytes it moves. Three workloads: ``cold_read_s3``'s
1 KiB random bodies over 16 queues (16 distinct bodies in turn, which zstd finds again within a commit:
stored bytes about a hundredth of the logical ones), the same shape with every body new random bytes
(stored bytes about the logical ones: what sealing costs where compression saves nothing) and the demo's
JSON messages (stored bytes a few percent of them). Where compression works, the baseline moves that
much less than our reader returns.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.baselines import RangedGet, raw_s3_ranged_get, s3_client
from benchmarks.cold_codecs import (
    DEMO_QUEUES,
    codec_sections,
    fill_demo_hot_store,
)
from benchmarks.harness import BenchmarkContext, Contender, Measurement, Target, benchmark
from benchmarks.services import MotoServer
from benchmarks.suite.cold_read_s3 import BATCH, measured_read
from benchmarks.workloads import TOPIC, HotData, archive, config_for, fill_hot_store
from tieredstore.config import TieredStoreConfig
from tieredstore.formats.naming import FileType
from tieredstore.providers.chunks import chunk_name, parse_chunk_name
from tieredstore.providers.codec import DESCRIPTOR_NAME

QUEUES = 16
BODY_BYTES = 1024
FULL_MESSAGES = 160_000
FETCHED_FOLDER = f"/{FileType.COMMIT_LOG.value}/"
FIRST_CHUNK = chunk_name(0)


def framed_objects(client: Any, bucket: str) -> list[RangedGet]:
    """Every descriptor and chunk object of the commit-log segments, whole, in key order."""
    objects = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for item in page.get("Contents", []):
            key, size = item["Key"], int(item["Size"])
            name = key.rpartition("/")[2]
            wanted = name == DESCRIPTOR_NAME or parse_chunk_name(name) is not None
            if wanted and size > 0 and FETCHED_FOLDER in key:
                objects.append(RangedGet(key, 0, size))
    return sorted(objects, key=lambda r: r.key)


class SealedRead:
    """One archived hot store in its own bucket (sealed or not): our read of it and the raw GETs of its stored
    objects."""

    def __init__(self, s3: MotoServer, hot: HotData, queues: Sequence[tuple[str, int]], config: TieredStoreConfig):
        self.s3 = s3
        self.hot = hot
        self.queues = queues
        self.config = config
        bucket = config.effective_cold_url.removeprefix("s3://").partition("/")[0]
        self.client = s3_client(s3.client_options(), max_pool_connections=1)
        self.objects = framed_objects(self.client, bucket)
        self.bucket = bucket

    @property
    def stored_bytes(self) -> int:
        return sum(o.length for o in self.objects)

    @property
    def first_chunk_bytes(self) -> int:
        """Bytes of every segment's first chunk: what the reader GETs twice when it opens a framed segment."""
        return sum(o.length for o in self.objects if o.key.endswith(f"/{FIRST_CHUNK}"))

    def ours(self, _: Path) -> Measurement:
        return measured_read(self.s3, self.config, self.queues, expected=self.hot.messages, moved=self.stored_bytes)

    def raw(self, _: Path) -> Measurement:
        fetched = raw_s3_ranged_get(self.client, self.bucket, self.objects, concurrency=1, items=self.hot.messages)
        return Measurement(seconds=fetched.seconds, items=self.hot.messages, bytes=fetched.bytes, extras=fetched.extras)


@benchmark(
    "cold_read_s3_sealed",
    title="Sequential cold read from S3 of zstd + AES-256-GCM segments vs raw GETs of the same stored objects",
    issue=33,
    summary=(
        f"Segments archived with zstd (default level) and AES-256-GCM to a moto S3 server in its own process, read "
        f"back queue by queue with `get_messages(..., {BATCH})` under `ReadPolicy.FORCE` from a fresh store, beside "
        "one raw `get_object`, one at a time, of every stored object that read fetches (each commit-log "
        "segment's descriptor and chunks, whole): the same stored bytes in the same request sizes. On "
        f"`cold_read_s3`'s {BODY_BYTES} B random bodies over {QUEUES} queues (a few distinct bodies in turn), on "
        "the same with every body unique (incompressible) and on the demo's JSON messages."
    ),
)
def cold_read_s3_sealed(ctx: BenchmarkContext) -> None:
    _measure(ctx)
    ctx.note(
        "MB/s counts stored bytes on both sides (what crossed the wire); ours' `logical_bytes_read` is what it "
        "returned. Ours' GET count comes from the moto server's log, the baseline's is one per stored object. "
        "cpu_us_per_message is the reading "
        "process's own CPU (decompressing and decrypting included; the moto server's is not in it)."
    )


def _measure(ctx: BenchmarkContext) -> None:
    messages = ctx.scale(full=FULL_MESSAGES, quick=640)
    queues = ctx.scale(full=QUEUES, quick=4)
    fill = functools.partial(fill_hot_store, messages=messages, queues=queues, body_bytes=BODY_BYTES)
    topic_queues = [(TOPIC, queue_id) for queue_id in range(queues)]
    workloads = (
        ("cold_read_s3's messages", fill(ctx.work_dir / "repeating"), topic_queues),
        (
            "unique random bodies",
            fill(ctx.work_dir / "unique", unique_bodies=True),
            topic_queues,
        ),
        ("demo JSON messages", fill_demo_hot_store(ctx.work_dir / "demo", messages=messages), list(DEMO_QUEUES)),
    )
    with MotoServer(ctx.work_dir / "moto") as s3:
        reads: list[tuple[str, SealedRead]] = []
        plain_reads: list[tuple[str, SealedRead]] = []
        for number, (name, hot, topic_queues) in enumerate(workloads):
            for sealed, kept in ((True, reads), (False, plain_reads)):
                bucket = s3.create_bucket(f"{'sealed' if sealed else 'plain'}-{number}")
                config = config_for(
                    hot.data_dir,
                    cold_url=f"s3://{bucket}/archive",
                    # Each archive its own metadata: the plain side's keyring holds no key of the sealed side's.
                    metadata_url=f"sqlite:///{ctx.work_dir / bucket}.db",
                    s3=s3,
                    queues=len(topic_queues),
                    codecs=codec_sections(ctx.work_dir, compression=sealed, encrypt=sealed),
                )
                archive(config, with_index=False, expected=messages)
                kept.append((name, SealedRead(s3, hot, topic_queues, config)))
        ctx.parameter(
            messages=messages,
            batch=BATCH,
            **{
                what: {name: value(read) for name, read in reads}
                for what, value in (
                    ("queues", lambda read: len(read.queues)),
                    ("record_mib", lambda read: round(read.hot.record_bytes / (1 << 20), 1)),
                    ("stored_mib", lambda read: round(read.stored_bytes / (1 << 20), 2)),
                    ("stored_objects", lambda read: len(read.objects)),
                    ("first_chunks_mib", lambda read: round(read.first_chunk_bytes / (1 << 20), 2)),
                )
            },
        )
        for (name, read), (_, plain) in zip(reads, plain_reads, strict=True):
            description = f"{messages:,} messages, {len(read.queues)} queues one after another, batches of {BATCH}"
            ours = Contender(f"get_messages x{BATCH}, FORCE, fresh store", read.ours)
            ctx.compare(
                f"sealed read, {name}",
                description=description,
                baseline=Contender("raw get_object per stored object, one at a time", read.raw),
                ours=ours,
                unit="msg",
                target=Target.at_least(0.6, "≥ 0.6 (60% of raw GETs)"),
            )
            ctx.compare(
                f"sealed read vs the same read uncompressed, {name}",
                description=f"{description}; where the sealed read's time goes",
                baseline=Contender(f"get_messages x{BATCH}, FORCE, fresh store, uncompressed segments", plain.ours),
                ours=ours,
                unit="msg",
            )
