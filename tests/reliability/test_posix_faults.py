"""POSIX faults on real file systems: a cold directory that turns read-only, fills up, or refuses a user.

Each scenario archives through the real POSIX provider and the container layer (FlatMessageFile with
SQLite metadata) onto a small tmpfs, injects the fault with the kernel's own mechanisms (remount ro,
a full file system, a non-root user), and checks: the error is typed, nothing buffered is lost, the
commit goes through once the fault is gone, the archive checker holds against the hot copies, and
a restart (recovery from metadata and storage) finds nothing to repair.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.fixtures.unprivileged import OtherUserPython, python_for_other_users
from tests.reliability.workload import BASE_TIMESTAMP, TAGS, Tmpfs, append_records, make_record, new_flat_store
from tieredstore.errors import StorageAccessError, StorageUnavailableError
from tieredstore.flat import FlatFileSettings, FlatMessageFile, ProblemKind, check_queue_invariant
from tieredstore.flat.message_file import RecordRun
from tieredstore.formats.message import tag_hash
from tieredstore.metadata import MetadataStore
from tieredstore.providers.posix import PosixProvider

pytestmark = pytest.mark.reliability

TOPIC = "PosixFaults"
SMALL_SEGMENTS = FlatFileSettings(commit_log_max_size=128 * 1024, consume_queue_max_size=20 * 500)
NOBODY = 65534


async def assert_archive_intact(queue: FlatMessageFile, reference: dict[int, bytes]) -> None:
    """Every record archived once, byte-identical to its hot copy (PHYSICALOFFSET aside), at contiguous offsets."""
    assert queue.archived_offset == len(reference)
    assert await check_queue_invariant(queue, reference=reference) == []


async def assert_restart_repairs_nothing(
    cold: Path, metadata: MetadataStore, reference: dict[int, bytes], settings: FlatFileSettings
) -> None:
    store = new_flat_store(PosixProvider(str(cold)), metadata, settings)
    report = await store.recover()
    assert report.failed == {} and report.changed == {}
    await assert_archive_intact(store.get(TOPIC, 0), reference)


def disk_files(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}


async def test_a_read_only_cold_directory_refuses_commits_keeps_buffers_and_serves_reads(
    tmpfs: Callable[[str, int], Tmpfs], metadata: MetadataStore
) -> None:
    fs = tmpfs("cold", 8 << 20)
    store = new_flat_store(PosixProvider(str(fs.path)), metadata, SMALL_SEGMENTS)
    queue = await store.get_or_create(TOPIC, 0)
    reference = await append_records(queue, 0, 300)
    assert await queue.commit() == 300

    # Appending may already commit a segment that filled up; what is on disk now must not change.
    reference |= await append_records(queue, 300, 500)
    before = disk_files(fs.path)
    with fs.read_only():
        for _ in range(3):  # retried while the fault lasts: each attempt fails the same typed way
            with pytest.raises(StorageAccessError, match="Read-only file system"):
                await queue.commit()
        assert (queue.archived_offset, queue.append_offset) == (300, 500)
        assert metadata.get_queue(TOPIC, 0).max_offset == 300
        served = await queue.read_messages(0, 300)
        assert len(served) == 300
        assert disk_files(fs.path) == before
    assert await queue.commit() == 500
    await assert_archive_intact(queue, reference)
    await assert_restart_repairs_nothing(fs.path, metadata, reference, SMALL_SEGMENTS)


async def fill(queue: FlatMessageFile, end: int, *, batch: int = 100) -> list[StorageUnavailableError]:
    """Archive up to ``end`` like the archiver: append a batch, commit, go on; stop at the first failure.

    An append can fail too (a full segment is committed before the next one starts); the record was
    not taken, and the hot store still holds it for the next attempt.
    """
    while queue.append_offset < end:
        try:
            for offset in range(queue.append_offset, min(end, queue.append_offset + batch)):
                await queue.append_records(
                    RecordRun.of([(record_at(offset), offset, BASE_TIMESTAMP + offset, tag_hash(TAGS))])
                )
            await queue.commit()
        except StorageUnavailableError as error:
            return [error]
    return []


def record_at(offset: int) -> bytes:
    return make_record(offset, topic=TOPIC, size=600)


async def test_a_full_disk_fails_archiving_typed_then_it_completes_once_space_is_freed(
    tmpfs: Callable[[str, int], Tmpfs], metadata: MetadataStore
) -> None:
    fs = tmpfs("cold", 1 << 20)
    filler = fs.path / "someone-elses-file"
    filler.write_bytes(bytes(640 * 1024))  # leaves ~384 KiB for the archive
    store = new_flat_store(PosixProvider(str(fs.path)), metadata, SMALL_SEGMENTS)
    queue = await store.get_or_create(TOPIC, 0)
    failures = await fill(queue, 1000)
    assert failures, "the workload should not fit on the file system"
    for _ in range(3):  # retried while the disk stays full: the same typed error each time
        with pytest.raises(StorageUnavailableError, match="No space left on device"):
            await queue.commit()
    assert "No space left on device" in str(failures[0])
    archived_while_full = queue.archived_offset
    assert 0 < archived_while_full < 1000
    assert archived_while_full <= queue.append_offset  # buffered records stay buffered
    assert metadata.get_queue(TOPIC, 0).max_offset == archived_while_full
    # What did land is a sound archive: whole records, each referenced once, nothing torn. Commit-log
    # bytes may have landed past the last archived record (the commit log goes first); they are ours
    # and the next commit accepts them instead of writing them again.
    reference = {offset: record_at(offset) for offset in range(1000)}
    problems = await check_queue_invariant(queue, reference=reference)
    assert {problem.kind for problem in problems} <= {ProblemKind.ORPHAN_BYTES}

    print(f"\nfigures disk-full: archived {archived_while_full}/1000 records of 600 B before ENOSPC, on a 1 MiB tmpfs")
    filler.unlink()  # the operator frees space
    assert await fill(queue, 1000) == []
    assert await queue.commit() == 1000
    await assert_archive_intact(queue, reference)
    await assert_restart_repairs_nothing(fs.path, metadata, reference, SMALL_SEGMENTS)


@pytest.fixture
def shared_root() -> Iterator[Path]:
    """A directory another user can reach (pytest's own temp root is private to root)."""
    root = Path(tempfile.mkdtemp(prefix="tieredstore-permissions-"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root)


@pytest.fixture
def nobody_python() -> Iterator[OtherUserPython]:
    """Python for ``nobody`` with the probe's modules, copied out of a clone other users may not be able to read."""
    directory = Path(tempfile.mkdtemp(prefix="tieredstore-python-"))
    yield python_for_other_users(["tieredstore.formats.naming", "tieredstore.providers.posix"], directory)
    shutil.rmtree(directory)


PROBE = """
import asyncio, json, sys
from tieredstore.formats.naming import FileType
from tieredstore.providers.posix import PosixProvider

async def probe(root: str) -> dict[str, object]:
    provider = PosixProvider(root)
    found: dict[str, object] = {}
    attempts = {
        "commit": (FileType.COMMIT_LOG, "c/b/Locked/0", 0, 0),
        "read": (FileType.COMMIT_LOG, "c/b/Secret/0", 0, 6),
    }
    for name, (file_type, path, base, committed) in attempts.items():
        segment = provider.segment(file_type, path, base, commit_position=committed)
        try:
            if name == "commit":
                segment.append(b"not allowed")
                await segment.commit()
            else:
                await segment.read(0, committed)
            found[name] = "succeeded"
        except Exception as error:
            found[name] = [type(error).__name__, str(error), segment.pending_bytes]
    try:
        await provider.list_segments("c/b/Hidden/0", FileType.COMMIT_LOG)
        found["list"] = "succeeded"
    except Exception as error:
        found["list"] = [type(error).__name__, str(error), 0]
    return found

print(json.dumps(asyncio.run(probe(sys.argv[1]))))
"""


def test_permission_denied_is_a_typed_access_error_for_a_non_root_archiver(
    shared_root: Path, nobody_python: OtherUserPython
) -> None:
    queue_dirs = {name: shared_root / "c" / "b" / name / "0" / "COMMIT_LOG" for name in ("Locked", "Secret", "Hidden")}
    for folder in queue_dirs.values():
        folder.mkdir(parents=True)
    for folder in shared_root.rglob("*"):
        folder.chmod(0o755)
    secret = queue_dirs["Secret"] / "cfcd208400000000000000000000"
    secret.write_bytes(b"secret")
    secret.chmod(0o600)
    queue_dirs["Hidden"].chmod(0o700)
    before = disk_files(shared_root)

    probe = [*nobody_python.command, "-c", PROBE, str(shared_root)]
    result = subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *probe],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd="/",
        env={"PATH": os.environ["PATH"], "HOME": "/", **nobody_python.env},
    )
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert found["commit"] == ["StorageAccessError", found["commit"][1], len(b"not allowed")]
    assert found["read"][0] == "StorageAccessError"
    assert found["list"][0] == "StorageAccessError"
    for _, message, _ in found.values():
        assert "Permission denied" in message and "\n" not in message
    assert disk_files(shared_root) == before
