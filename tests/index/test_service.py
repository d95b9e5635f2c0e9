"""IndexService: indexing archived messages, rolling files to cold storage, restarts, retention and lookups."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.fixtures.backends import ProviderBackend
from tests.index.helpers import CountingProvider
from tieredstore.config import IndexSettings
from tieredstore.errors import CorruptRecordError, IntegrityError, StorageUnavailableError, ValidationError
from tieredstore.formats.index_file import key_hash
from tieredstore.formats.message import java_string_hash
from tieredstore.index.file import compact_file
from tieredstore.index.service import (
    IndexCatalogue,
    IndexEntry,
    IndexFileRecord,
    IndexFileStatus,
    IndexService,
    JsonIndexCatalogue,
    MemoryIndexCatalogue,
)
from tieredstore.providers.base import FileSegment

T0 = 1_786_000_000_000
TOPIC, TOPIC_ID = "Orders", 7


class Clock:
    def __init__(self, now: int = T0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


class Messages:
    """The archived messages' real keys, as the read path would return them; counts confirmations."""

    def __init__(self) -> None:
        self.keys: dict[tuple[int, int, int], list[str]] = {}
        self.confirmed: list[tuple[int, int, int]] = []

    def entry(self, queue_offset: int, timestamp: int, *keys: str, queue_id: int = 0) -> IndexEntry:
        self.keys[(TOPIC_ID, queue_id, queue_offset)] = list(keys)
        return IndexEntry(TOPIC, TOPIC_ID, queue_id, queue_offset, 200, timestamp, tuple(keys))

    async def confirm(self, topic_id: int, queue_id: int, queue_offset: int) -> Sequence[str]:
        self.confirmed.append((topic_id, queue_id, queue_offset))
        return self.keys.get((topic_id, queue_id, queue_offset), [])


def _settings(max_items: int = 5, slot_count: int = 4) -> IndexSettings:
    return IndexSettings(index_max_items=max_items, index_slot_count=slot_count, index_seal_interval=60.0)


async def _service(
    tmp_path: Path,
    provider: CountingProvider,
    *,
    catalogue: IndexCatalogue | None = None,
    clock: Clock | None = None,
    settings: IndexSettings | None = None,
) -> IndexService:
    service = IndexService(
        tmp_path / "index",
        provider,
        cluster="c1",
        broker="b1",
        catalogue=catalogue,
        settings=settings or _settings(),
        clock=clock or Clock(),
    )
    await service.start()
    return service


async def _query(
    service: IndexService, messages: Messages, key: str, max_count: int = 100, begin: int = 0, end: int = 2**62
) -> list[int]:
    hits = await service.query(TOPIC, TOPIC_ID, key, max_count, begin, end, messages.confirm)
    return [hit.queue_offset for hit in hits]


async def test_keys_are_found_in_the_unsealed_file_and_others_are_not(tmp_path: Path) -> None:
    messages, provider = Messages(), CountingProvider()
    service = await _service(tmp_path, provider, settings=_settings(max_items=100))
    written = await service.put([messages.entry(0, T0, "a", "b"), messages.entry(1, T0 + 1, "b", "b")])
    assert written == 3  # a duplicate key on one message is indexed once
    assert await _query(service, messages, "b") == [1, 0]
    assert await _query(service, messages, "a") == [0]
    assert await _query(service, messages, "zzz") == []
    assert provider.reads == []
    await service.close()


@pytest.mark.parametrize("uploaded", [False, True])
async def test_colliding_keys_are_told_apart_by_the_real_keys(tmp_path: Path, uploaded: bool) -> None:
    assert java_string_hash("Aa") == java_string_hash("BB")
    assert key_hash(TOPIC, "Aa") == key_hash(TOPIC, "BB")
    messages, provider = Messages(), CountingProvider()
    service = await _service(tmp_path, provider, settings=_settings(max_items=2))
    await service.put([messages.entry(0, T0, "Aa"), messages.entry(1, T0 + 1, "BB")])
    if uploaded:
        await service.put([messages.entry(2, T0 + 2, "other")])
        assert await service.maintain()
        assert service.files()[0].status is IndexFileStatus.UPLOAD
    assert await _query(service, messages, "Aa") == [0]
    assert await _query(service, messages, "BB") == [1]
    assert set(messages.confirmed) == {(TOPIC_ID, 0, 0), (TOPIC_ID, 0, 1)}
    await service.close()


async def test_other_topics_with_the_same_key_are_not_returned(tmp_path: Path) -> None:
    messages, provider = Messages(), CountingProvider()
    service = await _service(tmp_path, provider)
    await service.put([messages.entry(0, T0, "k"), IndexEntry("Refunds", TOPIC_ID + 1, 0, 0, 100, T0, ("k",))])
    messages.keys[(TOPIC_ID + 1, 0, 0)] = ["k"]
    assert await _query(service, messages, "k") == [0]
    await service.close()


async def test_one_query_spans_uploaded_files_and_the_unsealed_one(tmp_path: Path) -> None:
    messages, provider = Messages(), CountingProvider()
    service = await _service(tmp_path, provider)
    await service.put([messages.entry(n, T0 + n * 10, "order-1", f"uniq-{n}") for n in range(7)])
    uploaded = await service.maintain()
    statuses = [record.status for record in service.files()]
    assert statuses == [IndexFileStatus.UPLOAD, IndexFileStatus.UPLOAD, IndexFileStatus.UNSEALED]
    assert len(uploaded) == 2
    assert {p.name for p in (tmp_path / "index").iterdir()} == {
        "catalogue.json",
        f"{service.files()[2].file_id:020d}.index",
    }
    assert await _query(service, messages, "order-1") == [6, 5, 4, 3, 2, 1, 0]
    assert await _query(service, messages, "uniq-1") == [1]
    await service.close()


async def test_max_count_stops_the_lookup_early(tmp_path: Path) -> None:
    messages, provider = Messages(), CountingProvider()
    service = await _service(tmp_path, provider)
    await service.put([messages.entry(n, T0 + n, "k", f"k{n}") for n in range(10)])
    await service.maintain()
    provider.reads.clear()
    assert await _query(service, messages, "k", max_count=2) == [9, 8]
    assert len(messages.confirmed) == 2
    assert provider.reads == []  # the newest file (unsealed, local) held enough
    await service.close()


async def test_files_are_chosen_by_overlap_across_a_time_boundary(tmp_path: Path) -> None:
    messages, provider = Messages(), CountingProvider()
    service = await _service(tmp_path, provider, settings=_settings(max_items=3))
    # file 1 covers [T0, T0+200]; file 2 covers [T0+200, T0+400]; file 3 [T0+1000, ...]
    await service.put([messages.entry(n, T0 + 100 * n, "k") for n in range(3)])
    await service.put([messages.entry(3 + n, T0 + 200 + 100 * n, "k") for n in range(3)])
    await service.put([messages.entry(6, T0 + 1000, "k")])
    await service.maintain()
    records = service.files()
    assert [(r.begin_timestamp, r.end_timestamp) for r in records[:2]] == [(T0, T0 + 200), (T0 + 200, T0 + 400)]
    provider.reads.clear()
    # the query starts inside file 1: choosing files by start time would skip it and lose offsets 1, 2
    assert sorted(await _query(service, messages, "k", begin=T0 + 150, end=T0 + 250)) == [2, 3]
    assert {key for key, _, _ in provider.reads} == {
        key for key in provider.volume if key.endswith(tuple(f"{r.file_id:020d}" for r in records[:2]))
    }
    assert sorted(await _query(service, messages, "k", begin=T0 + 100, end=T0 + 100)) == [1]
    await service.close()


async def test_an_uploaded_file_costs_two_reads_per_lookup(tmp_path: Path) -> None:
    messages, provider = Messages(), CountingProvider()
    service = await _service(tmp_path, provider, settings=_settings(max_items=50, slot_count=64))
    await service.put([messages.entry(n, T0 + n, f"key-{n % 60}") for n in range(150)])
    await service.put([messages.entry(150, T0 + 10_000, "tail")])
    await service.maintain()
    uploaded = [r for r in service.files() if r.status is IndexFileStatus.UPLOAD]
    assert len(uploaded) == 3
    for n in range(60):
        provider.reads.clear()
        expected = [offset for offset in range(149, -1, -1) if offset % 60 == n]
        assert await _query(service, messages, f"key-{n}", end=T0 + 5_000) == expected
        reads_per_file = Counter(key for key, _, _ in provider.reads)
        holding = {uploaded[offset // 50].file_id for offset in expected}
        for record in uploaded:
            # the slot, then its items (a slot other keys share costs the same; an empty one ends after one read)
            key = next(key for key in reads_per_file if key.endswith(f"{record.file_id:020d}"))
            if record.file_id in holding:
                assert reads_per_file[key] == 2
            else:
                assert reads_per_file[key] in (1, 2)
    await service.close()


async def test_restart_mid_compaction_finishes_the_upload(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    messages, provider = Messages(), CountingProvider()
    catalogue_path = tmp_path / "index" / "catalogue.json"

    def crash_half_way(sealed_path: Path, compacted_path: Path) -> None:
        compacted_path.with_name(compacted_path.name + ".tmp").write_bytes(b"\x00" * 37)
        raise OSError("killed during compaction")

    monkeypatch.setattr("tieredstore.index.service.compact_file", crash_half_way)
    service = await _service(tmp_path, provider)
    await service.put([messages.entry(n, T0 + n, "k", f"u{n}") for n in range(7)])
    with pytest.raises(OSError, match="killed"):
        await service.maintain()
    assert JsonIndexCatalogue(catalogue_path).list_files()[0].status is IndexFileStatus.SEALED
    # the process dies here: no close(), a half-written .tmp beside the sealed file
    monkeypatch.setattr("tieredstore.index.service.compact_file", compact_file)
    restarted = await _service(tmp_path, provider)
    assert not list((tmp_path / "index").glob("*.tmp"))
    assert await _query(restarted, messages, "k") == [6, 5, 4, 3, 2, 1, 0]
    assert len(await restarted.maintain()) == 2
    assert [r.status for r in JsonIndexCatalogue(catalogue_path).list_files()] == [
        IndexFileStatus.UPLOAD,
        IndexFileStatus.UPLOAD,
        IndexFileStatus.UNSEALED,
    ]
    assert await _query(restarted, messages, "k") == [6, 5, 4, 3, 2, 1, 0]
    await restarted.close()


class FailOnceOnUpload(MemoryIndexCatalogue):
    """A catalogue that fails the first UPLOAD save, as a crash right after the upload committed would."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = False

    def save(self, record: IndexFileRecord) -> None:
        if record.status is IndexFileStatus.UPLOAD and not self.failed:
            self.failed = True
            raise OSError("died before the catalogue heard of the upload")
        super().save(record)


async def test_upload_interrupted_before_the_catalogue_is_not_written_twice(tmp_path: Path) -> None:
    messages, provider = Messages(), CountingProvider()
    catalogue = FailOnceOnUpload()
    service = await _service(tmp_path, provider, catalogue=catalogue)
    await service.put([messages.entry(n, T0 + n, "k") for n in range(6)])
    with pytest.raises(OSError, match="died"):
        await service.maintain()
    (uploaded_key,) = provider.volume
    size = len(provider.volume[uploaded_key])
    restarted = await _service(tmp_path, provider, catalogue=catalogue)
    await restarted.maintain()
    assert len(provider.volume[uploaded_key]) == size
    (record, _) = restarted.files()
    assert (record.status, record.size) == (IndexFileStatus.UPLOAD, size)
    assert await _query(restarted, messages, "k") == [5, 4, 3, 2, 1, 0]
    await restarted.close()


async def test_upload_cut_off_half_way_resumes_from_the_bytes_that_landed(tmp_path: Path) -> None:
    messages, provider = Messages(), CountingProvider()
    directory = tmp_path / "index"
    service = IndexService(
        directory, provider, cluster="c1", broker="b1", settings=_settings(max_items=20), upload_chunk_size=100
    )
    await service.start()
    await service.put([messages.entry(n, T0 + n, f"k{n}") for n in range(21)])
    compacted_path = directory / f"{service.files()[0].file_id:020d}.compacted"
    provider.commits_left = 3
    with pytest.raises(StorageUnavailableError, match="injected outage"):
        await service.maintain()
    (uploaded_key,) = provider.volume
    assert len(provider.volume[uploaded_key]) == 300
    provider.commits_left = None
    restarted = IndexService(
        directory, provider, cluster="c1", broker="b1", settings=_settings(max_items=20), upload_chunk_size=100
    )
    await restarted.start()
    expected = compacted_path.read_bytes()
    await restarted.maintain()
    assert bytes(provider.volume[uploaded_key]) == expected
    assert not compacted_path.exists()
    for n in range(21):
        assert await _query(restarted, messages, f"k{n}") == [n]
    await restarted.close()


async def test_restart_keeps_the_unsealed_file_and_appends_to_it(tmp_path: Path) -> None:
    messages, provider = Messages(), CountingProvider()
    service = await _service(tmp_path, provider, settings=_settings(max_items=100))
    await service.put([messages.entry(0, T0, "k")])
    # crash: no close()
    restarted = await _service(tmp_path, provider, settings=_settings(max_items=100))
    await restarted.put([messages.entry(1, T0 + 1, "k")])
    (record,) = restarted.files()
    assert (record.status, record.item_count) == (IndexFileStatus.UNSEALED, 2)
    assert await _query(restarted, messages, "k") == [1, 0]
    await restarted.close()


async def test_a_crash_while_a_new_file_is_created_leaves_nothing_a_restart_cannot_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after the new file was sized and before its header was written: the restart forgets the file
    (its record is written first) instead of refusing to start on an all-zero file."""
    messages, provider = Messages(), CountingProvider()
    service = await _service(tmp_path, provider)

    def killed(_header: object) -> bytes:
        raise OSError("killed before the header was written")

    monkeypatch.setattr("tieredstore.index.file.UnsealedHeader.encode", killed)
    with pytest.raises(OSError, match="killed"):
        await service.put([messages.entry(0, T0, "k")])  # the first put creates the first file
    monkeypatch.undo()
    # the process dies here: no close()
    restarted = await _service(tmp_path, provider)
    assert restarted.files() == []
    assert not list((tmp_path / "index").glob("*.tmp"))
    await restarted.put([messages.entry(0, T0, "k"), messages.entry(1, T0 + 1, "k")])
    assert await _query(restarted, messages, "k") == [1, 0]
    await restarted.close()


async def test_an_old_file_is_sealed_and_uploaded(tmp_path: Path) -> None:
    messages, provider, clock = Messages(), CountingProvider(), Clock()
    service = await _service(tmp_path, provider, clock=clock, settings=_settings(max_items=100))
    await service.put([messages.entry(0, T0, "k")])
    assert await service.maintain() == []
    clock.now += 60_000
    assert len(await service.maintain()) == 1
    assert [r.status for r in service.files()] == [IndexFileStatus.UPLOAD]
    await service.put([messages.entry(1, T0 + 60_000, "k")])
    assert await _query(service, messages, "k") == [1, 0]
    await service.close()


async def test_delete_expired_removes_old_files_everywhere(tmp_path: Path) -> None:
    messages, provider = Messages(), CountingProvider()
    service = await _service(tmp_path, provider, settings=_settings(max_items=2))
    await service.put([messages.entry(n, T0 + 1000 * n, "k") for n in range(5)])
    await service.maintain()
    first, second, current = service.files()
    removed = await service.delete_expired(T0 + 2000)
    assert removed == [first.file_id]
    assert len(provider.volume) == 1
    assert await _query(service, messages, "k") == [4, 3, 2]
    assert await service.delete_expired(T0 + 10_000) == [second.file_id, current.file_id]
    assert provider.volume == {}
    assert await _query(service, messages, "k") == []
    await service.put([messages.entry(9, T0 + 20_000, "k")])
    assert await _query(service, messages, "k") == [9]
    await service.close()


async def test_corrupt_uploaded_index_is_a_typed_error(tmp_path: Path) -> None:
    messages, provider = Messages(), CountingProvider()
    service = await _service(tmp_path, provider, settings=_settings(max_items=2))
    await service.put([messages.entry(n, T0 + n, "k") for n in range(3)])
    await service.maintain()
    (uploaded_key,) = provider.volume
    provider.volume[uploaded_key][-3] ^= 0xFF
    with pytest.raises(CorruptRecordError, match="CRC"):
        await _query(service, messages, "k")
    await service.close()


async def test_bad_queries_and_unstarted_service_are_validation_errors(tmp_path: Path) -> None:
    messages, provider = Messages(), CountingProvider()
    idle = IndexService(tmp_path / "idle", provider, cluster="c", broker="b")
    with pytest.raises(ValidationError, match="not started"):
        await idle.query(TOPIC, TOPIC_ID, "k", 1, 0, 1, messages.confirm)
    service = await _service(tmp_path, provider)
    with pytest.raises(ValidationError, match="max_count"):
        await service.query(TOPIC, TOPIC_ID, "k", 0, 0, 1, messages.confirm)
    with pytest.raises(ValidationError, match="after end"):
        await service.query(TOPIC, TOPIC_ID, "k", 1, 5, 1, messages.confirm)
    await service.close()


def test_corrupt_json_catalogue_is_an_integrity_error(tmp_path: Path) -> None:
    path = tmp_path / "catalogue.json"
    catalogue = JsonIndexCatalogue(path)
    catalogue.save(IndexFileRecord(1, IndexFileStatus.SEALED, T0, T0, T0 + 5, 3, 0))
    assert JsonIndexCatalogue(path).list_files() == catalogue.list_files()
    path.write_text('{"version": 1, "files": [{"file_id": 1}]}')
    with pytest.raises(IntegrityError, match="does not decode"):
        JsonIndexCatalogue(path)


async def test_uploaded_index_answers_on_every_backend_after_a_restart(
    tmp_path: Path, provider_factory: ProviderBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    messages = Messages()
    service = IndexService(
        tmp_path / "index",
        provider_factory(),
        cluster="c1",
        broker="b1",
        settings=_settings(max_items=4),
        upload_chunk_size=64,  # several commits (S3: several chunk objects) per file
    )
    await service.start()
    await service.put([messages.entry(n, T0 + n, "order-1", "Aa" if n % 2 else "BB") for n in range(9)])
    assert len(await service.maintain()) == 4  # two keys a message, four items a file
    await service.close()

    reads: list[tuple[int, int]] = []
    plain_read = FileSegment.read

    async def counting_read(segment: FileSegment, position: int, length: int) -> bytes:
        reads.append((segment.base_offset, position))
        return await plain_read(segment, position, length)

    monkeypatch.setattr(FileSegment, "read", counting_read)
    restarted = IndexService(
        tmp_path / "index", provider_factory(), cluster="c1", broker="b1", settings=_settings(max_items=4)
    )
    await restarted.start()
    assert await _query(restarted, messages, "Aa") == [7, 5, 3, 1]
    assert Counter(file_id for file_id, _ in reads) == Counter(
        {record.file_id: 2 for record in restarted.files() if record.status is IndexFileStatus.UPLOAD}
    )
    assert await _query(restarted, messages, "order-1", max_count=3) == [8, 7, 6]
    await restarted.close()
