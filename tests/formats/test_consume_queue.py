"""The 20-byte consume-queue unit against the Rust port's consume queue, and round trips."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fixtures.paths import ROCKETMQ_FIXTURES
from tieredstore.errors import CorruptRecordError
from tieredstore.formats.consume_queue import UNIT_SIZE, ConsumeQueueUnit, encode_units, iter_units
from tieredstore.formats.message import iter_records, tag_hash

FIXTURE = ROCKETMQ_FIXTURES / "rust-0.9.0-writer"


def test_rust_consume_queue_units_point_at_its_commit_log_records() -> None:
    raw = (FIXTURE / "consumequeue" / "V1UpgradeTopic" / "0" / "00000000000000000000").read_bytes()
    assert len(raw) == 200
    units = list(iter_units(raw))
    assert units[:2] == [ConsumeQueueUnit(0, 141, 0), ConsumeQueueUnit(141, 141, 0)]
    assert all(unit.is_empty for unit in units[2:]) and len(units) == 10
    log = (FIXTURE / "commitlog" / "00000000000000000000").read_bytes()
    for unit, (position, record) in zip(units, iter_records(log), strict=False):
        assert unit.commitlog_offset == position
        assert unit.tag_hash == tag_hash(record.tags) == 0


def test_unit_layout_is_big_endian_offset_size_tag_hash() -> None:
    unit = ConsumeQueueUnit(0x0102030405060708, 172, tag_hash("TAG1"))
    assert unit.encode() == bytes.fromhex("0102030405060708000000ac0000000000272bf7")
    assert ConsumeQueueUnit(1, 2, -1).encode()[-8:] == b"\xff" * 8


def test_bad_units_are_corrupt_record_errors() -> None:
    with pytest.raises(CorruptRecordError, match="truncated"):
        ConsumeQueueUnit.decode(bytes(19))
    with pytest.raises(CorruptRecordError, match="multiple of 20"):
        list(iter_units(bytes(30)))
    with pytest.raises(CorruptRecordError, match="negative"):
        ConsumeQueueUnit.decode(ConsumeQueueUnit(-5, 1, 0).encode())


@given(
    st.lists(
        st.builds(
            ConsumeQueueUnit, st.integers(0, 2**63 - 1), st.integers(0, 2**31 - 1), st.integers(-(2**63), 2**63 - 1)
        ),
        max_size=50,
    )
)
def test_units_round_trip(units: list[ConsumeQueueUnit]) -> None:
    raw = encode_units(units)
    assert len(raw) == UNIT_SIZE * len(units)
    assert list(iter_units(raw)) == units
