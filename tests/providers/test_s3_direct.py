"""GETs and PUTs after the client's first request skip its machinery (providers/s3_direct.py) and answer the same."""

from __future__ import annotations

import base64
import zlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

import botocore.config
import botocore.session
import pytest

from tests.fixtures.faultproxy import FaultProxy, FaultRates, FaultRule
from tests.fixtures.s3 import S3Server
from tieredstore.errors import SegmentNotFoundError, StorageAccessError, StorageError, StorageUnavailableError
from tieredstore.providers.s3 import S3ObjectStore, S3Provider
from tieredstore.providers.s3_direct import DirectRequests
from tieredstore.providers.s3_transport import checksum_arguments, put_headers

FAST_RETRIES = {"retry_initial_delay": 0.001, "retry_max_delay": 0.01}
DATA = bytes(range(256)) * 1200 + b"tail"
KEY = "c1/broker-a/Topic Ü+=&~/0/COMMIT_LOG/00000000000000000000"  # characters botocore quotes, and "/~" it keeps


def store_of(provider: S3Provider) -> S3ObjectStore:
    store = provider.store
    assert isinstance(store, S3ObjectStore)
    return store


async def learned(provider: S3Provider, key: str = KEY) -> S3ObjectStore:
    """The provider's store after ``DATA`` was put at ``key`` through the client and read back directly."""
    store = store_of(provider)
    await store.put(key, DATA)
    assert store.transport.direct_requests == 0
    assert await store.get_range(key, 0, 10) == DATA[:10]
    assert store.transport.direct_requests == 1
    store.transport.direct_requests = 0
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
async def test_after_one_client_request_gets_go_direct_and_return_the_same_bytes(
    s3_bucket: str, s3_options: dict[str, Any], prefix: str
) -> None:
    async with S3Provider(f"s3://{s3_bucket}{prefix}", **s3_options) as provider:
        store = await learned(provider)
        ranges = [(0, len(DATA)), (5, 10), (len(DATA) - 1, 1), (100_000, 200_000), (len(DATA) - 4, 100)]
        for start, length in ranges:
            assert await store.get_range(KEY, start, length) == DATA[start : start + length]
        assert await store.get_range(KEY, len(DATA), 10) == b""  # the object ends before the range (416)
        assert store.transport.direct_requests == len(ranges) + 1


async def test_a_missing_object_is_segment_not_found_on_the_direct_path(
    s3_bucket_url: str, s3_options: dict[str, Any]
) -> None:
    async with S3Provider(s3_bucket_url, **s3_options) as provider:
        store = await learned(provider)
        with pytest.raises(SegmentNotFoundError, match="NoSuchKey"):
            await store.get_range(KEY + "-gone", 0, 10)
        assert store.transport.direct_requests == 1


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
        assert store.transport.direct_requests == 2  # both attempts went direct and both were refused


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
    assert store.transport.direct_requests == 3


async def test_a_truncated_reply_is_retried_then_unavailable(proxied: S3Provider, proxy: FaultProxy) -> None:
    store = await learned(proxied)
    proxy.rates = FaultRates(truncate=1.0, methods=frozenset({"GET"}))
    gets = proxy.count("GET")
    with pytest.raises(StorageUnavailableError):
        await store.get_range(KEY, 0, len(DATA))
    assert proxy.count("GET") - gets == 3
    assert store.transport.direct_requests == 3


async def test_a_400_hands_the_read_back_to_the_client_for_good(proxied: S3Provider, proxy: FaultProxy) -> None:
    store = await learned(proxied)
    # What a direct GET signed for the wrong region would get: the client, which follows such answers, reads.
    proxy.fail(FaultRule("GET", 400, "AuthorizationHeaderMalformed", times=1))
    assert await store.get_range(KEY, 3, 30) == DATA[3:33]
    assert await store.get_range(KEY, 0, 5) == DATA[:5]
    await store.put(KEY + "-later", b"later")
    assert store.transport.direct_requests == 1  # the refused one; the client made both reads and the put


def test_a_url_that_is_not_the_quoted_key_is_not_learned() -> None:
    class Meta:
        region_name = "us-east-1"
        config = None

    class Endpoint:
        http_session = object()

    class Client:
        meta = Meta()
        _endpoint = Endpoint()

    credentials = object()
    key = "a b/c"
    assert DirectRequests.learn(Client(), credentials, key, "http://h/bucket/a%20b/c") is not None
    assert DirectRequests.learn(Client(), credentials, key, "http://h/bucket/a%20b/c?x-id=GetObject") is None
    assert DirectRequests.learn(Client(), credentials, key, "http://h/bucket/a b/c") is None
    assert DirectRequests.learn(Client(), credentials, key, None) is None
    assert DirectRequests.learn(Client(), None, key, "http://h/bucket/a%20b/c") is None


async def test_a_provider_used_again_after_close_learns_on_its_new_client(
    s3_bucket_url: str, s3_options: dict[str, Any]
) -> None:
    provider = S3Provider(s3_bucket_url, **s3_options)
    store = await learned(provider)
    await provider.close()  # closes the client whose connections the direct requests used
    assert await store.get_range(KEY, 2, 5) == DATA[2:7]  # the new client's first GET
    assert await store.get_range(KEY, 3, 5) == DATA[3:8]
    assert store.transport.direct_requests == 1
    await provider.close()


@pytest.mark.parametrize(
    "encryption", [{"sse": "AES256"}, {"sse": "aws:kms", "sse_kms_key_id": "alias/tieredstore"}], ids=["s3", "kms"]
)
async def test_puts_go_direct_with_their_checksum_condition_and_encryption(
    s3_server: S3Server, s3_bucket: str, s3_options: dict[str, Any], encryption: dict[str, str]
) -> None:
    async with S3Provider(f"s3://{s3_bucket}/odd prefix ü", **s3_options, **encryption) as provider:
        store = await learned(provider)
        later = DATA[::-1]
        await store.put(KEY + "-2", later)
        assert not await store.put_if_absent(KEY + "-2", b"other bytes")  # 412: what is there stays
        assert await store.put_if_absent(KEY + "-3", b"new")
        assert store.transport.direct_requests == 3
        client = s3_server.client()
        head = client.head_object(Bucket=s3_bucket, Key=f"odd prefix ü/{KEY}-2", ChecksumMode="ENABLED")
        assert head["ChecksumCRC32"] == base64.b64encode(zlib.crc32(later).to_bytes(4, "big")).decode()
        assert head["ServerSideEncryption"] == encryption["sse"]
        assert head.get("SSEKMSKeyId") == encryption.get("sse_kms_key_id")
        assert client.get_object(Bucket=s3_bucket, Key=f"odd prefix ü/{KEY}-2")["Body"].read() == later
        assert client.get_object(Bucket=s3_bucket, Key=f"odd prefix ü/{KEY}-3")["Body"].read() == b"new"


async def test_a_failed_direct_put_is_retried_and_a_400_falls_back_to_the_client(
    proxied: S3Provider, proxy: FaultProxy
) -> None:
    store = await learned(proxied)
    proxy.fail(FaultRule("PUT", 503, "SlowDown", times=1))
    puts = proxy.count("PUT")
    await store.put(KEY + "-2", b"second")
    assert proxy.count("PUT") - puts == 2
    proxy.fail(FaultRule("PUT", 400, "AuthorizationHeaderMalformed", times=1))
    await store.put(KEY + "-3", b"third")
    assert proxy.count("PUT") - puts == 4
    assert store.transport.direct_requests == 3  # the client made the last PUT
    assert await store.get_range(KEY + "-3", 0, 5) == b"third"
    assert await store.get_range(KEY + "-2", 0, 6) == b"second"


async def test_a_put_damaged_on_the_way_carries_the_crc32_of_the_bytes_sent(
    proxied: S3Provider, proxy: FaultProxy
) -> None:
    store = await learned(proxied)
    proxy.damage = frozenset({"PUT"})
    # S3 refuses such a PUT (BadDigest); moto keeps it with the CRC32 it was given, which the read then rejects.
    await store.put(KEY + "-2", DATA)
    proxy.damage = frozenset()
    with pytest.raises(StorageUnavailableError, match="stored CRC32 checksum"):
        await store.get_range(KEY + "-2", 0, len(DATA))
    assert store.transport.direct_requests == 1 + 3


async def test_a_400_the_client_gets_too_is_its_error_and_the_direct_path_stays(
    proxied: S3Provider, proxy: FaultProxy
) -> None:
    store = await learned(proxied)
    proxy.fail(FaultRule("GET", 400, "InvalidArgument", times=2))
    with pytest.raises(StorageError, match="InvalidArgument"):
        await store.get_range(KEY, 0, 5)
    assert await store.get_range(KEY, 0, 5) == DATA[:5]
    assert store.transport.direct_requests == 2


class _Captured(Exception):
    """Raised at ``before-send`` to keep what the client would have sent, without a server."""


@pytest.mark.parametrize("scheme", ["http", "https"])
@pytest.mark.parametrize("payload_signing", [None, True, False], ids=["default", "signed", "unsigned"])
def test_direct_requests_are_signed_as_the_client_signs_them(scheme: str, payload_signing: bool | None) -> None:
    """Same payload hash (SHA-256 or UNSIGNED-PAYLOAD) and signed headers as botocore's own GET and PUT."""
    s3_config: dict[str, Any] = {"addressing_style": "path"}
    if payload_signing is not None:
        s3_config["payload_signing_enabled"] = payload_signing
    client = botocore.session.get_session().create_client(
        "s3",
        endpoint_url=f"{scheme}://127.0.0.1:9",
        region_name="us-east-1",
        aws_access_key_id="key",
        aws_secret_access_key="secret",
        config=botocore.config.Config(s3=s3_config),
    )
    sent: list[tuple[str, dict[str, Any]]] = []

    def capture(request: Any, **_: Any) -> None:
        sent.append((request.url, dict(request.headers)))
        raise _Captured

    client.meta.events.register("before-send.s3", capture)
    checksum = checksum_arguments(base64.b64encode(zlib.crc32(DATA).to_bytes(4, "big")).decode())
    with pytest.raises(_Captured):
        client.put_object(Bucket="bucket", Key=KEY, Body=DATA, **checksum)
    with pytest.raises(_Captured):
        client.get_object(Bucket="bucket", Key=KEY, Range="bytes=0-9", ChecksumMode="ENABLED")
    (put_url, put_sent), (_, get_sent) = sent
    direct = DirectRequests.learn(client, client._request_signer._credentials, KEY, put_url)
    assert direct is not None
    put = direct.signed("PUT", KEY, put_headers(checksum), DATA).headers
    get = direct.signed("GET", KEY, {"Range": "bytes=0-9", "x-amz-checksum-mode": "ENABLED"}).headers

    def signature_inputs(headers: Mapping[str, Any]) -> tuple[str, str]:
        payload, authorization = (
            value.decode() if isinstance(value, bytes) else value
            for value in (headers["X-Amz-Content-SHA256"], headers["Authorization"])
        )
        return payload, authorization.split("SignedHeaders=")[1].split(",")[0]

    assert signature_inputs(put) == signature_inputs(put_sent)
    assert signature_inputs(get) == signature_inputs(get_sent)
    if scheme == "http" or payload_signing is not None:
        assert (signature_inputs(put)[0] == "UNSIGNED-PAYLOAD") == (payload_signing is False)
