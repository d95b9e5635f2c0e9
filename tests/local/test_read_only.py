"""Read-only open of RocketMQ broker store directories: the Java and Rust fixtures and a literal record."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from tieredstore.errors import NotFoundError, ValidationError
from tieredstore.formats.consume_queue import ConsumeQueueUnit
from tieredstore.formats.message import HostAddress, java_string_hash, tag_hash
from tieredstore.local import LocalMessageStore

from .conftest import FIXTURES

JAVA = Path(FIXTURES) / "java-4x-consumequeuetest"
RUST = Path(FIXTURES) / "rust-0.9.0-writer"


def snapshot(directory: Path) -> dict[str, str]:
    return {
        str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


@pytest.fixture
def java_copy(tmp_path: Path) -> Path:
    """A writable copy, so that a stray write would succeed and be caught by the snapshot."""
    return Path(shutil.copytree(JAVA, tmp_path / "java", copy_function=shutil.copyfile))


def test_java_store_rebuilds_its_consume_queue_in_memory_and_writes_nothing(java_copy: Path) -> None:
    before = snapshot(java_copy)
    with LocalMessageStore(java_copy, read_only=True) as store:
        assert store.recovery.scanned_from == 0 and store.recovery.records_scanned == 47
        assert store.queues() == [("abc", 0)]
        assert (store.min_offset("abc", 0), store.max_offset("abc", 0)) == (0, 47)
        assert store.commitlog_max_offset == 8192  # past the blank record: the file is full
        assert store.cq_unit("abc", 0, 5) == ConsumeQueueUnit(860, 172, 2567159)
        first = store.get_message("abc", 0, 0)
        assert first.body == b"Once, there was a chance for me!"
        assert first.store_host == HostAddress("10.1.30.38", 8123)
        assert first.offset_msg_id == "0A011E2600001FBB0000000000000000"
        batch = store.read_messages("abc", 0, 40, max_count=100)
        assert [m.queue_offset for m in batch] == list(range(40, 47))
        assert [m.unit.commitlog_offset for m in batch] == [172 * i for i in range(40, 47)]
        last_stamp = store.store_timestamp("abc", 0, 46)
        assert store.offset_for_timestamp("abc", 0, last_stamp, "upper") == 46
        assert store.offset_for_timestamp("abc", 0, 1551613204834, "lower") == 0
        with pytest.raises(ValidationError, match="read-only"):
            store.put_message("abc", 0, b"nope")
        with pytest.raises(ValidationError, match="read-only"):
            store.delete_expired(lambda topic, queue_id: 10**9)
    assert snapshot(java_copy) == before
    assert sorted(p.name for p in java_copy.iterdir()) == ["commitlog"]


def test_the_fixture_directories_themselves_open_read_only() -> None:
    with LocalMessageStore(JAVA, read_only=True) as store:
        assert store.max_offset("abc", 0) == 47


def test_rust_store_uses_its_consume_queue_files() -> None:
    with LocalMessageStore(RUST, read_only=True) as store:
        # Its consume queue is trusted up to its last unit, which points at a valid record: no rebuild.
        assert store.recovery.scanned_from == 282 and store.recovery.records_scanned == 0
        assert store.queues() == [("V1UpgradeTopic", 0)]
        assert store.cq_unit("V1UpgradeTopic", 0, 0) == ConsumeQueueUnit(0, 141, 0)
        assert store.cq_unit("V1UpgradeTopic", 0, 1) == ConsumeQueueUnit(141, 141, 0)
        assert store.max_offset("V1UpgradeTopic", 0) == 2
        messages = [store.get_message("V1UpgradeTopic", 0, i) for i in range(2)]
        assert [m.body for m in messages] == [b"v0.9.0-message-0", b"v0.9.0-message-1"]
        assert messages[0].keys == ["v1-upgrade-key"] and messages[0].store_timestamp == 1786727751703
        with pytest.raises(NotFoundError):
            store.cq_unit("V1UpgradeTopic", 0, 2)


def test_rust_store_without_consume_queue_rebuilds_the_same_units(tmp_path: Path) -> None:
    shutil.copytree(RUST / "commitlog", tmp_path / "commitlog")
    with LocalMessageStore(tmp_path, read_only=True) as store:
        assert store.recovery.records_scanned == 2
        assert [store.cq_unit("V1UpgradeTopic", 0, i) for i in range(2)] == [
            ConsumeQueueUnit(0, 141, 0),
            ConsumeQueueUnit(141, 141, 0),
        ]


def test_a_broker_unit_past_a_torn_commit_log_is_not_served(tmp_path: Path) -> None:
    shutil.copytree(RUST, tmp_path / "rust", copy_function=shutil.copyfile)
    log = tmp_path / "rust" / "commitlog" / "00000000000000000000"
    raw = bytearray(log.read_bytes())
    raw[141 + 100] ^= 0xFF  # inside record 1's body: its CRC no longer matches
    log.write_bytes(bytes(raw))
    with LocalMessageStore(tmp_path / "rust", read_only=True) as store:
        assert store.max_offset("V1UpgradeTopic", 0) == 1
        assert store.recovery.stop_reason is not None and "CRC" in store.recovery.stop_reason
        assert store.get_message("V1UpgradeTopic", 0, 0).body == b"v0.9.0-message-0"


def test_a_directory_without_a_commit_log_is_not_a_store(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError, match="commitlog"):
        LocalMessageStore(tmp_path, read_only=True)


# One record, checked by hand field by field: topic "T", queue 2, queue offset 7, body "hi", TAGS "x".
HAND_CHECKED_RECORD = bytes.fromhex(
    "00000065"  # TOTALSIZE 101 = 88 fixed + 2 body + 1 + 1 topic + 2 + 7 properties
    "daa320a7"  # MAGICCODE v1
    "58932aac"  # BODYCRC = crc32(b"hi") & 0x7fffffff = 1486039724
    "00000002"  # QUEUEID 2
    "00000000"  # FLAG
    "0000000000000007"  # QUEUEOFFSET 7
    "0000000000000000"  # PHYSICALOFFSET 0 (its position in the file)
    "00000000"  # SYSFLAG: IPv4 hosts, uncompressed
    "0000018d1a2b3c4d"  # BORNTIMESTAMP 0x18d1a2b3c4d = 1705541057613
    "c0a80001"
    "00002a9f"  # BORNHOST 192.168.0.1:10911
    "0000018d1a2b3c4e"  # STORETIMESTAMP one millisecond later
    "0a000005"
    "00000b3a"  # STOREHOST 10.0.0.5:2874
    "00000001"  # RECONSUMETIMES 1
    "0000000000000000"  # PREPAREDTXOFFSET
    "00000002"
    "6869"  # BODYLEN 2, BODY "hi"
    "01"
    "54"  # TOPICLEN 1, TOPIC "T"
    "0007"
    "54414753017802"  # PROPLEN 7, "TAGS\x01x\x02"
)


def test_hand_checked_record(tmp_path: Path) -> None:
    (tmp_path / "commitlog").mkdir()
    (tmp_path / "commitlog" / "00000000000000000000").write_bytes(HAND_CHECKED_RECORD + bytes(1024 - 101))
    with LocalMessageStore(tmp_path, read_only=True) as store:
        assert store.queues() == [("T", 2)]
        assert (store.min_offset("T", 2), store.max_offset("T", 2)) == (7, 8)
        assert (
            store.cq_unit("T", 2, 7) == ConsumeQueueUnit(0, 101, java_string_hash("x")) == ConsumeQueueUnit(0, 101, 120)
        )
        message = store.get_message("T", 2, 7)
        assert message.body == b"hi" and message.tags == "x" and tag_hash(message.tags) == 120
        assert message.born_timestamp == 1705541057613 and message.store_timestamp == 1705541057614
        assert message.born_host == HostAddress("192.168.0.1", 10911)
        assert message.store_host == HostAddress("10.0.0.5", 2874)
        assert message.reconsume_times == 1 and message.body_crc == 1486039724
        assert store.read_messages("T", 2, 7)[0].raw == HAND_CHECKED_RECORD
        assert message.encode() == HAND_CHECKED_RECORD


def test_our_own_store_reads_back_read_only(tmp_path: Path) -> None:
    with LocalMessageStore(tmp_path) as store:
        results = [store.put_message("mine", i % 2, f"body {i}".encode(), tags="t") for i in range(20)]
    with LocalMessageStore(tmp_path, read_only=True) as store:
        assert store.recovery.records_scanned == 0
        for result in results:
            assert store.get_message("mine", result.queue_id, result.queue_offset).physical_offset == (
                result.commitlog_offset
            )
