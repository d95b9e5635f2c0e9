"""The records a commit cut short left behind, taken back by recovery up to the first that is not its queue's next."""

from __future__ import annotations

from tieredstore.flat.queue_recovery import completing_units
from tieredstore.formats.consume_queue import ConsumeQueueUnit
from tieredstore.formats.message import MessageRecord, tag_hash

AT = 4096


def _records(count: int, *, first: int = 10, queue_id: int = 2) -> bytes:
    data = b""
    for n in range(count):
        data += MessageRecord(
            topic="T",
            queue_id=queue_id,
            body=b"x" * n,
            properties={"TAGS": f"t{n % 2}"} if n else {},
            queue_offset=first + n,
            physical_offset=AT + len(data),
            store_timestamp=1000 + n,
        ).encode()
    return data


def test_every_whole_record_of_the_queue_gets_its_unit_and_a_torn_tail_ends_them() -> None:
    data = _records(4)
    units, stamps = completing_units(data[:-5], AT, b"T", 2, 10)
    assert len(units) == 3
    assert stamps.tolist() == [1000, 1001, 1002]
    assert units[0] == ConsumeQueueUnit(AT, units[1].commitlog_offset - AT, 0)
    assert [unit.tag_hash for unit in units[1:]] == [tag_hash("t1"), tag_hash("t0")]


def test_a_record_of_another_queue_offset_or_place_ends_them() -> None:
    data = _records(3)
    assert completing_units(data, AT, b"T", 2, 11)[0] == []
    assert completing_units(data, AT + 8, b"T", 2, 10)[0] == []
    assert completing_units(data, AT, b"U", 2, 10)[0] == []
    assert completing_units(data, AT, b"T", 3, 10)[0] == []
    damaged = bytearray(data)
    damaged[data.rfind(b"xx")] ^= 1  # the last record's body, so its body CRC
    assert len(completing_units(bytes(damaged), AT, b"T", 2, 10)[0]) == 2
