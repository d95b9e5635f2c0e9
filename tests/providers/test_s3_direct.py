"""GETs after the client's first one skip its per-call machinery (providers/s3_direct.py) and answer the same."""

from __future__ import annotations

import base64
import zlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.fixtures.faultproxy import FaultProxy, FaultRates, FaultRule
from tests.fixtures.s3 import S3Server
from tieredstore.errors import SegmentNotFoundError, StorageAccessError, StorageUnavailableError
from tieredstore.providers.s3 import S3ObjectStore, S3Provider
from tieredstore.providers.s3_direct import DirectGets

FAST_RETRIES = {"retry_initial_delay": 0.001, "retry_max_delay": 0.01}
DATA = bytes(range(256)) * 1200 + b"tail"
KEY = "c1/broker-a/Topic Ü+=&~/0/COMMIT_LOG/00000000000000000000"  # characters botocore quotes, and "/~" it keeps


def store_of(provider: S3Provider) -> S3ObjectStore:
    store = provider.store
    assert isinstance(store, S3ObjectStore)
    return store


async def learned(provider: S3Provider, key: str = KEY) -> S3ObjectStore:
    """The provider's store after ``DATA`` was put at ``key`` and read once through the client."""
    store = store_of(provider)
    await store.put(key, DATA)
    assert await store.get_range(key, 0, 10) == DATA[:10]
    assert store.direct_gets == 0
    return store


@pytest.fixture
async def proxy(s3_server: S3Server) -> AsyncIterator[FaultProxy]:
    async with FaultProxy(s3_server.endpoint_url).running() as running:
        yield running


@pytest.fixture
async def proxied(proxy: FaultProxy, s3_bucket: str, s3_options: dict[str, Any]) -> AsyncIterator[S3Provider]:
    options = {**s3_options, "endpoint_url": proxy.endpoint_url, "max_attempts": 3, **FAST_RETRIES}
    async with S3Provider(f"s3://{s3_bucket}/odd prefix ü", **options) as provider:
        yield provider


@pytest.mark.parametrize("prefix", ["", "/archive", "/odd prefix ü+%"])
async def test_after_one_client_get_the_next_ones_go_direct_and_return_the_same_bytes(
    s3_bucket: str, s3_options: dict[str, Any], prefix: str
) -> None:
    async with S3Provider(f"s3://{s3_bucket}{prefix}", **s3_options) as provider:
        store = await learned(provider)
        ranges = [(0, len(DATA)), (5, 10), (len(DATA) - 1, 1), (100_000, 200_000), (len(DATA) - 4, 100)]
        for start, length in ranges:
            assert await store.get_range(KEY, start, length) == DATA[start : start + length]
        assert await store.get_range(KEY, len(DATA), 10) == b""  # the object ends before the range (416)
        assert store.direct_gets == len(ranges) + 1


async def test_a_missing_object_is_segment_not_found_on_the_direct_path(
    s3_bucket_url: str, s3_options: dict[str, Any]
) -> None:
    async with S3Provider(s3_bucket_url, **s3_options) as provider:
        store = await learned(provider)
        with pytest.raises(SegmentNotFoundError, match="NoSuchKey"):
            await store.get_range(KEY + "-gone", 0, 10)
        assert store.direct_gets == 1


async def test_damaged_bytes_are_never_returned_on_the_direct_path(
    s3_server: S3Server, s3_bucket: str, s3_options: dict[str, Any]
) -> None:
    async with S3Provider(f"s3://{s3_bucket}", **s3_options, max_attempts=2, **FAST_RETRIES) as provider:
        store = await learned(provider)
        damaged = bytes([DATA[0] ^ 1]) + DATA[1:]
        stored_crc = zlib.crc32(DATA).to_bytes(4, "big")
        s3_server.client().put_object(
            Bucket=s3_bucket,
            Key=KEY,
            Body=damaged,
            ChecksumAlgorithm="CRC32",
            ChecksumCRC32=base64.b64encode(stored_crc).decode(),
        )
        with pytest.raises(StorageUnavailableError, match="stored CRC32 checksum"):
            await store.get_range(KEY, 0, len(DATA))
        assert store.direct_gets == 2  # both attempts went direct and both were refused


async def test_throttling_is_retried_and_access_errors_are_not(proxied: S3Provider, proxy: FaultProxy) -> None:
    store = await learned(proxied)
    proxy.fail(FaultRule("GET", 503, "SlowDown", times=1))
    gets = proxy.count("GET")
    assert await store.get_range(KEY, 0, 100) == DATA[:100]
    assert proxy.count("GET") - gets == 2
    proxy.fail(FaultRule("GET", 403, "AccessDenied", times=5))
    gets = proxy.count("GET")
    with pytest.raises(StorageAccessError, match="AccessDenied"):
        await store.get_range(KEY, 0, 100)
    assert proxy.count("GET") - gets == 1
    assert store.direct_gets == 3


async def test_a_truncated_reply_is_retried_then_unavailable(proxied: S3Provider, proxy: FaultProxy) -> None:
    store = await learned(proxied)
    proxy.rates = FaultRates(truncate=1.0, methods=frozenset({"GET"}))
    gets = proxy.count("GET")
    with pytest.raises(StorageUnavailableError):
        await store.get_range(KEY, 0, len(DATA))
    assert proxy.count("GET") - gets == 3
    assert store.direct_gets == 3


async def test_a_400_hands_the_read_back_to_the_client_for_good(proxied: S3Provider, proxy: FaultProxy) -> None:
    store = await learned(proxied)
    # What a direct GET signed for the wrong region would get: the client, which follows such answers, reads.
    proxy.fail(FaultRule("GET", 400, "AuthorizationHeaderMalformed", times=1))
    assert await store.get_range(KEY, 3, 30) == DATA[3:33]
    assert await store.get_range(KEY, 0, 5) == DATA[:5]
    assert store.direct_gets == 1  # the refused one; the client made both reads


def test_a_url_that_is_not_the_quoted_key_is_not_learned() -> None:
    class Meta:
        region_name = "us-east-1"

    class Endpoint:
        http_session = object()

    class Client:
        meta = Meta()
        _endpoint = Endpoint()

    credentials = object()
    key = "a b/c"
    assert DirectGets.learn(Client(), credentials, key, "http://h/bucket/a%20b/c") is not None
    assert DirectGets.learn(Client(), credentials, key, "http://h/bucket/a%20b/c?x-id=GetObject") is None
    assert DirectGets.learn(Client(), credentials, key, "http://h/bucket/a b/c") is None
    assert DirectGets.learn(Client(), credentials, key, None) is None
    assert DirectGets.learn(Client(), None, key, "http://h/bucket/a%20b/c") is None


async def test_a_provider_used_again_after_close_learns_on_its_new_client(
    s3_bucket_url: str, s3_options: dict[str, Any]
) -> None:
    provider = S3Provider(s3_bucket_url, **s3_options)
    store = await learned(provider)
    assert await store.get_range(KEY, 1, 5) == DATA[1:6]
    await provider.close()  # closes the client whose connections the direct GETs used
    assert await store.get_range(KEY, 2, 5) == DATA[2:7]  # the new client's first GET
    assert await store.get_range(KEY, 3, 5) == DATA[3:8]
    assert store.direct_gets == 2
    await provider.close()
