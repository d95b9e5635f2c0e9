"""AWS KMS keys in the keyring, against moto's KMS over HTTP (the same server and credentials as S3): segments
sealed under a KMS key read back on S3 and on POSIX, and KMS failures are the keyring's typed errors."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.s3 import S3Server
from tests.providers.test_codec import assert_no_material, chain_text
from tieredstore.config import TieredStoreConfig, load_config
from tieredstore.errors import MissingKeyError, StorageUnavailableError, WrongKeyError
from tieredstore.keys import load_keyring
from tieredstore.providers.base import Provider
from tieredstore.providers.codec import DESCRIPTOR_NAME, WrappedKey
from tieredstore.providers.kms import KmsKeys
from tieredstore.providers.s3_options import S3Options
from tieredstore.providers.testing import COMMIT_LOG, QUEUE, committed, payload
from tieredstore.runtime import open_cold_provider
from tieredstore.scan.options import ScanOptions
from tieredstore.scan.session import open_scan_provider

DATA_KEY = bytes(range(32, 64))


def kms_alias(s3_server: S3Server) -> str:
    """A new KMS key in moto, by a fresh alias."""
    client = s3_server.client("kms")
    key_id = client.create_key(Description="tieredstore test")["KeyMetadata"]["KeyId"]
    alias = f"alias/tieredstore-{uuid.uuid4().hex[:12]}"
    client.create_alias(AliasName=alias, TargetKeyId=key_id)
    return alias


def kms_keys(s3_server: S3Server, endpoint_url: str | None = None, **keys: str) -> KmsKeys:
    options = {**s3_server.provider_options(), "max_attempts": 1, "connect_timeout": 1.0}
    if endpoint_url is not None:
        options["endpoint_url"] = endpoint_url
    return KmsKeys(keys, S3Options(**options))


@pytest.fixture
def alias(s3_server: S3Server) -> str:
    return kms_alias(s3_server)


OpenCold = Callable[[dict[str, Any]], Provider]


@pytest.fixture(params=["posix", "s3"])
async def open_cold(request: pytest.FixtureRequest, s3_server: S3Server, tmp_path: Path) -> AsyncIterator[OpenCold]:
    """Cold providers built from configuration as every command builds them, with ``[s3]`` on moto: the cold
    tier on S3, or on POSIX with only KMS reached through ``[s3] endpoint_url``."""
    cold_url = request.getfixturevalue("s3_bucket_url") if request.param == "s3" else None
    opened: list[Provider] = []

    def open_one(encryption: dict[str, Any]) -> Provider:
        config = load_config(
            None,
            data_dir=tmp_path,
            cold_url=cold_url,
            s3=s3_server.provider_options(),
            cold={"compression": "zstd"},
            encryption=encryption,
        )
        provider = open_cold_provider(config)
        opened.append(provider)
        return provider

    yield open_one
    for provider in opened:
        await provider.close()


async def descriptor(provider: Provider, key: str) -> dict[str, Any]:
    store = provider.store if hasattr(provider, "store") else provider.objects  # type: ignore[attr-defined]
    return dict(json.loads(await store.get_range(f"{key}/{DESCRIPTOR_NAME}", 0, 1 << 40)))


async def test_a_segment_sealed_under_a_kms_key_reads_back_and_only_through_kms(
    open_cold: OpenCold, alias: str
) -> None:
    data = payload(50_000, 7)
    writer = open_cold({"kms_keys": {"prod-2026": alias}, "active_key": "prod-2026"})
    segment = await committed(writer.segment(COMMIT_LOG, QUEUE, 0), data[:20_000], data[20_000:])
    stored = await descriptor(writer, segment.key)
    assert stored["encryption"]["key_id"] == "prod-2026"

    reader = open_cold({"kms_keys": {"prod-2026": alias}})  # no active key: reads, writes nothing encrypted
    again = reader.segment(COMMIT_LOG, QUEUE, 0)
    assert await again.correct_commit_position() == len(data)
    assert await again.read(15_000, 10_000) == data[15_000:25_000]

    absent = f"alias/absent-{uuid.uuid4().hex[:12]}"  # no KMS key has it: KMS answers NotFoundException
    elsewhere = open_cold({"kms_keys": {"prod-2026": absent}})
    refusing = elsewhere.segment(COMMIT_LOG, QUEUE, 0)
    assert await refusing.correct_commit_position() == len(data)  # sizing needs no key
    with pytest.raises(MissingKeyError, match="'prod-2026' cannot be used: KMS answered NotFoundException") as refused:
        await refusing.read(0, 10)
    assert str(refused.value).count("\n") == 0


def test_kms_wraps_and_unwraps_and_a_damaged_blob_is_the_wrong_key(s3_server: S3Server, alias: str) -> None:
    keys = kms_keys(s3_server, **{"prod-2026": alias})
    blob = keys.wrap("prod-2026", DATA_KEY, "seg")
    assert DATA_KEY not in blob
    assert keys.unwrap("prod-2026", blob, "seg") == DATA_KEY
    damaged = blob[:-1] + bytes([blob[-1] ^ 1])
    with pytest.raises(WrongKeyError, match="seg: KMS key 'prod-2026'"):
        keys.unwrap("prod-2026", damaged, "seg")


def test_an_unreachable_kms_endpoint_is_retryable_and_names_no_secret(s3_server: S3Server, alias: str) -> None:
    keys = kms_keys(s3_server, endpoint_url="http://127.0.0.1:9", **{"prod-2026": alias})
    with pytest.raises(StorageUnavailableError, match="'prod-2026': KMS unreachable") as caught:
        keys.wrap("prod-2026", DATA_KEY, "seg")
    text = chain_text(caught.value)
    assert s3_server.secret_access_key not in text and s3_server.access_key_id not in text
    assert_no_material(text, DATA_KEY)


def test_a_keyring_of_local_and_kms_keys_shows_ids_only(s3_server: S3Server, alias: str) -> None:
    local = bytes(range(32))
    settings = TieredStoreConfig(
        s3=s3_server.provider_options(),
        encryption={"kms_keys": {"prod-2026": alias}, "active_key": "prod-2026"},
    )
    keyring = load_keyring(settings.encryption, S3Options(**settings.s3_options()))
    assert repr(keyring) == "Keyring(ids=['prod-2026'], active='prod-2026', kms=['prod-2026'])"
    wrapped = keyring.wrap(DATA_KEY)
    assert wrapped.key_id == "prod-2026" and keyring.unwrap(wrapped, "seg") == DATA_KEY
    text = repr(keyring) + repr(wrapped) + repr(settings)
    assert s3_server.secret_access_key not in text
    assert_no_material(text, DATA_KEY, local)
    with pytest.raises(MissingKeyError, match="does not hold"):
        keyring.unwrap(WrappedKey("k-local", wrapped.wrapped), "seg")


async def test_a_kms_call_on_the_event_loop_is_refused(s3_server: S3Server, alias: str) -> None:
    keys = kms_keys(s3_server, **{"prod-2026": alias})
    with pytest.raises(RuntimeError, match="never on the event loop"):
        keys.wrap("prod-2026", DATA_KEY, "seg")
    blob = await asyncio.to_thread(keys.wrap, "prod-2026", DATA_KEY, "seg")
    assert await asyncio.to_thread(keys.unwrap, "prod-2026", blob, "seg") == DATA_KEY


async def test_the_spark_source_reads_a_kms_sealed_segment_through_its_own_s3_options(
    s3_server: S3Server, s3_bucket_url: str, tmp_path: Path, alias: str
) -> None:
    config = load_config(
        None,
        data_dir=tmp_path,
        cold_url=s3_bucket_url,
        s3=s3_server.provider_options(),
        encryption={"kms_keys": {"prod-2026": alias}, "active_key": "prod-2026"},
    )
    data = payload(30_000, 3)
    writer = open_cold_provider(config)
    await committed(writer.segment(COMMIT_LOG, QUEUE, 0), data)
    await writer.close()
    # What a Spark query gives: the KMS key's name, and S3 options that also say how to reach KMS.
    options = ScanOptions.parse(
        {
            "path": "TopicTest",
            "cold_url": s3_bucket_url,
            "metadata_url": f"sqlite:///{tmp_path}/metadata.db",
            "kms_keys": json.dumps({"prod-2026": alias}),
            **s3_server.provider_options(),
        }
    )
    assert "kms_keys=['prod-2026']" in repr(options) and s3_server.secret_access_key not in repr(options)
    reader = open_scan_provider(options)
    try:
        assert await reader.segment(COMMIT_LOG, QUEUE, 0, commit_position=len(data)).read(0, len(data)) == data
    finally:
        await reader.close()
