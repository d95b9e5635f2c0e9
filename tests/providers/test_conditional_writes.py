"""Conditional writes checked, not assumed: the probe before writing, and storage that ignores If-None-Match.

The endpoint that ignores the header is moto behind the fault proxy, which strips ``If-None-Match`` from
every request on the way (a real S3-compatible server that accepts the header and ignores it behaves so).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.fixtures.backends import s3fs_options
from tests.fixtures.faultproxy import FaultProxy, FaultRule
from tests.fixtures.s3 import S3Server
from tieredstore.errors import (
    CommitConflictError,
    ConditionalWritesUnsupportedError,
    ConfigError,
    StorageError,
    StorageUnavailableError,
)
from tieredstore.formats.naming import FileType, queue_path, segment_key
from tieredstore.providers.chunks import PROBE_FOLDER
from tieredstore.providers.fsspec import FsspecProvider
from tieredstore.providers.s3 import S3Options, S3Provider

QUEUE = queue_path("DefaultCluster", "broker-a", "TopicTest", 0)


def stored_keys(s3_server: S3Server, bucket: str) -> list[str]:
    return [item["Key"] for item in s3_server.client().list_objects_v2(Bucket=bucket).get("Contents", [])]


@pytest.fixture
async def ignoring(s3_server: S3Server) -> AsyncIterator[FaultProxy]:
    """An endpoint that accepts If-None-Match and ignores it."""
    async with FaultProxy(s3_server.endpoint_url).running() as proxy:
        proxy.strip_request_headers = frozenset({"if-none-match"})
        yield proxy


async def test_moto_honours_if_none_match_so_the_probe_passes_once_and_leaves_nothing(
    s3_server: S3Server, s3_bucket: str, s3_bucket_url: str, s3_options: dict[str, Any]
) -> None:
    async with S3Provider(s3_bucket_url, **s3_options) as provider:
        assert await provider.check_conditional_writes() is True
        assert await provider.check_conditional_writes() is False  # known for this provider: not asked again
    assert stored_keys(s3_server, s3_bucket) == []


async def test_an_endpoint_that_ignores_if_none_match_is_refused_and_the_probe_key_is_gone(
    ignoring: FaultProxy, s3_server: S3Server, s3_bucket: str, s3_bucket_url: str, s3_options: dict[str, Any]
) -> None:
    async with S3Provider(s3_bucket_url, **{**s3_options, "endpoint_url": ignoring.endpoint_url}) as provider:
        with pytest.raises(ConditionalWritesUnsupportedError) as refused:
            await provider.check_conditional_writes()
        assert isinstance(refused.value, StorageError)
        message = str(refused.value)
        assert "\n" not in message
        assert 's3.conditional_writes = "unsupported"' in message
        assert "If-None-Match" in message and "replaced it instead of being refused" in message
        with pytest.raises(ConditionalWritesUnsupportedError):
            await provider.check_conditional_writes()  # a refusal is not remembered as a pass
    puts = [path for method, path in ignoring.requests if method == "PUT"]
    assert len(puts) == 4 and all(f"/archive/{PROBE_FOLDER}/" in path for path in puts)
    assert stored_keys(s3_server, s3_bucket) == []


async def test_a_lost_reply_to_the_probe_is_not_taken_for_an_endpoint_that_ignores_the_header(
    s3_server: S3Server, s3_bucket: str, s3_bucket_url: str, s3_options: dict[str, Any]
) -> None:
    async with FaultProxy(s3_server.endpoint_url).running() as proxy:
        # The first create lands and its reply is lost: the retry is refused with 412 by its own object.
        proxy.fail(FaultRule("PUT", 500, "InternalError", path_contains=PROBE_FOLDER, after_forwarding=True))
        options = {**s3_options, "endpoint_url": proxy.endpoint_url, "retry_initial_delay": 0.001}
        async with S3Provider(s3_bucket_url, **options) as provider:
            assert await provider.check_conditional_writes() is True
        assert proxy.count("PUT") == 3
    assert stored_keys(s3_server, s3_bucket) == []


async def test_storage_unreachable_at_the_check_is_checked_before_the_first_write(
    ignoring: FaultProxy, s3_server: S3Server, s3_bucket: str, s3_bucket_url: str, s3_options: dict[str, Any]
) -> None:
    options = {**s3_options, "endpoint_url": ignoring.endpoint_url, "max_attempts": 2, "retry_initial_delay": 0.001}
    async with S3Provider(s3_bucket_url, **options) as provider:
        with ignoring.outage(), pytest.raises(StorageUnavailableError):
            await provider.check_conditional_writes()
        segment = provider.segment(FileType.COMMIT_LOG, QUEUE, 0)
        segment.append(b"never archived")
        for _ in range(2):  # refused at every commit, never written
            with pytest.raises(ConditionalWritesUnsupportedError):
                await segment.commit()
        assert (segment.commit_position, segment.pending_bytes) == (0, len(b"never archived"))
    assert stored_keys(s3_server, s3_bucket) == []


async def test_a_check_deferred_by_an_outage_passes_once_before_the_first_write(
    s3_server: S3Server, s3_bucket: str, s3_bucket_url: str, s3_options: dict[str, Any]
) -> None:
    async with FaultProxy(s3_server.endpoint_url).running() as proxy:
        options = {**s3_options, "endpoint_url": proxy.endpoint_url, "max_attempts": 2, "retry_initial_delay": 0.001}
        async with S3Provider(s3_bucket_url, **options) as provider:
            with proxy.outage(), pytest.raises(StorageUnavailableError):
                await provider.check_conditional_writes()
            segment = provider.segment(FileType.COMMIT_LOG, QUEUE, 0)
            for part in (b"archived ", b"after the outage"):
                segment.append(part)
                await segment.commit()
            assert await segment.read(0, 100) == b"archived after the outage"
        puts = [path for method, path in proxy.requests if method == "PUT"]
        assert len(puts) == 4 and all(PROBE_FOLDER in path for path in puts[:2])  # probed once, first
    assert [key.rsplit("/", 1)[-1] for key in stored_keys(s3_server, s3_bucket)] == [f"{0:020d}", f"{9:020d}"]


async def test_s3fs_is_probed_like_the_s3_provider(ignoring: FaultProxy, s3_server: S3Server, s3_bucket: str) -> None:
    honest = FsspecProvider(f"s3a://{s3_bucket}/archive", **s3fs_options(s3_server))
    stripped = FsspecProvider(
        f"s3a://{s3_bucket}/archive", **{**s3fs_options(s3_server), "endpoint_url": ignoring.endpoint_url}
    )
    try:
        assert await honest.check_conditional_writes() is True
        with pytest.raises(ConditionalWritesUnsupportedError):
            await stripped.check_conditional_writes()
    finally:
        await honest.close()
        await stripped.close()
    assert stored_keys(s3_server, s3_bucket) == []


async def test_unsupported_writes_plain_puts_without_probing_and_reads_each_chunk_back(
    ignoring: FaultProxy, s3_bucket_url: str, s3_options: dict[str, Any]
) -> None:
    options = {**s3_options, "endpoint_url": ignoring.endpoint_url, "conditional_writes": "unsupported"}
    async with S3Provider(s3_bucket_url, **options) as provider:
        assert await provider.check_conditional_writes() is False
        segment = provider.segment(FileType.COMMIT_LOG, QUEUE, 0)
        for part in (b"first chunk", b", second chunk"):
            segment.append(part)
            await segment.commit()
        assert await segment.read(0, 100) == b"first chunk, second chunk"
    chunks = segment_key(QUEUE, FileType.COMMIT_LOG, 0)
    puts = [path for method, path in ignoring.requests if method == "PUT" and chunks in path]
    reads = [path for method, path in ignoring.requests if method == "GET" and chunks in path]
    assert len(puts) == 2  # no probe: a plain PUT per chunk
    assert len(reads) >= 2  # each chunk read back after it was written


class _ReplacedAfterWrite(S3Provider):
    """Another writer replaces each chunk right after ours lands: what a zombie can do without conditional writes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        store = self.store
        put = store.put

        async def put_then_replaced(key: str, data: bytes | bytearray, *, file_type: FileType | None = None) -> None:
            await put(key, data, file_type=file_type)
            await put(key, b"the other writer's bytes", file_type=file_type)

        store.put = put_then_replaced  # type: ignore[method-assign]


async def test_unsupported_detects_a_chunk_replaced_behind_our_back(
    s3_bucket_url: str, s3_options: dict[str, Any]
) -> None:
    async with _ReplacedAfterWrite(s3_bucket_url, **s3_options, conditional_writes="unsupported") as provider:
        segment = provider.segment(FileType.COMMIT_LOG, QUEUE, 0)
        segment.append(b"our archived bytes")
        with pytest.raises(CommitConflictError, match="another writer replaced it"):
            await segment.commit()
        assert segment.commit_position == 0 and segment.pending_bytes == len(b"our archived bytes")


def test_conditional_writes_setting_is_checked() -> None:
    assert S3Options(conditional_writes="unsupported").conditional_writes == "unsupported"
    with pytest.raises(ConfigError, match="required or unsupported"):
        S3Options(conditional_writes="sometimes")  # type: ignore[arg-type]
    assert S3Options.from_query("conditional_writes=unsupported").conditional_writes == "unsupported"
