"""The window check: every record of a cold window checked at once, exactly as one by one."""

from __future__ import annotations

import random

import numpy as np
import pytest

from tieredstore.errors import CorruptRecordError
from tieredstore.flat.served import check_window, parse_units, verify_served
from tieredstore.formats.consume_queue import ConsumeQueueUnit, encode_units
from tieredstore.formats.message import LOCALHOST, HostAddress, MessageRecord


def _window(records: list[bytes], commitlog_start: int) -> tuple[bytes, bytes]:
    """The records as one commit-log read from ``commitlog_start``, and their consume-queue bytes."""
    data = b"".join(records)
    units, position = [], commitlog_start
    for raw in records:
        units.append(ConsumeQueueUnit(position, len(raw), 0))
        position += len(raw)
    return data, encode_units(units)


@pytest.mark.parametrize("topic", ["Checked", "L" * 200], ids=["v1", "v2-long-topic"])
def test_the_window_check_rejects_exactly_what_the_record_check_rejects(topic: str) -> None:
    """Random byte flips and wrong units: the window's corrupt set and errors equal ``verify_served``'s."""
    rng = random.Random(6)
    first_offset, commitlog_start = 1000, 5_000_000
    records = [
        MessageRecord(
            topic=topic,
            queue_id=3,
            body=rng.randbytes(rng.randrange(0, 300)),
            properties={"KEYS": f"k{n}"} if n % 3 else {},
            queue_offset=first_offset + n,
            born_host=HostAddress("::1", 10911) if n % 4 == 1 else LOCALHOST,
            store_host=HostAddress("fe80::2", 10912) if n % 5 == 2 else LOCALHOST,
        ).encode()
        for n in range(40)
    ]
    clean, clean_units = _window(records, commitlog_start)
    assert check_window(topic, 3, first_offset, clean, commitlog_start, parse_units(clean_units, "q", 0)).corrupt == {}
    for _trial in range(300):
        data = bytearray(clean)
        units = list(parse_units(clean_units, "q", 0).tolist())
        for _flip_count in range(rng.randrange(1, 4)):
            if rng.random() < 0.85:
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
            else:
                index = rng.randrange(len(units))
                offset, size, tag = units[index]
                units[index] = (offset + rng.choice([-3, 0, 1]), max(0, size + rng.choice([-1, 0, 2])), tag)
        raw_units = encode_units([ConsumeQueueUnit(*unit) for unit in units])
        batch = check_window(topic, 3, first_offset, bytes(data), commitlog_start, parse_units(raw_units, "q", 0))
        expected: dict[int, str] = {}
        for index, (offset, size, tag) in enumerate(units):
            begin = offset - commitlog_start
            try:
                verify_served(
                    topic,
                    3,
                    first_offset + index,
                    bytes(data)[begin : begin + size],
                    ConsumeQueueUnit(offset, size, tag),
                    "cold",
                )
            except CorruptRecordError as error:
                expected[first_offset + index] = str(error)
        assert {offset: str(error) for offset, error in batch.corrupt.items()} == expected


def test_units_with_a_negative_offset_or_size_are_the_consume_queue_s_typed_error() -> None:
    good = ConsumeQueueUnit(0, 100, 0).encode()
    bad = np.array([(5, -1, 0)], dtype=parse_units(good, "q", 0).dtype).tobytes()
    with pytest.raises(CorruptRecordError, match="negative offset"):
        parse_units(good + bad, "q", 0)
    with pytest.raises(CorruptRecordError, match="not whole units") as partial:
        parse_units(good + b"\x00", "T/0/CONSUME_QUEUE", 2000)
    assert (partial.value.location, partial.value.offset) == ("T/0/CONSUME_QUEUE", 2000)
