"""S3 storage classes per segment type, as moto records them (``x-amz-storage-class``), over HTTP."""

from __future__ import annotations

from typing import Any

import pytest

from tests.fixtures.s3 import S3Server
from tieredstore.config import load_config
from tieredstore.errors import ConfigError
from tieredstore.formats.naming import FileType, queue_path, segment_key
from tieredstore.providers.chunks import CREATED_MARKER
from tieredstore.providers.s3 import S3ObjectStore, S3Options, S3Provider

QUEUE = queue_path("DefaultCluster", "broker-a", "TopicTest", 0)


def stored_class(s3_server: S3Server, bucket: str, key: str) -> str:
    # S3 leaves the header out for STANDARD.
    return str(s3_server.client().head_object(Bucket=bucket, Key=f"archive/{key}").get("StorageClass", "STANDARD"))


async def write_each_type(provider: S3Provider) -> None:
    for file_type in FileType:
        segment = provider.segment(file_type, QUEUE, 0)
        await segment.create()
        for part in (b"first chunk ", b"second chunk ", b"third chunk"):  # later PUTs are direct requests
            segment.append(part)
            await segment.commit()
        assert await segment.read(0, 100) == b"first chunk second chunk third chunk"


def classes_by_type(s3_server: S3Server, bucket: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for file_type in FileType:
        key = segment_key(QUEUE, file_type, 0)
        for start in (0, 12, 25):
            found.setdefault(file_type.value, set()).add(stored_class(s3_server, bucket, f"{key}/{start:020d}"))
        found.setdefault("marker", set()).add(stored_class(s3_server, bucket, f"{key}/{CREATED_MARKER}"))
    return found


@pytest.mark.parametrize(
    ("options", "commit_log", "others"),
    [
        ({}, "STANDARD", "STANDARD"),
        ({"storage_class": "STANDARD_IA"}, "STANDARD_IA", "STANDARD"),
        ({"storage_class": "GLACIER_IR", "index_storage_class": "ONEZONE_IA"}, "GLACIER_IR", "ONEZONE_IA"),
        ({"storage_class": "INTELLIGENT_TIERING"}, "INTELLIGENT_TIERING", "STANDARD"),
    ],
)
async def test_commit_log_chunks_take_storage_class_and_the_rest_index_storage_class(
    s3_server: S3Server,
    s3_bucket: str,
    s3_bucket_url: str,
    s3_options: dict[str, Any],
    options: dict[str, str],
    commit_log: str,
    others: str,
) -> None:
    async with S3Provider(s3_bucket_url, **s3_options, **options) as provider:
        await write_each_type(provider)
        store = provider.store
        assert isinstance(store, S3ObjectStore) and store.transport.direct_requests > 0
    assert classes_by_type(s3_server, s3_bucket) == {
        "COMMIT_LOG": {commit_log},
        "CONSUME_QUEUE": {others},
        "INDEX": {others},
        "marker": {"STANDARD"},  # empty markers are no chunk: nothing to save on them
    }
    async with S3Provider(s3_bucket_url, **s3_options) as reader:  # reads need no setting
        segment = reader.segment(FileType.COMMIT_LOG, QUEUE, 0)
        assert await segment.correct_commit_position() == 36
        assert await segment.read(0, 36) == b"first chunk second chunk third chunk"


async def test_a_chunk_shortened_by_truncation_keeps_its_class(
    s3_server: S3Server, s3_bucket: str, s3_bucket_url: str, s3_options: dict[str, Any]
) -> None:
    async with S3Provider(s3_bucket_url, **s3_options, storage_class="STANDARD_IA") as provider:
        segment = provider.segment(FileType.COMMIT_LOG, QUEUE, 0)
        segment.append(b"kept and cut")
        await segment.commit()
        await segment.truncate(4)
        assert await segment.read(0, 100) == b"kept"
    assert stored_class(s3_server, s3_bucket, f"{segment_key(QUEUE, FileType.COMMIT_LOG, 0)}/{0:020d}") == "STANDARD_IA"


@pytest.mark.parametrize("archive_class", ["GLACIER", "DEEP_ARCHIVE"])
def test_classes_that_need_a_restore_before_a_read_are_refused(archive_class: str) -> None:
    for setting in ("storage_class", "index_storage_class"):
        with pytest.raises(ConfigError, match="cannot be read until each one is restored") as refused:
            S3Options(**{setting: archive_class})
        assert setting in str(refused.value)
        with pytest.raises(ConfigError, match=rf"s3\.{setting}: .*cannot be read until each one is restored"):
            load_config(s3={setting: archive_class})


def test_unknown_storage_classes_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"not an S3 storage class; one of .*STANDARD_IA"):
        S3Options(storage_class="standard_ia")
    with pytest.raises(ConfigError, match=r"s3\.index_storage_class: .*not an S3 storage class"):
        load_config(s3={"index_storage_class": "COLD"})
    assert S3Options.from_query("storage_class=ONEZONE_IA").storage_class == "ONEZONE_IA"
    assert load_config(s3={"storage_class": "GLACIER_IR"}).s3_options()["storage_class"] == "GLACIER_IR"
