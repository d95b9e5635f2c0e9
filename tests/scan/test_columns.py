"""Batches built a run at a time hold exactly the rows the record-by-record decoder builds (no Spark session)."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.spark.helpers import Archive, archive_messages, make_message, store_timestamp
from tieredstore.formats.message import PROPERTY_TAGS, PROPERTY_UNIQ_KEY, HostAddress
from tieredstore.scan import ScanOptions, plan_partitions, read_partition, reading
from tieredstore.scan.columns import RowProperties
from tieredstore.scan.filters import ScanFilter
from tieredstore.scan.properties import split_pairs
from tieredstore.scan.reading import PartitionScanner
from tieredstore.scan.schema import ARROW_SCHEMA

TOPIC = "mixed"


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Archive:
    """Two queues of messages in every layout, with a consume-queue hole, unicode and repeated-looking properties."""
    root = tmp_path_factory.mktemp("spark-columns")
    archive = Archive("posix", str(root / "cold"), f"sqlite:///{root / 'metadata.db'}")
    messages = {
        (TOPIC, 0): [make_message(TOPIC, 0, offset) for offset in [*range(0, 150), *range(170, 400)]],
        (TOPIC, 1): [make_message(TOPIC, 1, offset, body_size=64) for offset in range(300)],
    }
    for message in messages[(TOPIC, 1)][::5]:
        message.properties["NOTE"] = "déjà vu"
    for message in messages[(TOPIC, 1)][1::7]:
        message.properties["KEYS"] = "  a  b "
    asyncio.run(archive_messages(archive, {}, messages))
    return archive


def _rows(archive: Archive, columns: tuple[str, ...], scan_filter: ScanFilter | None = None) -> list[dict[str, Any]]:
    scan_options = ScanOptions.parse({"path": TOPIC, "batch_rows": "97", **archive.options()})
    return [
        row
        for plan in plan_partitions(scan_options, scan_filter or ScanFilter())
        for batch in read_partition(plan, scan_options, columns=columns)
        for row in batch.to_pylist()
    ]


@pytest.mark.parametrize(
    "columns", [tuple(ARROW_SCHEMA.names), ("body", "queue_offset"), ("msg_id", "tags", "keys", "properties")]
)
def test_runs_and_single_records_build_the_same_rows(
    mixed: Archive, columns: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    by_runs = _rows(mixed, columns)
    monkeypatch.setattr(PartitionScanner, "_decode_run", lambda self, limit: None)
    one_by_one = _rows(mixed, columns)
    assert len(by_runs) == 680
    assert by_runs == one_by_one
    assert list(by_runs[0]) == list(columns)


def test_pushed_ranges_keep_the_same_rows(mixed: Archive, monkeypatch: pytest.MonkeyPatch) -> None:
    scan_filter = ScanFilter(
        queue_offset_start=20, queue_offset_end=260, timestamp_start_us=store_timestamp(0, 100) * 1000 + 1
    )
    by_runs = _rows(mixed, ("queue_id", "queue_offset", "store_timestamp"), scan_filter)
    monkeypatch.setattr(PartitionScanner, "_decode_run", lambda self, limit: None)
    assert by_runs == _rows(mixed, ("queue_id", "queue_offset", "store_timestamp"), scan_filter)
    assert 0 < len(by_runs) < 480
    assert all(20 <= row["queue_offset"] < 260 for row in by_runs)


def test_a_batch_of_common_records_is_one_run_of_one_window(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Joining batches copies every column again; records that all take the run path never need it."""
    archive = Archive("posix", str(tmp_path / "cold"), f"sqlite:///{tmp_path / 'metadata.db'}")
    ipv4 = {"born_host": HostAddress("10.0.0.7", 4000), "store_host": HostAddress("10.0.0.1", 10911), "magic": None}
    plain = [dataclasses.replace(make_message("plain", 0, offset, body_size=200), **ipv4) for offset in range(300)]
    asyncio.run(archive_messages(archive, {}, {("plain", 0): plain}))

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("batches were joined")

    monkeypatch.setattr(reading.pa, "concat_batches", refuse)
    # Windows of 16 KiB hold ~50 records: a batch of 40 rows would otherwise cross a window's end.
    options = ScanOptions.parse({"path": "plain", "batch_rows": "40", "read_block_bytes": "16384", **archive.options()})
    batches = [batch for plan in plan_partitions(options) for batch in read_partition(plan, options)]
    assert [row["queue_offset"] for batch in batches for row in batch.to_pylist()] == list(range(300))
    assert all(0 < batch.num_rows <= 40 for batch in batches)


def _random_properties(rng: random.Random, *, ascii_only: bool) -> bytes:
    pieces = [b"KEYS", b"TAGS", b"UNIQ_KEY", b"a", b"b", b" ", b"\x01", b"\x02", b"\x02", b"x y"]
    if not ascii_only:
        pieces += [b"\xc3\xa9", b"\xff"]
    return b"".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))


def test_split_pairs_reads_properties_as_the_row_rules_do() -> None:
    rng = random.Random(31)
    taken = 0
    for round_index in range(300):
        raws = [_random_properties(rng, ascii_only=round_index % 4 > 0) for _ in range(rng.randint(1, 6))]
        data = np.frombuffer(b"".join(raws), dtype=np.uint8)
        offsets = np.zeros(len(raws) + 1, dtype=np.int64)
        np.cumsum([len(raw) for raw in raws], out=offsets[1:])
        pairs = split_pairs(data, offsets)
        rows = RowProperties(raws)
        if pairs is None:
            continue
        taken += 1
        map_type = ARROW_SCHEMA.field("properties").type
        assert pairs.map_array(map_type).to_pylist() == rows.map_array(map_type).to_pylist()
        keys_type = ARROW_SCHEMA.field("keys").type
        assert pairs.keys_array(keys_type).to_pylist() == rows.keys_array(keys_type).to_pylist()
        for name in (PROPERTY_TAGS, PROPERTY_UNIQ_KEY):
            for empty_is_null in (True, False):
                expected = rows.string_of(name, empty_is_null=empty_is_null)
                assert pairs.string_of(name, empty_is_null=empty_is_null).equals(expected)
    assert taken > 30  # most random runs are plain ASCII without a repeated name


def test_a_repeated_name_is_left_to_the_row_rules() -> None:
    raw = b"A\x011\x02B\x012\x02A\x013\x02"
    assert split_pairs(np.frombuffer(raw, dtype=np.uint8), np.array([0, len(raw)], dtype=np.int64)) is None
    assert RowProperties([raw]).map_array(ARROW_SCHEMA.field("properties").type).to_pylist() == [
        [("A", "3"), ("B", "2")]
    ]
