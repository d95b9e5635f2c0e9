"""The numpy layouts read what the record and unit decoders read, on files other RocketMQ stores wrote."""

from __future__ import annotations

import numpy as np
import pytest

from tests.fixtures.paths import ROCKETMQ_FIXTURES
from tieredstore.formats.arrays import (
    IPV4_RECORD_HEAD_DTYPE,
    RECORD_HEAD_DTYPE,
    UNIT_DTYPE,
    gather,
    gather_rows,
)
from tieredstore.formats.consume_queue import iter_units
from tieredstore.formats.message import SYSFLAG_BORNHOST_V6, SYSFLAG_STOREHOST_V6, iter_records

FIXTURES = ROCKETMQ_FIXTURES


@pytest.fixture(scope="module")
def java_log() -> bytes:
    return (FIXTURES / "java-4x-consumequeuetest" / "commitlog" / "00000000000000000000").read_bytes()


def test_record_heads_gathered_at_once_match_the_decoder(java_log: bytes) -> None:
    records = list(iter_records(java_log))
    assert len(records) > 1
    positions = np.array([position for position, _record in records], dtype=np.int64)
    flat = np.frombuffer(java_log, dtype=np.uint8)
    heads = gather(flat, positions, RECORD_HEAD_DTYPE)
    for head, (position, record) in zip(heads, records, strict=True):
        assert int(head["queue_id"]) == record.queue_id
        assert int(head["queue_offset"]) == record.queue_offset
        assert int(head["physical_offset"]) == record.physical_offset == position
        assert int(head["born_timestamp"]) == record.born_timestamp
        assert int(head["sysflag"]) == record.sysflag
    ipv4 = [i for i, (_p, r) in enumerate(records) if not r.sysflag & (SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6)]
    assert ipv4, "the fixture has IPv4 records"
    wide = gather(flat, positions[ipv4], IPV4_RECORD_HEAD_DTYPE)
    for head, index in zip(wide, ipv4, strict=True):
        record = records[index][1]
        assert int(head["store_timestamp"]) == record.store_timestamp
        assert int(head["body_len"]) == len(record.body)


def test_units_read_as_one_array_match_the_unit_decoder() -> None:
    queue = FIXTURES / "rust-0.9.0-writer" / "consumequeue" / "V1UpgradeTopic" / "0"
    raw = (queue / "00000000000000000000").read_bytes()
    raw = raw[: len(raw) - len(raw) % 20]
    units = [unit for unit in iter_units(raw) if unit.size > 0]
    assert units
    array = np.frombuffer(raw, dtype=UNIT_DTYPE, count=len(units))
    assert array["commitlog_offset"].tolist() == [unit.commitlog_offset for unit in units]
    assert array["size"].tolist() == [unit.size for unit in units]
    assert array["tag_hash"].tolist() == [unit.tag_hash for unit in units]


def test_a_row_running_past_the_end_keeps_its_leading_bytes() -> None:
    flat = np.arange(10, dtype=np.uint8)
    rows = gather_rows(flat, np.array([0, 7], dtype=np.int64), 4)
    assert rows[0].tolist() == [0, 1, 2, 3]
    assert rows[1].tolist()[:3] == [7, 8, 9]  # the fourth byte is past the end: the caller's size check refuses it
    assert gather_rows(np.zeros(0, dtype=np.uint8), np.array([0], dtype=np.int64), 4).tolist() == [[0, 0, 0, 0]]


@pytest.mark.parametrize("step", [1, 3], ids=["contiguous", "strided"])
def test_rows_inside_the_bytes_are_the_bytes_at_each_position(step: int) -> None:
    data = np.frombuffer(bytes(range(256)) * 4, dtype=np.uint8)[5::step]
    positions = np.array([0, 17, 3, 200, len(data) - 6], dtype=np.int64)
    rows = gather_rows(data, positions, 6)
    assert rows.tolist() == [data[p : p + 6].tolist() for p in positions.tolist()]
