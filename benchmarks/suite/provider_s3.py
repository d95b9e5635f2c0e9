"""S3 provider throughput: chunk commits and ranged reads through S3Provider beside raw boto3 PUTs and GETs.

The bottom of the archive-to-S3 and cold-read stacks: whatever the archiver and the fetcher cost above
this, they cannot beat it. Both sides move the same 4 MiB pieces at the same concurrency against one moto
server running in its own process; ours commits each piece as a conditional-create chunk of a segment
(one segment per writer, as one queue's commit log is) and reads each back with the segment's ranged read.

Like with like: both sides send a CRC32 with every PUT (raw boto3 through botocore's default "when_supported"
checksumming, ours computed by the provider), both verify the stored CRC32 of every whole-object GET, and
both sign each PUT body's SHA-256, which botocore does on plain http endpoints such as this moto server
(over https neither would). Raw boto3 does this work in its eight threads; the provider does the CRC32s in
worker threads and the SHA-256 on its event loop.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from pathlib import Path

from benchmarks.baselines import OBJECT_SIZE, RangedGet, raw_s3_put, raw_s3_ranged_get, s3_client, split_objects
from benchmarks.harness import BenchmarkContext, Contender, Measurement, Target, benchmark, stopwatch
from benchmarks.services import S3_CREDENTIALS, S3_REGION, MotoServer
from tieredstore.formats.naming import FileType
from tieredstore.providers.base import FileSegment
from tieredstore.providers.s3 import S3Options, S3Provider

BUCKET = "tieredstore-bench"
CONCURRENCY = 8


def _provider(endpoint_url: str, prefix: str) -> S3Provider:
    options = S3Options(
        endpoint_url=endpoint_url,
        region=S3_REGION,
        access_key_id=S3_CREDENTIALS["aws_access_key_id"],
        secret_access_key=S3_CREDENTIALS["aws_secret_access_key"],
        addressing_style="path",
    )
    return S3Provider(f"s3://{BUCKET}/{prefix}", options)


def _writer_shares(objects: Sequence[memoryview], writers: int) -> list[list[memoryview]]:
    return [list(objects[writer::writers]) for writer in range(writers)]


async def _warm_up(provider: S3Provider) -> None:
    """Create the client and open a connection outside the timed region, as the raw side's client already is."""
    await provider.list_segments("warm-up", FileType.COMMIT_LOG)


async def _commit_chunks(endpoint_url: str, prefix: str, objects: Sequence[memoryview]) -> float:
    """Commit every piece as the next chunk of one of CONCURRENCY segments; the seconds it took."""
    provider = _provider(endpoint_url, prefix)
    try:
        segments = [provider.segment(FileType.COMMIT_LOG, f"queue{w}", 0) for w in range(CONCURRENCY)]
        await _warm_up(provider)

        async def write(segment: FileSegment, pieces: list[memoryview]) -> None:
            for piece in pieces:
                segment.append(bytes(piece))
                await segment.commit()

        with stopwatch() as elapsed:
            await asyncio.gather(
                *(write(s, p) for s, p in zip(segments, _writer_shares(objects, CONCURRENCY), strict=True))
            )
        return elapsed()
    finally:
        await provider.close()


async def _read_chunks(endpoint_url: str, prefix: str, objects: Sequence[memoryview]) -> tuple[float, int]:
    """Read back what ``_commit_chunks`` wrote, piece by piece with ranged reads, CONCURRENCY segments at once."""
    provider = _provider(endpoint_url, prefix)
    try:
        shares = _writer_shares(objects, CONCURRENCY)
        segments = [
            provider.segment(FileType.COMMIT_LOG, f"queue{w}", 0, commit_position=sum(len(p) for p in shares[w]))
            for w in range(CONCURRENCY)
        ]

        await _warm_up(provider)

        async def read(segment: FileSegment, pieces: list[memoryview]) -> int:
            position = received = 0
            for piece in pieces:
                received += len(await segment.read(position, len(piece)))
                position += len(piece)
            return received

        with stopwatch() as elapsed:
            received = sum(await asyncio.gather(*(read(s, p) for s, p in zip(segments, shares, strict=True))))
        return elapsed(), received
    finally:
        await provider.close()


@benchmark(
    "provider_s3",
    title="S3 provider: chunk commits and ranged reads vs raw boto3",
    issue=2,
    summary=(
        f"{OBJECT_SIZE >> 20} MiB pieces to and from a moto S3 server in its own process, {CONCURRENCY} at a time: "
        "`S3Provider` segment commits (conditional-create chunks) beside raw `put_object`, and segment reads "
        "beside raw ranged `get_object` of the same bytes."
    ),
)
def provider_s3(ctx: BenchmarkContext) -> None:
    total = ctx.scale(full=256 << 20, quick=8 << 20)
    data = os.urandom(total)
    objects = split_objects(data)
    ctx.parameter(object_bytes=OBJECT_SIZE, objects=len(objects), total_mib=total >> 20, concurrency=CONCURRENCY)
    with MotoServer(ctx.work_dir) as s3:
        s3.create_bucket(BUCKET)
        client = s3_client(s3.client_options(), max_pool_connections=CONCURRENCY)
        # Reads need something written: each side reads what the same round's write side stored.
        written_raw: list[str] = []
        written_ours: list[str] = []

        def raw_put(directory: Path) -> Measurement:
            prefix = f"raw/{directory.name}"
            written_raw.append(prefix)
            return raw_s3_put(client, BUCKET, objects, key_prefix=prefix, concurrency=CONCURRENCY)

        def ours_put(directory: Path) -> Measurement:
            prefix = f"ours/{directory.name}"
            written_ours.append(prefix)
            seconds = asyncio.run(_commit_chunks(s3.endpoint_url, prefix, objects))
            return Measurement(seconds=seconds, items=len(objects), bytes=total)

        ctx.compare(
            "PUT",
            description=f"{len(objects)} x {OBJECT_SIZE >> 20} MiB, {CONCURRENCY} writers",
            baseline=Contender("boto3 put_object, threads", raw_put),
            ours=Contender("S3Provider segment commit", ours_put),
            unit="object",
            target=Target.at_least(0.8, ">= 0.8 (what the archiver's 80%-of-raw target rests on)"),
        )

        def raw_get(_: Path) -> Measurement:
            prefix = written_raw[0]
            ranges = [RangedGet(f"{prefix}/{i:020d}", 0, len(o)) for i, o in enumerate(objects)]
            return raw_s3_ranged_get(client, BUCKET, ranges, concurrency=CONCURRENCY)

        def ours_get(_: Path) -> Measurement:
            seconds, received = asyncio.run(_read_chunks(s3.endpoint_url, written_ours[0], objects))
            if received != total:
                raise RuntimeError(f"S3Provider read back {received} bytes of {total}")
            return Measurement(seconds=seconds, items=len(objects), bytes=received)

        ctx.compare(
            "ranged GET",
            description=f"{len(objects)} x {OBJECT_SIZE >> 20} MiB, {CONCURRENCY} readers",
            baseline=Contender("boto3 ranged get_object, threads", raw_get),
            ours=Contender("S3Provider segment read", ours_get),
            unit="object",
            target=Target.at_least(0.6, ">= 0.6 (what the cold-read 60%-of-raw target rests on)"),
        )
