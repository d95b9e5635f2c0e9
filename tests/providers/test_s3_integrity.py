"""S3 provider: checksums computed and verified by the provider itself, and the client settings that carry them.

botocore's own "when_supported" checksumming is switched off in favour of the provider's (off the event
loop); these tests prove nothing was lost by that: every chunk lands with a CRC32 S3 stored, and a body
that does not match its stored checksum, or arrives short, is never returned as data.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import socket
import zlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import urllib3.util.connection

from tests.fixtures.faultproxy import NO_FAULTS, FaultProxy, FaultRates
from tests.fixtures.s3 import S3Server
from tieredstore import tuning
from tieredstore.config import TieredStoreConfig
from tieredstore.errors import ConfigError, StorageUnavailableError
from tieredstore.formats.naming import FileType, segment_key
from tieredstore.providers import s3_options as options_module
from tieredstore.providers.s3 import S3Options, S3Provider, check_response_checksum

QUEUE = "c1_cluster/broker-a/TopicTest/0"
FAST_RETRIES = {"retry_initial_delay": 0.001, "retry_max_delay": 0.01}
# Small bodies are hashed inline, large ones in a worker thread: both paths must check.
SIZES = [pytest.param(37, id="inline"), pytest.param(1 << 20, id="worker-thread")]


def chunk_key(start: int) -> str:
    return f"archive/{segment_key(QUEUE, FileType.COMMIT_LOG, 0)}/{start:020d}"


def b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode("ascii")


def crc32(data: bytes) -> str:
    return b64(zlib.crc32(data).to_bytes(4, "big"))


def sha256(data: bytes) -> str:
    return b64(hashlib.sha256(data).digest())


def sha1(data: bytes) -> str:
    return b64(hashlib.sha1(data).digest())


def body(size: int) -> bytes:
    return bytes(range(256)) * (size // 256) + bytes(size % 256)


@pytest.fixture
async def proxy(s3_server: S3Server) -> AsyncIterator[FaultProxy]:
    async with FaultProxy(s3_server.endpoint_url).running() as running:
        yield running


def test_the_client_config_leaves_checksums_to_the_provider_and_sizes_the_pool() -> None:
    provider = S3Provider("s3://bucket/archive", endpoint_url="http://127.0.0.1:9000", max_pool_connections=32)
    config = provider.client_config()
    assert config.request_checksum_calculation == "when_required"
    assert config.response_checksum_validation == "when_required"
    assert config.max_pool_connections == 32
    # Plain http: botocore keeps signing the payload's SHA-256, as raw boto3 does.
    assert "payload_signing_enabled" not in config.s3


@pytest.mark.parametrize("endpoint_url", [None, "https://s3.example.com"])
def test_over_tls_the_payload_goes_unsigned_beside_its_signed_crc32(endpoint_url: str | None) -> None:
    config = S3Provider("s3://bucket", endpoint_url=endpoint_url, region="eu-west-1").client_config()
    assert config.s3["payload_signing_enabled"] is False


async def test_the_live_client_uses_the_chosen_pool_size(s3_bucket_url: str, s3_options: dict[str, Any]) -> None:
    async with S3Provider(s3_bucket_url, **s3_options, max_pool_connections=24) as provider:
        client = await provider.client()
        assert client.meta.config.max_pool_connections == 24
        assert client.meta.config.request_checksum_calculation == "when_required"


def test_pool_size_default_from_the_url_and_bad_values() -> None:
    # Room for the archiver's pending commits and the readers' fetches together (botocore's default is 10).
    assert S3Provider("s3://bucket").client_config().max_pool_connections == 32
    assert S3Options.from_query("max_pool_connections=64").max_pool_connections == 64
    with pytest.raises(ConfigError, match="max_pool_connections"):
        S3Options(max_pool_connections=0)
    with pytest.raises(ConfigError, match="must be a number"):
        S3Options.from_query("max_pool_connections=many")


def _kernel_rmem_max() -> int:
    return int(Path("/proc/sys/net/core/rmem_max").read_text(encoding="ascii"))


@pytest.mark.parametrize(
    ("rmem_max", "granted"),
    [pytest.param("8388608", True, id="granted"), pytest.param("212992", False, id="stock-linux-cap")],
)
async def test_get_connections_ask_for_the_receive_buffer_where_the_kernel_grants_it_whole(
    s3_bucket_url: str,
    s3_options: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    rmem_max: str,
    granted: bool,
) -> None:
    """A GET's connection can take in a whole chunk while its thread waits for the GIL; where the kernel
    would cap the buffer below what it autotunes to, the kernel sizes it as before."""
    kernel_cap = _kernel_rmem_max()  # what setsockopt gets at most, whatever the module is told
    limit = tmp_path / "rmem_max"
    limit.write_text(f"{rmem_max}\n", encoding="ascii")
    monkeypatch.setattr(tuning, "_RMEM_MAX", limit)
    buffers: list[int] = []
    real = urllib3.util.connection.create_connection

    def recording(*args: Any, **kwargs: Any) -> socket.socket:
        sock = real(*args, **kwargs)
        buffers.append(sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF))
        return sock

    monkeypatch.setattr(urllib3.util.connection, "create_connection", recording)
    data = os.urandom(1 << 20)
    async with S3Provider(s3_bucket_url, **s3_options) as provider:
        await provider.store.put("probe/object", data)
        for _ in range(2):  # through the client, then the direct requests learned from it
            assert await provider.store.get_range("probe/object", 0, len(data)) == data
    assert len(buffers) >= 3, "the PUT and both GETs opened connections"
    if granted:
        assert min(buffers) >= min(tuning.RECEIVE_BUFFER_BYTES, kernel_cap)  # Linux reports twice the size set
    else:
        assert max(buffers) < min(4 << 20, kernel_cap)  # the kernel's starting size (net.ipv4.tcp_rmem)


def test_an_old_receive_buffer_setting_in_a_url_or_the_environment_is_ignored(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A deployment that still sets it keeps working, told once that the setting is gone."""
    monkeypatch.setattr(options_module, "_warned_removed", set())
    with caplog.at_level(logging.WARNING, logger="tieredstore.providers.s3_options"):
        assert S3Options.from_query("receive_buffer_bytes=0&region=eu-west-1") == S3Options(region="eu-west-1")
        S3Options.from_query("receive_buffer_bytes=0")
    assert caplog.text.count("receive_buffer_bytes is no longer a setting and is ignored") == 1
    monkeypatch.setenv("TIEREDSTORE_S3__RECEIVE_BUFFER_BYTES", "0")
    assert "receive_buffer_bytes" not in TieredStoreConfig().s3_options()
    with pytest.raises(ConfigError, match="receive_buffer_bytes"):
        S3Options.from_query("", receive_buffer_bytes=0)  # not an option of the code either


def test_the_pool_size_comes_from_the_config_file_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert TieredStoreConfig().s3_options()["max_pool_connections"] == 32
    monkeypatch.setenv("TIEREDSTORE_S3__MAX_POOL_CONNECTIONS", "48")
    options = TieredStoreConfig().s3_options()
    assert S3Provider("s3://bucket", **options).client_config().max_pool_connections == 48


@pytest.mark.parametrize("size", SIZES)
async def test_every_chunk_lands_with_the_crc32_of_its_bytes(
    s3_server: S3Server, s3_bucket: str, s3_bucket_url: str, s3_options: dict[str, Any], size: int
) -> None:
    data = body(size)
    async with S3Provider(s3_bucket_url, **s3_options) as provider:
        segment = provider.segment(FileType.COMMIT_LOG, QUEUE, 0)
        segment.append(data)
        await segment.commit()
    head = s3_server.client().head_object(Bucket=s3_bucket, Key=chunk_key(0), ChecksumMode="ENABLED")
    assert head["ChecksumCRC32"] == crc32(data)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize(
    ("algorithm", "digest"), [("CRC32", crc32), ("SHA256", sha256), ("SHA1", sha1)], ids=["crc32", "sha256", "sha1"]
)
async def test_a_chunk_whose_bytes_do_not_match_its_stored_checksum_is_never_returned(
    s3_server: S3Server,
    s3_bucket: str,
    s3_bucket_url: str,
    s3_options: dict[str, Any],
    size: int,
    algorithm: str,
    digest: Callable[[bytes], str],
) -> None:
    stored = body(size)
    damaged = bytes([stored[0] ^ 0x01]) + stored[1:]
    # The server keeps the checksum of the good bytes beside damaged ones, as a flipped bit on the way would look.
    s3_server.client().put_object(
        Bucket=s3_bucket,
        Key=chunk_key(0),
        Body=damaged,
        ChecksumAlgorithm=algorithm,
        **{f"Checksum{algorithm}": digest(stored)},
    )
    async with S3Provider(s3_bucket_url, **s3_options, max_attempts=2, **FAST_RETRIES) as provider:
        segment = provider.segment(FileType.COMMIT_LOG, QUEUE, 0, commit_position=size)
        with pytest.raises(StorageUnavailableError, match=f"stored {algorithm} checksum"):
            await segment.read(0, size)


async def test_a_matching_stored_checksum_reads_back(
    s3_server: S3Server, s3_bucket: str, s3_bucket_url: str, s3_options: dict[str, Any]
) -> None:
    stored = body(1 << 20)
    s3_server.client().put_object(
        Bucket=s3_bucket, Key=chunk_key(0), Body=stored, ChecksumAlgorithm="SHA256", ChecksumSHA256=sha256(stored)
    )
    async with S3Provider(s3_bucket_url, **s3_options) as provider:
        segment = provider.segment(FileType.COMMIT_LOG, QUEUE, 0, commit_position=len(stored))
        assert await segment.read(0, len(stored)) == stored
        assert await segment.read(5, 10) == stored[5:15]  # a partial range carries no checksum to compare


async def test_a_truncated_reply_is_retried_and_never_returned_as_data(
    proxy: FaultProxy, s3_bucket_url: str, s3_options: dict[str, Any]
) -> None:
    data = body(300_000)
    options = {**s3_options, "endpoint_url": proxy.endpoint_url, "max_attempts": 3, **FAST_RETRIES}
    async with S3Provider(s3_bucket_url, **options) as provider:
        segment = provider.segment(FileType.COMMIT_LOG, QUEUE, 0)
        segment.append(data)
        await segment.commit()  # the handle now knows its chunk: reads need no listing
        proxy.rates = FaultRates(truncate=1.0, methods=frozenset({"GET"}))
        gets = proxy.count("GET")
        with pytest.raises(StorageUnavailableError):
            await segment.read(0, len(data))
        assert proxy.count("GET") - gets == 3
        proxy.rates = NO_FAULTS
        assert await segment.read(0, len(data)) == data


def test_verification_compares_the_first_checksum_it_can_compute() -> None:
    data = b"some bytes"
    check_response_checksum({"ChecksumCRC32": crc32(data)}, data, "get x")
    check_response_checksum({"ChecksumCRC32": crc32(b"other"), "ChecksumType": "COMPOSITE"}, b"other", "get x")
    # A composite checksum describes parts, and CRC64NVME needs native code: neither is compared.
    check_response_checksum({"ChecksumCRC32": "AAAAAA==-3", "ChecksumCRC64NVME": "x"}, data, "get x")
    with pytest.raises(StorageUnavailableError, match=r"get x: .*CRC32"):
        check_response_checksum({"ChecksumCRC32": crc32(b"other")}, data, "get x")
