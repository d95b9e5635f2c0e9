"""fsspec provider behaviour beyond the conformance suite: conditional creates, interop with S3, schemes."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.backends import s3fs_options
from tests.fixtures.s3 import S3Server
from tieredstore.errors import CommitConflictError, ConfigError, MissingExtraError, StorageUnavailableError
from tieredstore.formats.naming import FileType, queue_path
from tieredstore.providers.fsspec import FsspecProvider
from tieredstore.providers.s3 import S3Provider

QUEUE = queue_path("DefaultCluster", "broker-a", "TopicTest", 0)


async def test_s3fs_creates_chunks_conditionally(s3_server: S3Server, s3_bucket: str) -> None:
    provider = FsspecProvider(f"s3a://{s3_bucket}/archive", **s3fs_options(s3_server))
    try:
        assert provider.store.is_async and provider.store.conditional_create
        assert await provider.store.put_if_absent("k/chunk", b"first")
        assert not await provider.store.put_if_absent("k/chunk", b"second")
        assert await provider.store.get_range("k/chunk", 0, 100) == b"first"
    finally:
        await provider.close()


async def test_same_chunk_layout_as_the_s3_provider(
    s3_server: S3Server, s3_bucket: str, s3_bucket_url: str, s3_options: dict[str, Any]
) -> None:
    async with S3Provider(s3_bucket_url, **s3_options) as s3:
        segment = s3.segment(FileType.COMMIT_LOG, QUEUE, 0)
        for part in (b"written ", b"by ", b"aiobotocore"):
            segment.append(part)
            await segment.commit()
    generic = FsspecProvider(f"s3a://{s3_bucket}/archive", **s3fs_options(s3_server))
    try:
        again = generic.segment(FileType.COMMIT_LOG, QUEUE, 0)
        assert await again.correct_commit_position() == 22
        assert await again.read(0, 22) == b"written by aiobotocore"
        again.append(b", read by s3fs")
        await again.commit()
    finally:
        await generic.close()
    async with S3Provider(s3_bucket_url, **s3_options) as s3:
        assert await s3.segment(FileType.COMMIT_LOG, QUEUE, 0, commit_position=36).read(0, 36) == (
            b"written by aiobotocore, read by s3fs"
        )


async def test_local_chunks_use_exclusive_create(tmp_path: Path) -> None:
    provider = FsspecProvider(f"local://{tmp_path}")
    assert not provider.store.is_async and provider.store.conditional_create
    segment = provider.segment(FileType.CONSUME_QUEUE, QUEUE, 0)
    segment.append(b"one")
    await segment.commit()
    chunk = tmp_path / QUEUE / "CONSUME_QUEUE" / "cfcd208400000000000000000000" / ("0" * 20)
    assert chunk.read_bytes() == b"one"
    chunk.write_bytes(b"two")  # another writer got there first
    stale = provider.segment(FileType.CONSUME_QUEUE, QUEUE, 0)
    stale.append(b"one")
    with pytest.raises(CommitConflictError):
        await stale.commit()
    assert chunk.read_bytes() == b"two"


async def test_fsspec_memory_filesystem_works_end_to_end() -> None:
    provider = FsspecProvider("memory://tieredstore-fsspec-test")
    segment = provider.segment(FileType.INDEX, QUEUE, 7)
    segment.append(b"index bytes")
    await segment.commit()
    assert await provider.list_segments(QUEUE, FileType.INDEX) == [7]
    await segment.destroy()
    assert await provider.list_segments(QUEUE, FileType.INDEX) == []


def test_unknown_or_uninstalled_schemes_are_typed_errors() -> None:
    with pytest.raises(ConfigError):
        FsspecProvider("nosuchscheme://bucket/x")
    with pytest.raises(MissingExtraError, match="gcsfs"):
        FsspecProvider("gs://bucket/x")
    with pytest.raises(ConfigError):
        FsspecProvider("ftp://user:password@host/x")


async def test_a_url_naming_a_server_connects_to_that_server() -> None:
    """ftp://HOST:PORT/PATH: the host and port are the filesystem's to connect to, the path the root on it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens here once the socket closes
    provider = FsspecProvider(f"ftp://127.0.0.1:{port}/archive/")
    assert provider.url == f"ftp://127.0.0.1:{port}/archive"
    assert provider.store.root == "/archive"
    with pytest.raises(StorageUnavailableError, match=f"connect ftp://127.0.0.1:{port}/archive: errno 111"):
        await provider.list_segments(QUEUE, FileType.COMMIT_LOG)


def test_storage_options_stay_out_of_repr(s3_server: S3Server) -> None:
    provider = FsspecProvider("s3a://bucket/prefix", **s3fs_options(s3_server))
    assert s3_server.secret_access_key not in repr(provider)
    assert provider.url == "s3a://bucket/prefix"
