"""The one CRC-32 both tiers use gives zlib's (and Java's CRC32's) values, on every buffer type we pass it.

A flipped body byte failing the record check is tested against the Java store's own file (test_message.py).
"""

from __future__ import annotations

import random
import zlib

import pytest

from tieredstore.formats.checksum import BODY_CRC_MASK, body_crc, crc32


@pytest.mark.parametrize("length", [0, 1, 15, 16, 63, 64, 1023, 1024, 4097, 1 << 20])
def test_crc32_equals_zlib_on_every_length(length: int) -> None:
    data = random.Random(length).randbytes(length)
    assert crc32(data) == zlib.crc32(data)
    assert crc32(bytearray(data)) == zlib.crc32(data)
    assert crc32(memoryview(data)[1:]) == zlib.crc32(data[1:])


def test_crc32_continues_from_a_value_as_zlib_does() -> None:
    head, tail = b"tiered" * 100, b"store" * 300
    assert crc32(tail, crc32(head)) == zlib.crc32(head + tail)


def test_body_crc_is_the_31_bits_rocketmq_stores() -> None:
    # A body whose CRC-32 has the top bit set: the stored BODYCRC drops it, as UtilAll.crc32 does.
    body = next(b for n in range(1000) if zlib.crc32(b := n.to_bytes(4, "big")) & 0x80000000)
    assert body_crc(body) == zlib.crc32(body) & BODY_CRC_MASK < 0x80000000
