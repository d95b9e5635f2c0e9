"""Bad input to the hot store: a typed error naming the rule, and nothing written."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tieredstore.errors import (
    InvalidPropertyError,
    InvalidQueueError,
    InvalidTopicError,
    MessageTooLargeError,
    StoreFullError,
    TieredStoreError,
    ValidationError,
)
from tieredstore.local import LocalMessageStore, LocalStoreConfig, PutRequest

from .conftest import small_config

BAD_PUTS: list[tuple[dict[str, object], type[TieredStoreError], str]] = [
    ({"topic": "../etc"}, InvalidTopicError, r"\^\[%\|a-zA-Z0-9_-\]\+\$"),
    ({"topic": "a/b"}, InvalidTopicError, "may only contain"),
    ({"topic": ""}, InvalidTopicError, "empty"),
    ({"topic": "t" * 128}, InvalidTopicError, "at most 127"),
    ({"queue_id": -1}, InvalidQueueError, r"outside 0\.\.1023 \(max_queues_per_topic=1024\)"),
    ({"queue_id": 1024}, InvalidQueueError, "max_queues_per_topic"),
    ({"body": b"x" * (16 << 10 + 1)}, MessageTooLargeError, "max_message_size is 16384"),
    ({"properties": {"a\x01": "b"}}, InvalidPropertyError, "separator"),
    ({"properties": {"a": "b\x02"}}, InvalidPropertyError, "separator"),
    ({"properties": {"a": "x" * 40000}}, InvalidPropertyError, "32767"),
    ({"keys": ["has space"]}, InvalidPropertyError, "without spaces"),
    ({"keys": ["k"], "properties": {"KEYS": "k"}}, InvalidPropertyError, "both"),
    ({"tags": "t", "properties": {"TAGS": "t"}}, InvalidPropertyError, "both"),
    ({"tags": ""}, InvalidPropertyError, "non-empty"),
    ({"body": "text"}, ValidationError, "must be bytes"),
]


@pytest.mark.parametrize(("change", "error", "rule"), BAD_PUTS)
def test_bad_put_is_refused_with_the_rule_and_nothing_written(
    tmp_path: Path, config: LocalStoreConfig, change: dict[str, object], error: type[Exception], rule: str
) -> None:
    with LocalMessageStore(tmp_path, config=small_config(max_message_size=16 << 10)) as store:
        store.put_message("t", 0, b"before")
        request = {"topic": "t", "queue_id": 0, "body": b"ok"} | change
        with pytest.raises(error, match=rule):
            store.put_message(**request)  # type: ignore[arg-type]
        with pytest.raises(error, match=rule):
            store.put_messages([PutRequest("t", 0, b"fine"), PutRequest(**request)])  # type: ignore[arg-type]
        assert store.max_offset("t", 0) == 1
        assert store.put_message("t", 0, b"after").queue_offset == 1
        assert store.queues() == [("t", 0)]


def test_a_single_key_string_is_one_key(tmp_path: Path, config: LocalStoreConfig) -> None:
    with LocalMessageStore(tmp_path, config=config) as store:
        store.put_message("t", 0, b"x", keys="order-1")  # type: ignore[arg-type]
        assert store.get_message("t", 0, 0).keys == ["order-1"]


def test_byte_cap_refuses_puts_and_keeps_the_store_intact(tmp_path: Path) -> None:
    with LocalMessageStore(tmp_path, config=small_config(hot_disk_max_bytes=20_000)) as store:
        per_message = store.put_message("t", 0, b"z" * 1000).size + 20  # record plus consume-queue unit
        written = 1
        while (written + 1) * per_message <= 20_000:
            store.put_message("t", 0, b"z" * 1000)
            written += 1
        with pytest.raises(StoreFullError, match="hot_disk_max_bytes is 20000"):
            store.put_message("t", 0, b"z" * 1000)
        assert written == store.max_offset("t", 0) > 0
        end = store.commitlog_max_offset
        with pytest.raises(StoreFullError):
            store.put_messages([PutRequest("t", 1, b"z")] * 50)
        assert store.commitlog_max_offset == end and store.max_offset("t", 1) == 0
        assert [m.queue_offset for m in store.read_messages("t", 0, 0, 1000)] == list(range(written))


def test_disk_watermark_refuses_puts(tmp_path: Path) -> None:
    usage = shutil.disk_usage(tmp_path)
    used = (usage.total - usage.free) / usage.total
    with LocalMessageStore(tmp_path, config=small_config(hot_disk_high_watermark=used * 0.5)) as store:
        with pytest.raises(StoreFullError, match="hot_disk_high_watermark"):
            store.put_message("t", 0, b"x")
        assert store.max_offset("t", 0) == 0 and store.commitlog_max_offset == 0
    with LocalMessageStore(tmp_path, config=small_config(hot_disk_high_watermark=1.0)) as store:
        assert store.put_message("t", 0, b"x").queue_offset == 0
