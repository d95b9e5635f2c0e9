"""S3 provider behaviour beyond the conformance suite: encryption, secrets, retries, 412 resolution, options."""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.fixtures.faultproxy import FaultProxy, FaultRule, HangRule
from tests.fixtures.s3 import S3Server
from tieredstore.errors import (
    CommitConflictError,
    ConfigError,
    MissingExtraError,
    PathEscapeError,
    SizeUnknownError,
    StorageAccessError,
    StorageUnavailableError,
)
from tieredstore.formats.naming import FileType, segment_key
from tieredstore.providers.registry import open_provider
from tieredstore.providers.s3 import S3Options, S3Provider

QUEUE = "c1_cluster/broker-a/TopicTest/0"
SECRET = "wJalrXUtnFEMI-very-secret-value"
ACCESS_KEY = "AKIA-DISTINCTIVE-KEY-ID"
FAST_RETRIES = {"retry_initial_delay": 0.001, "retry_max_delay": 0.01}


def chunk_key(start: int) -> str:
    return f"archive/{segment_key(QUEUE, FileType.COMMIT_LOG, 0)}/{start:020d}"


@pytest.fixture
async def proxy(s3_server: S3Server) -> AsyncIterator[FaultProxy]:
    async with FaultProxy(s3_server.endpoint_url).running() as running:
        yield running


@pytest.fixture
async def proxied(proxy: FaultProxy, s3_bucket_url: str, s3_options: dict[str, Any]) -> AsyncIterator[S3Provider]:
    options = {**s3_options, "endpoint_url": proxy.endpoint_url, "max_attempts": 3, **FAST_RETRIES}
    provider = S3Provider(s3_bucket_url, **options)
    yield provider
    await provider.close()


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"sse": "AES256"}, {"ServerSideEncryption": "AES256"}),
        (
            {"sse": "aws:kms", "sse_kms_key_id": "alias/tieredstore"},
            {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": "alias/tieredstore"},
        ),
    ],
)
async def test_server_side_encryption_reaches_the_server(
    s3_server: S3Server,
    s3_bucket: str,
    s3_bucket_url: str,
    s3_options: dict[str, Any],
    options: dict[str, str],
    expected: dict[str, str],
) -> None:
    async with S3Provider(s3_bucket_url, **s3_options, **options) as provider:
        segment = provider.segment(FileType.COMMIT_LOG, QUEUE, 0)
        segment.append(b"encrypted at rest")
        await segment.commit()
        assert await segment.read(0, 100) == b"encrypted at rest"
    head = s3_server.client().head_object(Bucket=s3_bucket, Key=chunk_key(0))
    assert {name: head.get(name) for name in expected} == expected


async def test_credentials_never_appear_in_repr_errors_or_logs(
    proxy: FaultProxy, s3_bucket_url: str, s3_server: S3Server, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="tieredstore")
    options = S3Options(
        endpoint_url=proxy.endpoint_url,
        region=s3_server.region,
        access_key_id=ACCESS_KEY,
        secret_access_key=SECRET,
        session_token="session-token-value",
        max_attempts=2,
        **FAST_RETRIES,
    )
    proxy.fail(FaultRule("PUT", 503, "SlowDown", times=1))
    proxy.fail(FaultRule("GET", 403, "AccessDenied", times=1))
    async with S3Provider(s3_bucket_url, options) as provider:
        segment = provider.segment(FileType.COMMIT_LOG, QUEUE, 0)
        segment.append(b"data")
        await segment.commit()  # one retried SlowDown, logged
        with pytest.raises(StorageAccessError) as refused:
            await provider.list_segments(QUEUE, FileType.COMMIT_LOG)
        shown = [repr(provider), str(provider), provider.url, repr(options), str(options), segment.key]
        shown += [str(refused.value), repr(refused.value), caplog.text]
    assert "SlowDown" in caplog.text  # the retry was logged...
    for text in shown:
        for secret in (SECRET, ACCESS_KEY, "session-token-value"):
            assert secret not in text  # ...without any credential


async def test_throttling_and_5xx_are_retried_then_succeed(proxied: S3Provider, proxy: FaultProxy) -> None:
    proxy.fail(FaultRule("PUT", 503, "SlowDown", times=1))
    proxy.fail(FaultRule("GET", 500, "InternalError", times=1))
    segment = proxied.segment(FileType.COMMIT_LOG, QUEUE, 0)
    segment.append(b"survives")
    await segment.commit()
    assert proxy.count("PUT") == 2
    assert await segment.real_size() == 8  # the LIST (a GET) failed once and was retried


async def test_puts_waiting_on_the_network_leave_the_event_loops_threads_free(
    proxied: S3Provider, proxy: FaultProxy
) -> None:
    await proxied.prepare()
    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(max_workers=2))
    held = proxy.hang(HangRule("PUT", times=4))
    store = proxied.store
    puts = [asyncio.create_task(store.put(f"held/{number}", b"body")) for number in range(4)]
    try:
        deadline = loop.time() + 10
        while proxy.count("PUT") < 4:  # more transfers in flight than the loop's default executor has threads
            assert loop.time() < deadline, f"only {proxy.count('PUT')} of 4 PUTs reached the server"
            await asyncio.sleep(0.01)
        # ...and blocking work handed to the loop's executor (metadata, hot reads) still runs meanwhile.
        assert await asyncio.wait_for(asyncio.to_thread(lambda: "ran"), timeout=5) == "ran"
    finally:
        held.release()
    await asyncio.gather(*puts)
    assert len(await store.list_files("held")) == 4


async def test_retries_are_bounded_then_storage_unavailable(proxied: S3Provider, proxy: FaultProxy) -> None:
    proxy.fail(FaultRule("PUT", 503, "SlowDown", times=10))
    segment = proxied.segment(FileType.COMMIT_LOG, QUEUE, 0)
    segment.append(b"kept in the buffer")
    with pytest.raises(StorageUnavailableError):
        await segment.commit()
    assert proxy.count("PUT") == 3  # max_attempts
    assert (segment.commit_position, segment.pending_bytes) == (0, 18)


async def test_access_errors_are_not_retried(proxied: S3Provider, proxy: FaultProxy) -> None:
    proxy.fail(FaultRule("PUT", 403, "AccessDenied", times=10))
    segment = proxied.segment(FileType.COMMIT_LOG, QUEUE, 0)
    segment.append(b"refused")
    with pytest.raises(StorageAccessError):
        await segment.commit()
    assert proxy.count("PUT") == 1
    assert segment.pending_bytes == 7


async def test_a_put_that_landed_but_whose_reply_was_lost_is_resolved_by_412(
    proxied: S3Provider, proxy: FaultProxy, s3_server: S3Server, s3_bucket: str
) -> None:
    proxy.fail(FaultRule("PUT", 500, "InternalError", after_forwarding=True))
    segment = proxied.segment(FileType.COMMIT_LOG, QUEUE, 0)
    segment.append(b"exactly once")
    await segment.commit()  # the retry meets 412, compares, finds our bytes
    assert proxy.count("PUT") == 2
    assert segment.commit_position == 12
    listing = s3_server.client().list_objects_v2(Bucket=s3_bucket, Prefix="archive/")
    assert [item["Key"] for item in listing["Contents"] if not item["Key"].endswith(".created")] == [chunk_key(0)]


async def test_a_reader_going_chunk_by_chunk_makes_one_get_each_and_no_listing(
    proxied: S3Provider, proxy: FaultProxy, s3_bucket_url: str, s3_options: dict[str, Any]
) -> None:
    parts = [bytes([n]) * (1000 + n) for n in range(4)]
    async with S3Provider(s3_bucket_url, **s3_options) as writer:
        writing = writer.segment(FileType.COMMIT_LOG, QUEUE, 0)
        for part in parts:
            writing.append(part)
            await writing.commit()  # one chunk object each
    total = sum(map(len, parts))
    # a reader that knows only the committed size (from metadata), as after a restart
    reader = proxied.segment(FileType.COMMIT_LOG, QUEUE, 0, commit_position=total)
    position, pieces = 0, []
    while piece := await reader.read_from(position, 1 << 20):
        pieces.append(piece)
        position += len(piece)
    assert pieces == parts  # each read ends where its chunk does
    assert proxy.count("GET") == len(parts)  # each chunk read by its name: no listing at all
    # starting inside a chunk, the reader lists once to find it, then reads the rest of that chunk only
    assert await reader.read_from(1500, 1 << 20) == parts[1][500:]
    assert await reader.read_from(2700, 10) == parts[2][699:709]
    listings = [path for method, path in proxy.requests if method == "GET" and "list-type" in path]
    assert len(listings) == 1


async def test_412_with_other_bytes_is_a_conflict_and_overwrites_nothing(
    s3_server: S3Server, s3_bucket: str, s3_bucket_url: str, s3_options: dict[str, Any]
) -> None:
    s3_server.client().put_object(Bucket=s3_bucket, Key=chunk_key(0), Body=b"fenced writer")
    async with S3Provider(s3_bucket_url, **s3_options) as provider:
        segment = provider.segment(FileType.COMMIT_LOG, QUEUE, 0)
        segment.append(b"stale writer!")
        with pytest.raises(CommitConflictError):
            await segment.commit()
        assert segment.pending_bytes == 13
    stored = s3_server.client().get_object(Bucket=s3_bucket, Key=chunk_key(0))["Body"].read()
    assert stored == b"fenced writer"


async def test_size_during_an_outage_is_unknown_not_zero(s3_bucket_url: str, s3_options: dict[str, Any]) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead_port = probe.getsockname()[1]
    options = {**s3_options, "endpoint_url": f"http://127.0.0.1:{dead_port}", "max_attempts": 2, **FAST_RETRIES}
    async with S3Provider(s3_bucket_url, **options) as down:
        segment = down.segment(FileType.COMMIT_LOG, QUEUE, 0)
        with pytest.raises(SizeUnknownError):
            await segment.real_size()
        segment.append(b"waits for the outage to end")
        with pytest.raises(StorageUnavailableError):
            await segment.commit()
        assert segment.pending_bytes == 27
    async with S3Provider(s3_bucket_url, **s3_options) as up:
        assert await up.segment(FileType.COMMIT_LOG, QUEUE, 0).real_size() == 0


async def test_listing_paginates(s3_bucket_url: str, s3_options: dict[str, Any]) -> None:
    async with S3Provider(s3_bucket_url, **s3_options, list_page_size=2) as provider:
        segment = provider.segment(FileType.COMMIT_LOG, QUEUE, 0)
        for part in (b"a", b"bb", b"ccc", b"dddd", b"eeeee"):
            segment.append(part)
            await segment.commit()
        for offset in (100, 200, 300, 400):
            await provider.segment(FileType.COMMIT_LOG, QUEUE, offset).create()
        fresh = provider.segment(FileType.COMMIT_LOG, QUEUE, 0)
        assert await fresh.correct_commit_position() == 15
        assert await fresh.read(0, 15) == b"abbcccddddeeeee"
        assert await provider.list_segments(QUEUE, FileType.COMMIT_LOG) == [0, 100, 200, 300, 400]


async def test_missing_bucket_is_an_access_error(s3_options: dict[str, Any]) -> None:
    async with S3Provider("s3://no-such-bucket-tieredstore/x", **s3_options) as provider:
        with pytest.raises(StorageAccessError, match="NoSuchBucket"):
            await provider.segment(FileType.COMMIT_LOG, QUEUE, 0).real_size()


def test_a_provider_outlives_its_first_event_loop(s3_bucket_url: str, s3_options: dict[str, Any]) -> None:
    provider = S3Provider(s3_bucket_url, **s3_options)

    async def write() -> None:
        segment = provider.segment(FileType.COMMIT_LOG, QUEUE, 0)
        segment.append(b"first loop")
        await segment.commit()

    async def read() -> bytes:
        try:
            return await provider.segment(FileType.COMMIT_LOG, QUEUE, 0, commit_position=10).read(0, 10)
        finally:
            await provider.close()

    asyncio.run(write())
    assert asyncio.run(read()) == b"first loop"


def test_options_from_the_url_query() -> None:
    provider = S3Provider(
        "s3://bucket/some/prefix?region=eu-west-1&addressing_style=path&sse=aws:kms"
        "&sse_kms_key_id=key-1&max_attempts=7&connect_timeout=2.5"
    )
    assert provider.url == "s3://bucket/some/prefix"
    assert (provider.bucket, provider.prefix) == ("bucket", "some/prefix")
    options = provider.options
    assert (options.region, options.addressing_style, options.sse, options.sse_kms_key_id) == (
        "eu-west-1",
        "path",
        "aws:kms",
        "key-1",
    )
    assert (options.max_attempts, options.connect_timeout) == (7, 2.5)


@pytest.mark.parametrize(
    ("url", "options", "error"),
    [
        ("s3://AKIA:secret@bucket/prefix", {}, ConfigError),
        ("s3://bucket/prefix?secret_access_key=x", {}, ConfigError),
        ("s3://bucket/prefix?colour=blue", {}, ConfigError),
        ("s3://bucket/prefix?max_attempts=many", {}, ConfigError),
        ("s3://bucket/prefix", {"sse": "rot13"}, ConfigError),
        ("s3://bucket/prefix", {"sse_kms_key_id": "k"}, ConfigError),
        ("s3://bucket/prefix", {"access_key_id": "only-half"}, ConfigError),
        ("s3:///prefix", {}, ConfigError),
        ("s3://bucket/a/../b", {}, PathEscapeError),
        ("s3://bucket/a//b", {}, PathEscapeError),
    ],
)
def test_bad_urls_and_options_are_refused(url: str, options: dict[str, str], error: type[Exception]) -> None:
    with pytest.raises(error) as refused:
        S3Provider(url, **options)
    assert "secret" not in str(refused.value).replace("secret_access_key", "")


def test_missing_s3_extra_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "aiobotocore", None)
    with pytest.raises(MissingExtraError, match=r"pip install 'tieredstore\[s3\]'"):
        open_provider("s3://bucket/prefix")


async def test_the_first_read_builds_its_client_off_the_event_loop(
    s3_bucket_url: str, s3_options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Other coroutines of an application keep running while the first object read builds its botocore
    client (tens of milliseconds of CPU, made slow here)."""
    async with S3Provider(s3_bucket_url, **s3_options) as writer:
        segment = writer.segment(FileType.COMMIT_LOG, QUEUE, 0)
        segment.append(b"m" * 100)
        await segment.commit()
    build = S3Provider._create_sync_client

    def slow_build(self: S3Provider) -> Any:
        time.sleep(0.3)
        return build(self)

    monkeypatch.setattr(S3Provider, "_create_sync_client", slow_build)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    async with S3Provider(s3_bucket_url, **s3_options) as reader:
        ticking = asyncio.create_task(ticker())
        data = await reader.segment(FileType.COMMIT_LOG, QUEUE, 0, commit_position=100).read(0, 100)
        ticking.cancel()
    assert data == b"m" * 100
    assert ticks >= 10, f"the event loop ran {ticks} times in the 0.3 s the client took to build"


async def test_prepare_builds_the_client_so_the_first_read_does_not(
    s3_bucket_url: str, s3_options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    async with S3Provider(s3_bucket_url, **s3_options) as writer:
        segment = writer.segment(FileType.COMMIT_LOG, QUEUE, 0)
        segment.append(b"p" * 100)
        await segment.commit()
    async with S3Provider(s3_bucket_url, **s3_options) as reader:
        assert reader.created_sync_client is None
        await reader.prepare()
        client = reader.created_sync_client
        assert client is not None
        builds: list[S3Provider] = []
        monkeypatch.setattr(S3Provider, "_create_sync_client", lambda self: builds.append(self))
        data = await reader.segment(FileType.COMMIT_LOG, QUEUE, 0, commit_position=100).read(0, 100)
        assert data == b"p" * 100
        assert reader.created_sync_client is client and builds == []
