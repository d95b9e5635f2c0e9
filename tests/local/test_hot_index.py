"""The hot store's key index: RocketMQ's IndexFile under <hot>/index, found by key, rebuilt, deleted, followed."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from tieredstore.formats.index_file import RocketMQIndexFile, index_file_size, key_hash
from tieredstore.formats.message import java_string_hash
from tieredstore.local import HotStoreFollower, LocalMessageStore, LocalStoreConfig, PutRequest
from tieredstore.local.index_file import HotKeyIndex, KeyEntry

from .conftest import abandon, mapped_rss, small_config
from .test_crash import run_and_kill

HOUR_MS = 3_600_000
SLOTS, ITEMS = 8, 5  # four keys a file: tests roll files quickly


def keyed_config(**overrides: object) -> LocalStoreConfig:
    return small_config(index_slot_count=SLOTS, index_max_items=ITEMS, **overrides)


def index_files(root: Path) -> list[RocketMQIndexFile]:
    """Every index file under ``root/index`` read with the format reader, oldest first."""
    return [
        RocketMQIndexFile(path.read_bytes(), slot_capacity=SLOTS, item_capacity=ITEMS, location=str(path))
        for path in sorted((root / "index").iterdir())
    ]


def items_indexed(root: Path) -> int:
    return sum(index.header.item_count for index in index_files(root))


def found(store: LocalMessageStore, key: str, max_count: int = 100, topic: str = "T") -> list[tuple[int, int]]:
    return [(hit.queue_id, hit.queue_offset) for hit in store.query_keys(topic, key, max_count)]


def put_orders(store: LocalMessageStore, first: int, count: int) -> None:
    """Message n (queue n % 2): keys order-n and customer-(n % 3), UNIQ_KEY U<n>."""
    for n in range(first, first + count):
        store.put_message(
            "T",
            n % 2,
            f"order {n}".encode(),
            keys=[f"order-{n}", f"customer-{n % 3}"],
            properties={"UNIQ_KEY": f"U{n}"},
        )


def test_keys_of_single_and_batched_puts_are_found_newest_first(tmp_path: Path) -> None:
    with LocalMessageStore(tmp_path, config=keyed_config()) as store:
        put_orders(store, 0, 6)
        store.put_messages(
            [PutRequest("T", 0, b"batched", ["customer-1"]), PutRequest("Other", 0, b"other topic", ["customer-1"])]
        )
        assert sorted(found(store, "customer-1")) == [(0, 2), (0, 3), (1, 0)]  # messages 4, 6 (batched), 1
        # Newest first; puts (no longer slowed by index writes) often share a millisecond, and those go by
        # queue id, then queue offset.
        order = [(hit.store_timestamp, hit.queue_id, hit.queue_offset) for hit in store.query_keys("T", "customer-1")]
        assert order == sorted(order, reverse=True)
        assert found(store, "customer-1", max_count=2) == [(0, 3), (0, 2)]
        assert found(store, "order-5") == [(1, 2)]
        assert [hit.record.body for hit in store.query_keys("T", "U4")] == [b"order 4"]
        assert found(store, "customer-1", topic="Other") == [(0, 0)]
        assert found(store, "order") == [] and found(store, "order-99") == []
        # time bounds are the records' own store timestamps
        newest = store.query_keys("T", "customer-1", 1)[0].store_timestamp
        assert all(hit.store_timestamp <= newest for hit in store.query_keys("T", "customer-1", 100, 0, newest))
        assert store.query_keys("T", "customer-1", 100, newest + 1, newest + HOUR_MS) == []


def test_a_large_batch_is_found_by_every_key_across_the_index_files_it_fills(tmp_path: Path) -> None:
    with LocalMessageStore(tmp_path, config=keyed_config()) as store:
        put_orders(store, 0, 1)
        keys = {n: [f"order-{n}", f"customer-{n % 3}"] for n in range(1, 21)}
        unique = {n: {"UNIQ_KEY": f"U{n}"} for n in keys}
        store.put_messages([PutRequest("T", n % 2, b"m", keys[n], properties=unique[n]) for n in keys])
        store.flush()  # the flush indexes what puts recorded
        assert items_indexed(tmp_path) == 63 and len(index_files(tmp_path)) == 16
        for n in range(21):
            assert found(store, f"order-{n}") == found(store, f"U{n}") == [(n % 2, n // 2)]
        assert sorted(found(store, "customer-2", max_count=3)) == [(0, 7), (0, 10), (1, 8)]  # messages 14, 20, 17


def test_a_batch_writes_the_index_files_that_its_records_added_one_by_one_write(tmp_path: Path) -> None:
    """Slots shared within the batch and with items already in the file, files rolled mid-batch, two topics."""
    entries: list[KeyEntry] = [
        ("T" if n % 5 else "Other", (f"U{n}", f"order-{n}", f"customer-{n % 3}"), 1000 * n, 1_700_000_000_000 + 400 * n)
        for n in range(40)
    ]  # fmt: skip
    one_by_one = HotKeyIndex(tmp_path / "one", slot_capacity=SLOTS, item_capacity=64, writable=True)
    batched = HotKeyIndex(tmp_path / "batched", slot_capacity=SLOTS, item_capacity=64, writable=True)
    for entry in entries:
        one_by_one.add(*entry)
    for entry in entries[:3]:
        batched.add(*entry)
    batched.add_many(entries[3:])
    one_by_one.flush()
    batched.flush()
    written = [[(root / name).read_bytes() for name in index.files()] for root, index in
               ((tmp_path / "one", one_by_one), (tmp_path / "batched", batched))]  # fmt: skip
    assert len(written[0]) == 2 and written[0] == written[1]
    assert list(batched.lookup("Other", "order-35", 0, 2**62)) == [35_000]
    one_by_one.close()
    batched.close()


def test_our_index_files_are_rocketmq_index_files_the_format_reader_reads(tmp_path: Path) -> None:
    with LocalMessageStore(tmp_path, config=keyed_config()) as store:
        put_orders(store, 0, 5)  # 15 keys: four files of four items
        positions = {n: store.cq_unit("T", n % 2, n // 2).commitlog_offset for n in range(5)}
    files = index_files(tmp_path)
    assert [index.header.item_count for index in files] == [4, 4, 4, 3]
    assert all(len(path.name) == 17 and path.name.isdigit() for path in (tmp_path / "index").iterdir())
    assert {path.stat().st_size for path in (tmp_path / "index").iterdir()} == {index_file_size(SLOTS, ITEMS)}
    first = files[0]
    assert (first.header.begin_physical_offset, first.header.index_count) == (positions[0], 5)
    every_hit = [offset for index in files for offset in index.lookup("T#customer-1", 0, 2**62)]
    assert sorted(every_hit) == [positions[1], positions[4]]
    assert [offset for index in files for offset in index.lookup("T#U3", 0, 2**62)] == [positions[3]]


def test_a_forced_hash_collision_is_not_returned_for_the_other_key(tmp_path: Path) -> None:
    assert java_string_hash("T#Aa") == java_string_hash("T#BB")
    assert key_hash("T", "Aa") == key_hash("T", "BB")
    with LocalMessageStore(tmp_path, config=keyed_config()) as store:
        for n in range(6):
            store.put_message("T", 0, f"m{n}".encode(), keys=["Aa" if n % 2 else "BB"])
        assert found(store, "Aa") == [(0, 5), (0, 3), (0, 1)]
        assert found(store, "BB", max_count=2) == [(0, 4), (0, 2)]


def test_the_index_survives_a_crash_without_counting_a_key_twice(tmp_path: Path) -> None:
    store = LocalMessageStore(tmp_path, config=keyed_config())
    put_orders(store, 0, 4)
    store.flush()
    put_orders(store, 4, 4)  # past the checkpoint: recovery scans these again
    abandon(store)
    with LocalMessageStore(tmp_path, config=keyed_config()) as reopened:
        assert not reopened.recovery.clean
        assert found(reopened, "customer-1") == [(1, 3), (0, 2), (1, 0)]
        assert found(reopened, "U7") == [(1, 3)]
    assert items_indexed(tmp_path) == 8 * 3


def test_items_the_index_lost_past_the_checkpoint_are_added_again_from_the_commit_log(tmp_path: Path) -> None:
    store = LocalMessageStore(tmp_path, config=keyed_config())
    put_orders(store, 0, 3)
    store.flush()
    durable = tmp_path.parent / "index-at-checkpoint"
    shutil.copytree(tmp_path / "index", durable)
    put_orders(store, 3, 3)
    abandon(store)
    # A machine crash: the index pages written after the checkpoint never reached the disk.
    shutil.rmtree(tmp_path / "index")
    shutil.copytree(durable, tmp_path / "index")
    with LocalMessageStore(tmp_path, config=keyed_config()) as reopened:
        assert found(reopened, "order-5") == [(1, 2)]
        assert found(reopened, "customer-0") == [(1, 1), (0, 0)]
    assert items_indexed(tmp_path) == 6 * 3


@pytest.mark.parametrize("damage", ["newest header", "oldest slot"])
def test_a_torn_index_file_is_rebuilt_from_the_commit_log(tmp_path: Path, damage: str) -> None:
    store = LocalMessageStore(tmp_path, config=keyed_config())
    put_orders(store, 0, 6)
    store.flush()
    abandon(store)
    paths = sorted((tmp_path / "index").iterdir())
    path = paths[-1] if damage == "newest header" else paths[0]
    torn = bytearray(path.read_bytes())
    if damage == "newest header":
        torn[:40] = b"\xa5" * 40  # a header no writer left
    else:
        slot = 40 + 4 * (key_hash("T", "order-0") % SLOTS)
        torn[slot : slot + 4] = ITEMS.to_bytes(4, "big")  # past the items the file counts
    path.write_bytes(bytes(torn))
    with LocalMessageStore(tmp_path, config=keyed_config()) as reopened:
        assert found(reopened, "customer-2") == [(1, 2), (0, 1)]
        assert found(reopened, "order-0") == [(0, 0)]
    assert items_indexed(tmp_path) == 6 * 3


def test_a_store_that_has_no_index_yet_indexes_its_commit_log_at_open(tmp_path: Path) -> None:
    with LocalMessageStore(tmp_path, config=keyed_config()) as store:
        put_orders(store, 0, 4)
    shutil.rmtree(tmp_path / "index")  # as a store written before the hot index existed
    with LocalMessageStore(tmp_path, config=keyed_config()) as reopened:
        assert reopened.recovery.clean
        assert found(reopened, "customer-0") == [(1, 1), (0, 0)]
    assert items_indexed(tmp_path) == 4 * 3


def test_hot_retention_deletes_index_files_whose_records_are_all_gone(tmp_path: Path) -> None:
    config = keyed_config(hot_retention_hours=0)
    with LocalMessageStore(tmp_path, config=config) as store:
        for n in range(100):
            store.put_message("T", 0, b"p" * 3000, keys=[f"k{n}"])  # five 64 KiB commit-log files
        store.flush()  # the flush indexes what puts recorded
        before = sorted(path.name for path in (tmp_path / "index").iterdir())
        assert len(before) == 25 and found(store, "k0") == [(0, 0)]
        report = store.delete_expired(lambda topic, queue_id: 100, now_ms=int(time.time() * 1000) + HOUR_MS)
        assert len(report.commit_log_files) == 4
        after = sorted(path.name for path in (tmp_path / "index").iterdir())
        assert report.index_files == before[: len(before) - len(after)] and len(after) < len(before)
        first_kept = store.min_offset("T", 0)
        assert len(report.index_files) == first_kept // (ITEMS - 1)  # the files of messages all below it
        # every kept file still indexes a record in the hot store; every deleted one indexed only gone ones
        assert all(index.header.end_physical_offset >= store.commitlog_min_offset for index in index_files(tmp_path))
        assert found(store, "k0") == [] and found(store, f"k{first_kept}") == [(0, first_kept)]
        assert found(store, "k99") == [(0, 99)]


def test_a_read_only_store_and_a_follower_read_the_index_the_writer_is_writing(tmp_path: Path) -> None:
    """Keys are indexed off the put path (as RocketMQ's reput thread does), so other readers see a put's keys
    once the writer's periodic flush (called here) has indexed them."""
    with LocalMessageStore(tmp_path, config=keyed_config()) as writer:
        put_orders(writer, 0, 3)
        writer.flush()
        with (
            LocalMessageStore(tmp_path, config=keyed_config(), read_only=True) as reader,
            HotStoreFollower(tmp_path, config=keyed_config(), refresh_interval=0.0) as follower,
        ):
            assert found(reader, "customer-1") == [(1, 0)]
            assert found(follower, "customer-1") == [(1, 0)]
            put_orders(writer, 3, 5)  # new items in new index files
            writer.flush()
            assert found(follower, "customer-1") == [(1, 3), (0, 2), (1, 0)]
            assert found(follower, "U6") == [(0, 3)]


def test_puts_are_indexed_in_batches_off_the_put_path_and_found_at_once_by_their_writer(tmp_path: Path) -> None:
    """A put only records its keys; the writer's lookup or periodic flush indexes them in one batch. The
    writing process finds a put by key at once, another reader after the flush, and keys still pending at
    a crash are indexed again by recovery."""
    writer = LocalMessageStore(tmp_path, config=keyed_config())
    put_orders(writer, 0, 3)
    with HotStoreFollower(tmp_path, config=keyed_config(), refresh_interval=0.0) as follower:
        assert items_indexed(tmp_path) == 0 and found(follower, "customer-1") == []
        assert found(writer, "customer-1") == [(1, 0)]
        assert items_indexed(tmp_path) == 3 * 3 and found(follower, "customer-1") == [(1, 0)]
        put_orders(writer, 3, 2)
        assert found(follower, "U4") == []
        writer.flush()
        assert found(follower, "U4") == [(0, 2)] and items_indexed(tmp_path) == 5 * 3
    put_orders(writer, 5, 2)  # pending when the writer dies
    abandon(writer)
    with LocalMessageStore(tmp_path, config=keyed_config()) as reopened:
        assert found(reopened, "customer-0") == [(0, 3), (1, 1), (0, 0)]
        assert [found(reopened, f"U{n}") for n in range(7)] == [[(n % 2, n // 2)] for n in range(7)]
        assert items_indexed(tmp_path) == 7 * 3


def test_a_writer_keeps_only_the_index_file_it_fills_in_its_rss(tmp_path: Path) -> None:
    config = small_config(index_slot_count=1024, index_max_items=4096)
    file_size = index_file_size(1024, 4096)
    with LocalMessageStore(tmp_path, config=config) as store:
        store.put_messages([PutRequest("T", 0, b"m", [f"k{n}"]) for n in range(3 * 4095 + 10)])
        store.flush()
        assert len(list((tmp_path / "index").iterdir())) == 4
        assert mapped_rss(tmp_path / "index") <= file_size
        assert found(store, "k0") == [(0, 0)]  # a released file is read again on demand


def test_index_files_of_other_capacities_are_rebuilt_with_the_settings_now_in_force(tmp_path: Path) -> None:
    with LocalMessageStore(tmp_path, config=keyed_config()) as store:
        put_orders(store, 0, 4)
    wider = small_config(index_slot_count=64, index_max_items=100)
    with LocalMessageStore(tmp_path, config=wider) as reopened:
        assert found(reopened, "customer-0") == [(1, 1), (0, 0)]
        put_orders(reopened, 4, 1)
        assert found(reopened, "customer-1") == [(0, 2), (1, 0)]
    (only,) = (tmp_path / "index").iterdir()
    assert only.stat().st_size == index_file_size(64, 100)
    rebuilt = RocketMQIndexFile(only.read_bytes(), slot_capacity=64, item_capacity=100)
    assert rebuilt.header.item_count == 5 * 3


@pytest.mark.reliability
def test_every_put_a_sigkilled_writer_acknowledged_is_found_by_its_key_once(tmp_path: Path) -> None:
    acknowledged: dict[tuple[int, int], int] = {}
    for round_ in range(2):
        bodies = run_and_kill(tmp_path, round_, 300)  # each message has the key k<i>
        acknowledged |= {where: int(body.split(b":")[2].split(b"|")[0]) for where, body in bodies.items()}
        with LocalMessageStore(tmp_path, config=small_config(consume_queue_units_per_file=50)) as store:
            assert not store.recovery.clean
            for (queue_id, queue_offset), i in acknowledged.items():
                hits = store.query_keys("crash", f"k{i}", 1000)
                assert (queue_id, queue_offset) in [(hit.queue_id, hit.queue_offset) for hit in hits]
                assert all(f"k{i}" in hit.record.keys for hit in hits)
            stored = sum(store.max_offset("crash", queue_id) for queue_id in range(3))
        indexes = [
            RocketMQIndexFile(path.read_bytes(), slot_capacity=100_000, item_capacity=400_000)
            for path in sorted((tmp_path / "index").iterdir())
        ]
        assert sum(index.header.item_count for index in indexes) == stored  # one key each, none twice
