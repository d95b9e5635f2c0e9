"""index_keys_of: a message's index keys read from its raw properties, the same as a full decode gives."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fixtures.paths import ROCKETMQ_FIXTURES
from tieredstore.errors import CorruptRecordError
from tieredstore.formats.message import (
    HostAddress,
    MessageRecord,
    decode,
    index_keys_of,
    iter_records,
    properties_raw_of,
)

FIXTURES = ROCKETMQ_FIXTURES
COMMIT_LOGS = [
    FIXTURES / "java-4x-consumequeuetest" / "commitlog" / "00000000000000000000",
    FIXTURES / "rust-0.9.0-writer" / "commitlog" / "00000000000000000000",
]


def keys_by_decode(record: MessageRecord) -> tuple[str, ...]:
    return tuple(record.keys) + ((record.unique_key,) if record.unique_key else ())


@pytest.mark.parametrize("commit_log", COMMIT_LOGS, ids=["java", "rust"])
def test_keys_of_every_real_rocketmq_record_match_a_full_decode(commit_log: Path) -> None:
    data = commit_log.read_bytes()
    records = list(iter_records(data))
    assert records
    for position, record in records:
        assert index_keys_of(data, position) == keys_by_decode(record)
    assert any(index_keys_of(data, position) for position, _ in records)


texts = st.text(st.characters(blacklist_characters="\x01\x02 ", blacklist_categories=("Cs",)), min_size=1, max_size=12)
hosts = st.one_of(
    st.builds(HostAddress, st.ip_addresses(v=4).map(str), st.integers(0, 65535)),
    st.builds(HostAddress, st.ip_addresses(v=6).map(str), st.integers(0, 65535)),
)


@settings(max_examples=200, deadline=None)
@given(
    topic=st.text("abcXYZ019_-", min_size=1, max_size=200),
    body=st.binary(max_size=200),
    keys=st.lists(texts, max_size=4),
    unique_key=st.one_of(st.none(), texts),
    others=st.dictionaries(texts.filter(lambda t: t not in ("KEYS", "UNIQ_KEY")), texts, max_size=3),
    born_host=hosts,
    store_host=hosts,
)
def test_keys_match_a_full_decode_for_any_layout(
    topic: str,
    body: bytes,
    keys: list[str],
    unique_key: str | None,
    others: dict[str, str],
    born_host: HostAddress,
    store_host: HostAddress,
) -> None:
    properties = dict(others)
    if keys:
        properties["KEYS"] = " ".join(keys)
    if unique_key is not None:
        properties["UNIQ_KEY"] = unique_key
    raw = MessageRecord(topic, 3, body, properties, born_host=born_host, store_host=store_host).encode()
    assert index_keys_of(raw) == keys_by_decode(decode(raw)) == (*keys, *((unique_key,) if unique_key else ()))


def test_a_record_whose_lengths_do_not_add_up_is_a_corrupt_record_error() -> None:
    raw = MessageRecord("T", 0, b"body", {"KEYS": "k1"}).encode()
    body_len_at = raw.index(b"body") - 4
    longer_body = raw[:body_len_at] + struct.pack(">i", 9) + raw[body_len_at + 4 :]
    with pytest.raises(CorruptRecordError):
        properties_raw_of(longer_body)
    with pytest.raises(CorruptRecordError):
        index_keys_of(raw[:-3])
