"""Security: the POSIX provider stays under its root, SQL takes values only as bound parameters, and
credentials never leave the config (not in logs, errors, reprs, CLI output or the metadata database)."""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from sqlalchemy import inspect

from tests.fixtures.faultproxy import FaultProxy, FaultRates, FaultRule
from tests.fixtures.s3 import S3Server
from tests.reliability.workload import append_records, commit_until_durable
from tieredstore.cli import main
from tieredstore.cli.app import EXIT_STORAGE
from tieredstore.config import load_config
from tieredstore.errors import PathEscapeError, StorageAccessError
from tieredstore.flat import FlatFileStore
from tieredstore.formats.naming import FileType
from tieredstore.logs import configure_logging
from tieredstore.metadata import MetadataStore, SegmentUpdate, upgrade
from tieredstore.providers.base import FileSegment
from tieredstore.providers.posix import PosixProvider
from tieredstore.runtime import open_cold_provider

pytestmark = pytest.mark.reliability

# ---- POSIX confinement -------------------------------------------------------------------------------

ESCAPES = [
    "../outside",
    "queue/../../outside",
    "/etc",
    "/tmp/outside",
    "a//b",
    "a/./b",
    "a\\..\\..\\outside",
    "a/\x00/b",
    "a/b/",
]
# Not escapes: names that only look like one to a decoder we never run; they must stay literal names.
LITERALS = ["%2e%2e/outside", "..%2f..%2foutside", "%252e%252e/x", "\uff0e\uff0e/outside", "...", "a..b/c"]


@pytest.fixture
def rooted(tmp_path: Path) -> tuple[PosixProvider, Path, Path]:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "victim").write_bytes(b"do not touch")
    return PosixProvider(str(root)), root, outside


async def every_operation(provider: PosixProvider, path: str) -> list[str]:
    """Run every provider operation on ``path``; the names of those that were not refused."""
    allowed = []
    segment_calls: dict[str, Callable[[FileSegment], Awaitable[object]]] = {
        "create": lambda s: s.create(),
        "exists": lambda s: s.exists(),
        "real_size": lambda s: s.real_size(),
        "read": lambda s: s.read(0, 5),
        "truncate": lambda s: s.truncate(0),
        "destroy": lambda s: s.destroy(),
    }
    for name, call in segment_calls.items():
        try:
            segment = provider.segment(FileType.COMMIT_LOG, path, 0, commit_position=5)
            await call(segment)
            allowed.append(name)
        except PathEscapeError:
            pass
    try:
        segment = provider.segment(FileType.COMMIT_LOG, path, 0)
        segment.append(b"escape")
        await segment.commit()
        allowed.append("commit")
    except PathEscapeError:
        pass
    for name, listing in (("list_segments", provider.list_segments), ("list_children", provider.list_children)):
        try:
            await listing(path) if name == "list_children" else await listing(path, FileType.COMMIT_LOG)
            allowed.append(name)
        except PathEscapeError:
            pass
    return allowed


def files_under(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize("path", ESCAPES)
async def test_paths_that_would_leave_the_root_are_refused_by_every_operation(
    rooted: tuple[PosixProvider, Path, Path], path: str
) -> None:
    provider, root, outside = rooted
    assert await every_operation(provider, path) == []
    assert files_under(outside) == {"victim": b"do not touch"}
    assert list(root.iterdir()) == []


@pytest.mark.parametrize("path", LITERALS)
async def test_encoded_lookalikes_are_literal_names_inside_the_root(
    rooted: tuple[PosixProvider, Path, Path], path: str
) -> None:
    provider, root, outside = rooted
    segment = provider.segment(FileType.COMMIT_LOG, path, 0)
    segment.append(b"inside")
    await segment.commit()
    written = [p for p in root.rglob("*") if p.is_file()]
    assert len(written) == 1 and written[0].read_bytes() == b"inside"
    assert written[0].resolve().is_relative_to(root.resolve())
    assert files_under(outside) == {"victim": b"do not touch"}


@pytest.mark.parametrize("planted", ["folder", "segment-file", "type-folder"])
async def test_symlinks_planted_inside_the_root_cannot_lead_out(
    rooted: tuple[PosixProvider, Path, Path], planted: str
) -> None:
    provider, root, outside = rooted
    queue = root / "cluster" / "broker" / "topic" / "0"
    if planted == "folder":
        (root / "cluster").mkdir()
        os.symlink(outside, root / "cluster" / "broker")
    elif planted == "type-folder":
        queue.mkdir(parents=True)
        os.symlink(outside, queue / "COMMIT_LOG")
    else:
        (queue / "COMMIT_LOG").mkdir(parents=True)
        os.symlink(outside / "victim", queue / "COMMIT_LOG" / "cfcd208400000000000000000000")
    allowed = await every_operation(provider, "cluster/broker/topic/0")
    # Listing a folder inside the root may name the planted link; nothing may read, write or remove through it.
    listings = {"folder": set(), "type-folder": {"list_children"}, "segment-file": {"list_children", "list_segments"}}
    assert set(allowed) <= listings[planted]
    assert files_under(outside) == {"victim": b"do not touch"}


# ---- SQL only through bound parameters -------------------------------------------------------------

HOSTILE = [
    "Robert'); DROP TABLE topics;--",
    'x" OR "1"="1',
    "'; DELETE FROM queues; SELECT '",
    "\\'; DROP TABLE segments; --",
    "名前'--",
]


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_values_round_trip_through_the_metadata_store(metadata_url: str, value: str) -> None:
    upgrade(metadata_url)
    with MetadataStore(metadata_url) as store:
        tables_before = set(inspect(store.engine).get_table_names())
        store.get_or_create_topic("Innocent")
        topic = store.get_or_create_topic(value, reserve_hours=5)
        assert store.get_topic(value) == topic
        queue = store.get_or_create_queue(value, 3)
        path = f"cluster/broker/{value}/3"
        store.add_segment(path, FileType.COMMIT_LOG, 0, begin_timestamp=1)
        store.update_segment(SegmentUpdate(path, FileType.COMMIT_LOG, 0, size=42))
        store.record_commit(value, 3, expected_version=queue.version, max_offset=7)
        index = store.add_index_file(value)
        assert store.get_queue(value, 3).max_offset == 7
        assert [s.size for s in store.list_segments(path, FileType.COMMIT_LOG)] == [42]
        assert store.get_index_file(value).name == index.name == value
        assert sorted(t.name for t in store.list_topics()) == sorted(["Innocent", value])
        assert set(inspect(store.engine).get_table_names()) == tables_before
        store.delete_topic(value)
        assert [t.name for t in store.list_topics()] == ["Innocent"]


# ---- credentials -------------------------------------------------------------------------------------

SECRET = f"secret-{uuid.uuid4().hex}"
ACCESS_KEY = f"AKIA{uuid.uuid4().hex[:16].upper()}"
SESSION_TOKEN = f"token-{uuid.uuid4().hex}"
TOPIC = "Secrets"


def exception_chain(error: BaseException) -> list[str]:
    texts: list[str] = []
    current: BaseException | None = error
    while current is not None:
        texts += [str(current), repr(current)]
        current = current.__cause__ or current.__context__
    return texts


def database_bytes(data_dir: Path) -> bytes:
    """The metadata database as stored, WAL included, and every row as text."""
    raw = b"".join(p.read_bytes() for p in data_dir.glob("metadata.db*"))
    with sqlite3.connect(data_dir / "metadata.db") as connection:
        tables = [row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for table in tables:
            raw += repr(connection.execute(f'SELECT * FROM "{table}"').fetchall()).encode()
    return raw


def test_credentials_never_reach_logs_errors_output_or_metadata(
    tmp_path: Path,
    s3_server: S3Server,
    s3_bucket: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    data_dir = tmp_path / "data"
    proxy = FaultProxy(
        s3_server.endpoint_url, rates=FaultRates(internal_error=0.05, slow_down=0.02, reset=0.01), seed=9
    )
    with proxy:
        for name, value in {
            "TIEREDSTORE_S3__ACCESS_KEY_ID": ACCESS_KEY,
            "TIEREDSTORE_S3__SECRET_ACCESS_KEY": SECRET,
            "TIEREDSTORE_S3__SESSION_TOKEN": SESSION_TOKEN,
            "TIEREDSTORE_S3__ENDPOINT_URL": proxy.endpoint_url,
            "TIEREDSTORE_S3__REGION": s3_server.region,
            "TIEREDSTORE_S3__MAX_ATTEMPTS": "8",
        }.items():
            monkeypatch.setenv(name, value)
        configure_logging("DEBUG")
        caplog.set_level(logging.DEBUG)
        config = load_config(data_dir=data_dir, cold_url=f"s3://{s3_bucket}/archive")
        shown = [repr(config), str(config), config.model_dump_json(), repr(config.s3)]
        errors: list[BaseException] = []

        async def archive() -> None:
            with MetadataStore.open(config.effective_metadata_url) as metadata:
                provider = open_cold_provider(config)
                try:
                    shown.extend([repr(provider), str(provider), provider.url])
                    store = FlatFileStore(provider, metadata, cluster=config.cluster, broker=config.broker)
                    queue = await store.get_or_create(TOPIC, 0)
                    # Retries (and their log lines) for certain: the random faults may miss a run this short.
                    proxy.fail(FaultRule("PUT", 503, "SlowDown", times=2))
                    for start in range(0, 600, 100):
                        await append_records(queue, start, start + 100)
                        await commit_until_durable(queue)
                    proxy.fail(FaultRule("GET", 403, "AccessDenied", times=20))
                    try:
                        await provider.segment(FileType.COMMIT_LOG, queue.path, 0).real_size()
                    except StorageAccessError as error:
                        errors.append(error)
                finally:
                    await provider.close()

        asyncio.run(archive())
        assert len(errors) == 1
        assert proxy.injected_total >= 3  # two scripted SlowDowns (retried, so logged) and the 403
        proxy.rules.clear()

        cold = ["--data-dir", str(data_dir), "--cold-url", f"s3://{s3_bucket}/archive", "--output", "json"]
        assert main([*cold, "read", TOPIC, "0", "--offset", "0", "--count", "600", "--tier", "cold"]) == 0
        printed = capfd.readouterr()
        assert printed.out.count('"queue_offset"') == 600
        proxy.fail(FaultRule("GET", 403, "AccessDenied", times=50))
        assert main([*cold, "read", TOPIC, "0", "--offset", "0", "--tier", "cold"]) == EXIT_STORAGE
        with pytest.raises(StorageAccessError) as debug_failure:  # --debug lets the traceback through
            main([*cold, "--debug", "read", TOPIC, "0", "--offset", "0", "--tier", "cold"])
        errors.append(debug_failure.value)
        failed = capfd.readouterr()
    for error in errors:
        shown.extend(exception_chain(error))
    haystack = "\n".join([*shown, caplog.text, printed.out, printed.err, failed.out, failed.err])
    haystack_bytes = haystack.encode() + database_bytes(data_dir)
    assert "retrying" in caplog.text  # logs were written during the faults...
    for secret in (SECRET, ACCESS_KEY, SESSION_TOKEN):
        assert secret.encode() not in haystack_bytes  # ...and none of them, nor anything else, holds a credential
