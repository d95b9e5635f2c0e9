"""Local index files: puts and lookups, crash recovery of a torn tail, sealing, compaction, segment lookups."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.index.helpers import CountingProvider
from tieredstore.errors import CorruptRecordError, IntegrityError, ValidationError
from tieredstore.formats.index_file import key_hash, slot_of
from tieredstore.formats.naming import FileType
from tieredstore.index.file import CompactedIndexFile, UnsealedIndexFile, compact_file, lookup_segment
from tieredstore.index.format import (
    IndexItem,
    encode_unsealed_item,
    unsealed_item_position,
    unsealed_slot_position,
)

BASE = 1_786_000_000_000


def _item(key: str, offset: int, *, topic_id: int = 1, ts: int = BASE) -> IndexItem:
    return IndexItem(topic_id, 0, offset, 100, key_hash("T", key), ts)


def _new(path: Path, *, slot_count: int = 8, max_items: int = 100) -> UnsealedIndexFile:
    return UnsealedIndexFile.create(
        path, file_id=1, created_at=BASE, base_timestamp=BASE, slot_count=slot_count, max_items=max_items
    )


def _offsets(items: list[IndexItem]) -> list[int]:
    return [item.queue_offset for item in items]


def test_put_then_lookup_sees_items_before_and_after_flush(tmp_path: Path) -> None:
    with _new(tmp_path / "a.index") as index_file:
        for n in range(20):
            assert index_file.put(_item(f"k{n % 4}", n, ts=BASE + n))
        assert _offsets(index_file.lookup(key_hash("T", "k1"))) == [17, 13, 9, 5, 1]
        index_file.flush()
        assert _offsets(index_file.lookup(key_hash("T", "k1"))) == [17, 13, 9, 5, 1]
        assert (index_file.begin_timestamp, index_file.end_timestamp) == (BASE, BASE + 19)
    with UnsealedIndexFile.open(tmp_path / "a.index") as reopened:
        assert reopened.item_count == 20
        assert _offsets(reopened.lookup(key_hash("T", "k3"))) == [19, 15, 11, 7, 3]
        assert reopened.lookup(key_hash("T", "absent")) == []


def test_file_reports_full_at_max_items(tmp_path: Path) -> None:
    with _new(tmp_path / "a.index", max_items=3) as index_file:
        assert [index_file.put(_item("k", n)) for n in range(4)] == [True, True, True, False]
        assert index_file.is_full
        assert _offsets(index_file.lookup(key_hash("T", "k"))) == [2, 1, 0]


def test_timestamp_beyond_the_time_diff_range_is_refused_not_wrapped(tmp_path: Path) -> None:
    with _new(tmp_path / "a.index") as index_file:
        assert not index_file.put(_item("k", 1, ts=BASE + 2**31))
        assert index_file.item_count == 0


def test_slots_on_disk_point_only_to_flushed_items(tmp_path: Path) -> None:
    path = tmp_path / "a.index"
    with _new(path, slot_count=1) as index_file:
        index_file.put(_item("k", 0))
        index_file.flush()
        index_file.put(_item("k", 1))
        on_disk = path.read_bytes()
        assert int.from_bytes(on_disk[unsealed_slot_position(0) : unsealed_slot_position(0) + 4], "big") == 1


def test_torn_tail_is_dropped_on_reopen_and_never_served(tmp_path: Path) -> None:
    path = tmp_path / "a.index"
    with _new(path) as index_file:
        for n in range(10):
            index_file.put(_item(f"k{n}", n))
        index_file.flush()
        for n in range(10, 15):
            index_file.put(_item(f"k{n}", n))
    # the crash tore item 13 (the third unflushed one) in half; 14 and 15 landed whole
    data = bytearray(path.read_bytes())
    torn = unsealed_item_position(8, 13)
    data[torn + 18 : torn + 36] = bytes(18)
    path.write_bytes(bytes(data))
    with UnsealedIndexFile.open(path) as recovered:
        assert recovered.item_count == 12
        assert _offsets(recovered.lookup(key_hash("T", "k11"))) == [11]
        assert recovered.lookup(key_hash("T", "k12")) == []
        assert recovered.lookup(key_hash("T", "k13")) == []
        assert recovered.put(_item("fresh", 99))
        recovered.flush()
    with UnsealedIndexFile.open(path) as again:
        assert again.item_count == 13
        assert _offsets(again.lookup(key_hash("T", "fresh"))) == [99]
        assert again.lookup(key_hash("T", "k13")) == []


def test_unflushed_items_that_landed_whole_survive_reopen(tmp_path: Path) -> None:
    path = tmp_path / "a.index"
    with _new(path, slot_count=2) as index_file:
        for n in range(6):
            index_file.put(_item(f"k{n % 3}", n))
        index_file.flush()
        for n in range(6, 9):
            index_file.put(_item(f"k{n % 3}", n))
    with UnsealedIndexFile.open(path) as recovered:
        assert recovered.item_count == 9
        assert _offsets(recovered.lookup(key_hash("T", "k0"))) == [6, 3, 0]


def test_chain_link_pointing_forward_is_an_error_not_a_loop(tmp_path: Path) -> None:
    path = tmp_path / "a.index"
    with _new(path, slot_count=1) as index_file:
        index_file.put(_item("k", 0))
        index_file.put(_item("k", 1))
        index_file.flush()
        # a well-formed item 1 (valid CRC) whose link points at item 2: a cycle 2 -> 1 -> 2
        pos = unsealed_item_position(1, 1)
        index_file._map[pos : pos + 36] = encode_unsealed_item(_item("k", 0), BASE, 2)
        with pytest.raises(CorruptRecordError, match="links forward"):
            index_file.lookup(key_hash("T", "k"))


def test_corrupt_header_is_a_typed_error(tmp_path: Path) -> None:
    path = tmp_path / "a.index"
    _new(path).close()
    data = bytearray(path.read_bytes())
    data[30] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError, match="header CRC"):
        UnsealedIndexFile.open(path)
    path.write_bytes(bytes(data[:100]))
    with pytest.raises(IntegrityError):
        UnsealedIndexFile.open(path)


def test_seal_refuses_puts_and_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "a.index"
    with _new(path) as index_file:
        index_file.put(_item("k", 0))
        index_file.seal()
        assert not index_file.put(_item("k", 1))
    with UnsealedIndexFile.open(path) as reopened:
        assert reopened.is_sealed
        assert not reopened.put(_item("k", 2))
        assert _offsets(reopened.lookup(key_hash("T", "k"))) == [0]


def test_only_sealed_files_are_compacted(tmp_path: Path) -> None:
    with _new(tmp_path / "a.index") as index_file:
        index_file.put(_item("k", 0))
        index_file.flush()
    with pytest.raises(ValidationError, match="not sealed"):
        compact_file(tmp_path / "a.index", tmp_path / "a.compacted")


async def test_compacted_file_answers_like_the_sealed_one_with_two_reads(tmp_path: Path) -> None:
    sealed_path, compacted_path = tmp_path / "a.index", tmp_path / "a.compacted"
    keys = [f"key-{n}" for n in range(40)]
    with _new(sealed_path, slot_count=16, max_items=500) as index_file:
        for n in range(300):
            index_file.put(_item(keys[n % 40], n, ts=BASE + n))
        index_file.seal()
        expected = {key: index_file.lookup(key_hash("T", key)) for key in keys}
    header = compact_file(sealed_path, compacted_path)
    assert not (tmp_path / "a.compacted.tmp").exists()
    assert (header.item_count, header.begin_timestamp, header.end_timestamp) == (300, BASE, BASE + 299)
    with CompactedIndexFile(compacted_path) as local:
        assert local.header == header
        for key in keys:
            assert local.lookup(key_hash("T", key)) == expected[key]

    provider = CountingProvider()
    segment = provider.segment(FileType.INDEX, "c/b/rmq_sys_INDEX/0", 1)
    segment.append(compacted_path.read_bytes())
    await segment.commit()
    for key in keys:
        provider.reads.clear()
        assert await lookup_segment(segment, header, key_hash("T", key)) == expected[key]
        assert len(provider.reads) == 2


async def test_an_uploaded_lookup_reads_the_slot_then_its_items_and_stops_at_an_empty_slot(tmp_path: Path) -> None:
    """Two ranged reads where the key's slot holds items; one where it is empty (there is nothing to read)."""
    with _new(tmp_path / "a.index", slot_count=64, max_items=10) as index_file:
        index_file.put(_item("present", 7))
        index_file.seal()
    header = compact_file(tmp_path / "a.index", tmp_path / "a.compacted")
    provider = CountingProvider()
    segment = provider.segment(FileType.INDEX, "c/b/rmq_sys_INDEX/0", 1)
    segment.append((tmp_path / "a.compacted").read_bytes())
    await segment.commit()
    used = slot_of(key_hash("T", "present"), 64)
    absent = next(key for key in (f"absent-{n}" for n in range(100)) if slot_of(key_hash("T", key), 64) != used)
    provider.reads.clear()
    assert [item.queue_offset for item in await lookup_segment(segment, header, key_hash("T", "present"))] == [7]
    assert len(provider.reads) == 2
    provider.reads.clear()
    assert await lookup_segment(segment, header, key_hash("T", absent)) == []
    assert len(provider.reads) == 1


async def test_segment_shorter_than_catalogued_is_an_integrity_error(tmp_path: Path) -> None:
    with _new(tmp_path / "a.index", slot_count=4) as index_file:
        index_file.put(_item("k", 0))
        index_file.seal()
    header = compact_file(tmp_path / "a.index", tmp_path / "a.compacted")
    provider = CountingProvider()
    segment = provider.segment(FileType.INDEX, "c/b/rmq_sys_INDEX/0", 1)
    segment.append((tmp_path / "a.compacted").read_bytes()[:-5])
    await segment.commit()
    with pytest.raises(IntegrityError):
        await lookup_segment(segment, header, key_hash("T", "k"))


@settings(max_examples=25, deadline=None)
@given(
    keyed=st.lists(
        st.tuples(st.sampled_from(["Aa", "BB", "AaAa", "BBBB", "AaBB", "x", "y", "order-1"]), st.integers(0, 10_000)),
        max_size=80,
    ),
    slot_count=st.integers(1, 9),
)
def test_every_stage_finds_exactly_the_items_of_each_key(keyed: list[tuple[str, int]], slot_count: int) -> None:
    """Unsealed, reopened, and compacted: a lookup by hash returns exactly that hash's items, newest first."""
    items = [_item(key, offset, ts=BASE + ts) for offset, (key, ts) in enumerate(keyed)]
    hashes = {item.key_hash for item in items} | {key_hash("T", "absent")}
    with tempfile.TemporaryDirectory() as directory:
        sealed_path, compacted_path = Path(directory) / "a.index", Path(directory) / "a.compacted"
        with _new(sealed_path, slot_count=slot_count, max_items=max(1, len(items))) as index_file:
            for item in items:
                assert index_file.put(item)
            index_file.seal()
        compact_file(sealed_path, compacted_path)
        with UnsealedIndexFile.open(sealed_path) as sealed, CompactedIndexFile(compacted_path) as compacted:
            for hash_value in hashes:
                expected = [item for item in reversed(items) if item.key_hash == hash_value]
                assert sealed.lookup(hash_value) == expected
                assert compacted.lookup(hash_value) == expected
