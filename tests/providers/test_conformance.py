"""The provider conformance suite run over every provider this package ships."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.backends import s3fs_options
from tests.fixtures.s3 import S3Server
from tieredstore.providers.base import Provider
from tieredstore.providers.codec import Codecs, Compression, Keyring, WriteCodec
from tieredstore.providers.fsspec import FsspecProvider
from tieredstore.providers.memory import MemoryProvider
from tieredstore.providers.posix import PosixProvider
from tieredstore.providers.s3 import S3Provider
from tieredstore.providers.testing import ProviderFactory, ProviderTests


class TestMemoryProvider(ProviderTests):
    @pytest.fixture
    def make_provider(self) -> Iterator[ProviderFactory]:
        name = f"conformance-{uuid.uuid4().hex}"
        yield lambda: MemoryProvider(f"memory://{name}")
        MemoryProvider.wipe(name)


class TestPosixProvider(ProviderTests):
    @pytest.fixture
    def make_provider(self, tmp_path: Path) -> ProviderFactory:
        return lambda: PosixProvider(f"file://{tmp_path}/cold")


class TestS3Provider(ProviderTests):
    @pytest.fixture
    def make_provider(self, s3_bucket_url: str, s3_options: dict[str, Any]) -> ProviderFactory:
        return lambda: S3Provider(s3_bucket_url, **s3_options)


class TestS3ProviderWithoutConditionalWrites(ProviderTests):
    """Plain PUTs, each chunk read back: everything but refusing a second writer's bytes."""

    supports_conditional_create = False

    @pytest.fixture
    def make_provider(self, s3_bucket_url: str, s3_options: dict[str, Any]) -> ProviderFactory:
        return lambda: S3Provider(s3_bucket_url, **s3_options, conditional_writes="unsupported")


class TestFsspecOverS3fs(ProviderTests):
    @pytest.fixture
    def make_provider(self, s3_server: S3Server, s3_bucket: str) -> ProviderFactory:
        return lambda: FsspecProvider(f"s3a://{s3_bucket}/archive", **s3fs_options(s3_server))


class TestFsspecLocal(ProviderTests):
    @pytest.fixture
    def make_provider(self, tmp_path: Path) -> ProviderFactory:
        return lambda: FsspecProvider(f"file://{tmp_path}/cold")


# The same suite over framed segments (providers.codec): zstd frames sealed with AES-256-GCM, so every
# promise above (positions, restarts, conflicts, truncation) holds for compressed and encrypted data too.
KEYRING = Keyring({"conformance": bytes(range(32))}, active="conformance")


def framed(provider: Provider) -> Provider:
    provider.codecs = Codecs(KEYRING, lambda _segment: WriteCodec(Compression.ZSTD, 3, encrypt=True))
    return provider


class FramedTests(ProviderTests):
    stores_bytes_as_given = False


class TestPosixProviderFramed(FramedTests):
    @pytest.fixture
    def make_provider(self, tmp_path: Path) -> ProviderFactory:
        return lambda: framed(PosixProvider(f"file://{tmp_path}/cold"))


class TestS3ProviderFramed(FramedTests):
    @pytest.fixture
    def make_provider(self, s3_bucket_url: str, s3_options: dict[str, Any]) -> ProviderFactory:
        return lambda: framed(S3Provider(s3_bucket_url, **s3_options))


class TestFsspecOverS3fsFramed(FramedTests):
    @pytest.fixture
    def make_provider(self, s3_server: S3Server, s3_bucket: str) -> ProviderFactory:
        return lambda: framed(FsspecProvider(f"s3a://{s3_bucket}/archive", **s3fs_options(s3_server)))
