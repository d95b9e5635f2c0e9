"""Restore reads several queues at once and ahead of the writes; the first failure stops them all."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.cli.helpers import Node, hot_records, without_physical_offset
from tests.cli.test_restore import TOPIC, archive, produce
from tieredstore.cli.app import EXIT_INTEGRITY
from tieredstore.errors import StoreFullError
from tieredstore.local import LocalMessageStore
from tieredstore.local.store import JoinedRecords

COUNTS = {0: 130, 1: 75, 2: 1, 3: 96, 4: 58}


def produce_queues(node: Node) -> dict[int, dict[int, bytes]]:
    for queue_id, count in COUNTS.items():
        produce(node, queue_id, count)
    archive(node)
    return {queue_id: hot_records(node.hot_dir, TOPIC, queue_id) for queue_id in COUNTS}


def assert_restored(hot_dir: Path, originals: dict[int, dict[int, bytes]]) -> None:
    for queue_id, records in originals.items():
        back = hot_records(hot_dir, TOPIC, queue_id)
        assert sorted(back) == sorted(records) == list(range(COUNTS[queue_id])), queue_id
        for offset, raw in records.items():
            assert without_physical_offset(back[offset]) == without_physical_offset(raw), (queue_id, offset)


def test_queues_restored_at_once_land_byte_identical_at_their_offsets(node: Node) -> None:
    originals = produce_queues(node)
    shutil.rmtree(node.hot_dir)
    restored = node(
        "restore", TOPIC, "--to-store", str(node.hot_dir), "--parallel", "3", "--batch", "16", output="json"
    )
    assert restored.exit_code == 0, restored.stderr
    summary = restored.json()
    assert summary["messages"] == sum(COUNTS.values())
    assert {q["queue_id"]: q["restored"] for q in summary["queues"]} == COUNTS
    assert 0 < summary["peak_bytes_in_flight"] <= 32 << 20
    assert_restored(node.hot_dir, originals)
    # The queues interleave in the hot commit log, yet each queue's units point at its records in order.
    with LocalMessageStore(node.hot_dir, read_only=True) as hot:
        positions = {q: [hot.cq_unit(TOPIC, q, o).commitlog_offset for o in range(n)] for q, n in COUNTS.items()}
    assert all(p == sorted(p) for p in positions.values())
    assert max(positions[1]) > min(positions[0][-16:]) or max(positions[0]) > min(positions[1][-16:])


def test_an_interrupted_parallel_restore_resumes_every_queue_without_duplicates(
    posix: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    originals = produce_queues(posix)
    target = posix.data_dir / "target"
    real = LocalMessageStore.restore_messages
    calls = {"n": 0}
    written = dict.fromkeys(COUNTS, 0)
    batch_sizes: list[int] = []

    def failing(store: LocalMessageStore, topic: str, queue_id: int, records: JoinedRecords) -> object:
        calls["n"] += 1
        batch_sizes.append(len(records))
        if calls["n"] == 12:
            raise StoreFullError("the disk filled up (test)")
        result = real(store, topic, queue_id, records)
        written[queue_id] += len(records)
        return result

    with monkeypatch.context() as patched:
        patched.setattr(LocalMessageStore, "restore_messages", failing)
        first = posix("restore", TOPIC, "--to-store", str(target), "--parallel", "3", "--batch", "10")
    assert first.exit_code != 0
    assert "the disk filled up" in first.stderr
    held = {q: len(hot_records(target, TOPIC, q)) for q in COUNTS}
    # Several queues were under way at once when it stopped.
    assert sum(1 for q, n in held.items() if 0 < n < COUNTS[q]) >= 2, held
    # Eleven whole batches (of at most --batch messages) were written before the twelfth failed, none of
    # it, and none after it.
    assert calls["n"] == 12 and max(batch_sizes) <= 10
    assert held == written, (held, written)

    rest = posix("restore", TOPIC, "--to-store", str(target), "--parallel", "3", "--batch", "10", output="json")
    assert rest.exit_code == 0, rest.stderr
    queues = {q["queue_id"]: q for q in rest.json()["queues"]}
    assert {q: queues[q]["already_done"] for q in COUNTS} == held
    assert {q: queues[q]["restored"] for q in COUNTS} == {q: COUNTS[q] - held[q] for q in COUNTS}
    assert_restored(target, originals)


def _flip_in_cold_commit_log(root: Path, needle: bytes) -> None:
    """Flip one byte of ``needle`` (part of one record's body) where the cold commit log holds it."""
    found = [
        path
        for path in root.rglob("*")
        if path.is_file() and "COMMIT_LOG" in path.as_posix() and needle in path.read_bytes()
    ]
    assert len(found) == 1, found
    data = bytearray(found[0].read_bytes())
    data[data.index(needle) + len(needle) - 1] ^= 0x01
    found[0].write_bytes(bytes(data))


def test_a_corrupt_record_mid_batch_fails_the_restore_and_nothing_of_its_batch_is_written(posix: Node) -> None:
    produce_queues(posix)
    _flip_in_cold_commit_log(posix.data_dir, b"order 3-47")
    target = posix.data_dir / "target"
    result = posix("restore", TOPIC, "--to-store", str(target), "--parallel", "4", "--batch", "10")
    assert result.exit_code != 0
    assert "CRC" in result.stderr and "Orders/3" in result.stderr
    # The batches before the one holding the corrupt record (offset 47) were written, that one (of at
    # most 10 messages) and none after it.
    written = sorted(hot_records(target, TOPIC, 3))
    assert written == list(range(len(written))) and 47 - 10 < len(written) <= 47


@pytest.mark.parametrize("fmt", ["raw", "jsonl"])
def test_an_export_stops_at_a_corrupt_record_naming_it_in_every_format(posix: Node, fmt: str) -> None:
    produce_queues(posix)
    _flip_in_cold_commit_log(posix.data_dir, b"order 3-47")
    target = posix.data_dir / "export"
    result = posix("restore", TOPIC, "--queue", "3", "--to-dir", str(target), "--format", fmt, "--batch", "10")
    assert result.exit_code == EXIT_INTEGRITY, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "CRC" in lines[0] and f"{TOPIC}/3 at queue offset 47" in lines[0], result.stderr
    # What was exported is the batches before the one holding record 47, which was not written.
    exported = (target / TOPIC / f"3.{fmt}").read_bytes()
    assert 47 - 10 <= exported.count(b"order 3-") <= 47, exported.count(b"order 3-")
