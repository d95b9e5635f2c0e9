"""POSIX provider behaviour beyond the conformance suite: on-disk layout, confinement, typed errors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tieredstore.errors import ConfigError, PathEscapeError, StorageError
from tieredstore.formats.naming import FileType, queue_path
from tieredstore.providers.posix import PosixProvider

QUEUE = queue_path("DefaultCluster", "broker-a", "TopicTest", 0)


async def test_segments_are_files_at_the_cold_layout_path(tmp_path: Path) -> None:
    provider = PosixProvider(str(tmp_path))
    segment = provider.segment(FileType.COMMIT_LOG, QUEUE, 4294937144)
    segment.append(b"on disk")
    await segment.commit()
    expected = tmp_path / QUEUE / "COMMIT_LOG" / "b10da56800000000004294937144"
    assert expected.read_bytes() == b"on disk"
    assert sorted(p.name for p in (tmp_path / QUEUE / "COMMIT_LOG").iterdir()) == [expected.name]


async def test_symlink_leading_out_of_the_root_is_refused(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "cluster").mkdir(parents=True)
    outside.mkdir()
    os.symlink(outside, root / "cluster" / "broker")
    provider = PosixProvider(f"file://{root}")
    segment = provider.segment(FileType.COMMIT_LOG, "cluster/broker/topic/0", 0)
    segment.append(b"must not leave the root")
    with pytest.raises(PathEscapeError):
        await segment.commit()
    with pytest.raises(PathEscapeError):
        await provider.list_children("cluster/broker")
    assert list(outside.iterdir()) == []
    assert segment.pending_bytes == 23


async def test_a_broken_layout_raises_a_typed_error_and_keeps_the_buffer(tmp_path: Path) -> None:
    (tmp_path / "cluster").write_bytes(b"a file where a folder belongs")
    segment = PosixProvider(str(tmp_path)).segment(FileType.COMMIT_LOG, "cluster/broker/topic/0", 0)
    segment.append(b"kept")
    with pytest.raises(StorageError):
        await segment.commit()
    assert (segment.commit_position, segment.pending_bytes) == (0, 4)


def test_urls_and_plain_paths_name_the_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert PosixProvider("relative/cold").root == str(tmp_path / "relative" / "cold")
    assert PosixProvider(f"file://{tmp_path}/a%20b").root == str(tmp_path / "a b")
    assert PosixProvider(f"file://localhost{tmp_path}").url == f"file://{tmp_path}"


@pytest.mark.parametrize("url", ["file://otherhost/data", "file:///data?x=1", "s3://bucket/x", ""])
def test_bad_urls_are_refused(url: str) -> None:
    with pytest.raises(ConfigError):
        PosixProvider(url)
