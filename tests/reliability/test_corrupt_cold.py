"""Corrupt cold data: one flipped bit in a committed commit-log chunk is found, located and never served.

The bit is flipped where storage keeps it (the POSIX file, or the S3 chunk object rewritten behind
the provider's back on the moto server). Reading the record back through the container layer and
the record codec is a CorruptRecordError naming the offset; the archive checker reports it at its
queue offset and commit-log offset; ``tieredstore read --tier cold`` exits 5 (integrity) with one
line. ``verify --deep`` and the fetcher have their own tests (tests/cli, tests/read).
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.s3 import S3Server
from tests.reliability.workload import append_records
from tieredstore.cli import main
from tieredstore.cli.app import EXIT_INTEGRITY
from tieredstore.errors import CorruptRecordError
from tieredstore.flat import FlatFileStore, ProblemKind, check_queue_invariant
from tieredstore.formats.message import decode
from tieredstore.formats.naming import FileType, segment_key
from tieredstore.metadata import MetadataStore
from tieredstore.providers.base import Provider
from tieredstore.providers.posix import PosixProvider
from tieredstore.providers.s3 import S3Provider

pytestmark = pytest.mark.reliability

TOPIC = "CorruptCold"
COUNT = 200
DAMAGED = 137  # the queue offset whose body gets the flipped bit


def flip_body_bit(raw: bytes, record_start: int) -> bytes:
    """``raw`` with one bit of the record at ``record_start`` flipped inside its body."""
    body_start = record_start + 88  # IPv4 hosts: the body follows BODYLEN at offset 84
    out = bytearray(raw)
    out[body_start + 3] ^= 0x10
    return bytes(out)


async def archive(provider: Provider, metadata: MetadataStore) -> tuple[FlatFileStore, dict[int, bytes], int]:
    """COUNT records in one commit-log segment; returns the store, the hot copies and where DAMAGED starts."""
    store = FlatFileStore(provider, metadata, cluster="DefaultCluster", broker="broker-a")
    queue = await store.get_or_create(TOPIC, 0)
    reference = await append_records(queue, 0, COUNT)
    assert await queue.commit() == COUNT
    unit = (await queue.read_units(DAMAGED, 1))[0]
    return store, reference, unit.commitlog_offset


async def assert_found_and_never_served(store: FlatFileStore, reference: dict[int, bytes], damaged_at: int) -> None:
    queue = store.get(TOPIC, 0)
    served = await queue.read_messages(DAMAGED - 2, 5)
    decoded = [decode(raw, location=queue.path) for raw in served[:2]]
    assert [record.queue_offset for record in decoded] == [DAMAGED - 2, DAMAGED - 1]
    with pytest.raises(CorruptRecordError, match="body CRC mismatch") as refused:
        decode(served[2], location=queue.path)
    assert refused.value.location == queue.path
    problems = await check_queue_invariant(queue, reference=reference)
    kinds = {(p.kind, p.queue_offset, p.commitlog_offset) for p in problems}
    assert (ProblemKind.CORRUPT_RECORD, DAMAGED, damaged_at) in kinds
    assert {p.queue_offset for p in problems} == {DAMAGED}  # nothing else is blamed


async def test_a_flipped_bit_in_a_posix_commit_log_is_found_and_not_served(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with MetadataStore.open(f"sqlite:///{data_dir / 'metadata.db'}") as metadata:
        provider = PosixProvider(str(data_dir / "cold"))
        store, reference, damaged_at = await archive(provider, metadata)
        path = store.queue_path(TOPIC, 0)
        file = data_dir / "cold" / segment_key(path, FileType.COMMIT_LOG, 0)
        file.write_bytes(flip_body_bit(file.read_bytes(), damaged_at))
        await assert_found_and_never_served(store, reference, damaged_at)


def test_the_cli_refuses_to_print_a_corrupt_cold_record(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data_dir = tmp_path / "data"
    with MetadataStore.open(f"sqlite:///{data_dir / 'metadata.db'}") as metadata:
        store, _, damaged_at = asyncio.run(archive(PosixProvider(str(data_dir / "cold")), metadata))
        file = data_dir / "cold" / segment_key(store.queue_path(TOPIC, 0), FileType.COMMIT_LOG, 0)
        file.write_bytes(flip_body_bit(file.read_bytes(), damaged_at))
    argv = ["--data-dir", str(data_dir), "--output", "json", "read", TOPIC, "0", "--tier", "cold"]
    assert main([*argv, "--offset", str(DAMAGED - 3), "--count", "3"]) == 0  # the records before it are fine
    capsys.readouterr()
    assert main([*argv, "--offset", str(DAMAGED - 1), "--count", "5"]) == EXIT_INTEGRITY
    captured = capsys.readouterr()
    assert captured.err.startswith("tieredstore: error: ") and "\n" not in captured.err.strip()
    assert "CRC" in captured.err
    assert f'"queue_offset": {DAMAGED}' not in captured.out  # the corrupt record was never printed


async def test_a_flipped_bit_in_an_s3_chunk_is_found_and_not_served(
    tmp_path: Path, s3_server: S3Server, s3_bucket: str, s3_options: dict[str, Any]
) -> None:
    prefix = f"archive-{uuid.uuid4().hex[:8]}"
    with MetadataStore.open(f"sqlite:///{tmp_path / 'metadata.db'}") as metadata:
        async with S3Provider(f"s3://{s3_bucket}/{prefix}", **s3_options) as provider:
            store, reference, damaged_at = await archive(provider, metadata)
            client = s3_server.client()
            key = f"{prefix}/{segment_key(store.queue_path(TOPIC, 0), FileType.COMMIT_LOG, 0)}/{0:020d}"
            stored = client.get_object(Bucket=s3_bucket, Key=key)["Body"].read()
            client.put_object(Bucket=s3_bucket, Key=key, Body=flip_body_bit(stored, damaged_at))
            await assert_found_and_never_served(store, reference, damaged_at)
