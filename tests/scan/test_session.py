"""A worker thread keeps one event loop and provider from partition to partition while the options match."""

from __future__ import annotations

from pathlib import Path

import pytest

from tieredstore.scan.options import ScanOptions
from tieredstore.scan.session import read_session


def _options(root: Path) -> ScanOptions:
    return ScanOptions.parse({"path": "orders", "cold_url": str(root), "metadata": "none"})


def test_partitions_with_the_same_options_share_a_session(tmp_path: Path) -> None:
    with read_session(_options(tmp_path)) as first:
        pass
    with read_session(_options(tmp_path)) as second:
        assert second is first and not first.closed
    with read_session(_options(tmp_path / "other")) as third:
        assert third is not first
    assert first.closed and not third.closed


def test_a_session_in_use_closes_only_when_its_last_partition_is_done(tmp_path: Path) -> None:
    with read_session(_options(tmp_path)) as reading:
        with read_session(_options(tmp_path / "other")) as other:
            assert other is not reading and not reading.closed
        assert not reading.closed
    assert reading.closed


def test_a_failed_partition_drops_its_session(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), read_session(_options(tmp_path)) as failed:
        raise RuntimeError("the partition failed")
    assert failed.closed
    with read_session(_options(tmp_path)) as following:
        assert following is not failed and not following.closed
