"""MappedFile.write_through: bytes written through the descriptor are what the mapping and a reopened file hold."""

from __future__ import annotations

from pathlib import Path

import pytest

from tieredstore.local.mapped_file import MappedFile


def test_a_write_through_the_descriptor_is_seen_by_the_mapping_and_survives_reopening(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000"
    file = MappedFile.create_or_resume(path, 0, 1 << 16)
    try:
        file.buffer[0:5] = b"mmap:"
        file.write_through(5, memoryview(b"pwrite across a page: " + bytes(range(256)) * 20)[:5000])
        assert file.read(0, 10) == b"mmap:pwrit"
        assert file.buffer[5 + 4999] == (4999 - 22) % 256
        file.flush()
        with pytest.raises(ValueError, match="do not fit"):
            file.write_through((1 << 16) - 3, b"four")
        assert file.read((1 << 16) - 3, 3) == bytes(3)  # nothing of a refused write lands
    finally:
        file.close()
    reopened = MappedFile(path, 0, writable=False)
    try:
        assert reopened.read(0, 27) == b"mmap:pwrite across a page: "
    finally:
        reopened.close()
    with pytest.raises(ValueError, match="closed"):
        file.write_through(0, b"late")
