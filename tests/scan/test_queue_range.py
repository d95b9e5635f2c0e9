"""scan_queue: one queue's offset range as Arrow batches in offset order, lost offsets without rows."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.scan.conftest import QUEUE_0_OFFSETS, TOPIC
from tests.spark.helpers import Archive, make_message
from tieredstore.config import TieredStoreConfig
from tieredstore.errors import ValidationError
from tieredstore.scan import ScanFilter, ScanOptions, plan_partitions, scan_queue


def _options(archive: Archive, tmp_path: Path) -> ScanOptions:
    config = TieredStoreConfig(data_dir=tmp_path, cold_url=archive.cold_url, metadata_url=archive.metadata_url)
    return ScanOptions.from_config(config, [TOPIC])


def _rows(options: ScanOptions, start: int, end: int, queue_id: int = 0) -> list[dict[str, object]]:
    columns = ("topic", "queue_id", "queue_offset", "commitlog_offset", "body")
    return [row for batch in scan_queue(options, TOPIC, queue_id, start, end, columns) for row in batch.to_pylist()]


def test_from_config_takes_the_archive_the_config_names(scan_archive: Archive, tmp_path: Path) -> None:
    options = _options(scan_archive, tmp_path)
    assert (options.cold_url, options.metadata_url) == (scan_archive.cold_url, scan_archive.metadata_url)
    assert (options.cluster, options.broker, options.provider_options) == ("DefaultCluster", "broker-a", {})


def test_a_mid_queue_range_over_a_lost_range_and_many_partitions(scan_archive: Archive, tmp_path: Path) -> None:
    # Small partitions, so the range is read as several partitions that must come back in order.
    options = dataclasses.replace(_options(scan_archive, tmp_path), max_partition_bytes=8 * 1024, batch_rows=16)
    scan_filter = ScanFilter(queue_ids=frozenset({0}), queue_offset_start=50, queue_offset_end=130)
    assert len(plan_partitions(options, scan_filter)) > 3

    rows = _rows(options, 50, 130)

    expected_offsets = [offset for offset in QUEUE_0_OFFSETS if 50 <= offset < 130]
    assert [row["queue_offset"] for row in rows] == expected_offsets
    assert [row["body"] for row in rows] == [make_message(TOPIC, 0, offset).body for offset in expected_offsets]
    archived = {
        row["queue_offset"]: row["commitlog_offset"] for row in scan_archive.rows[TOPIC] if row["queue_id"] == 0
    }
    assert [row["commitlog_offset"] for row in rows] == [archived[offset] for offset in expected_offsets]
    assert {(row["topic"], row["queue_id"]) for row in rows} == {(TOPIC, 0)}


def test_ranges_at_the_edges_of_the_archive(scan_archive: Archive, tmp_path: Path) -> None:
    options = _options(scan_archive, tmp_path)
    assert [row["queue_offset"] for row in _rows(options, 150, 10_000)] == list(range(150, 160))
    assert _rows(options, 72, 90) == []  # wholly inside the lost range
    assert _rows(options, 160, 200) == []  # past the archived end
    assert _rows(options, 30, 30) == []
    assert [row["queue_offset"] for row in _rows(options, 0, 5, queue_id=1)] == [0, 1, 2, 3, 4]


def test_a_bad_range_or_column_is_a_validation_error_at_the_call(scan_archive: Archive, tmp_path: Path) -> None:
    options = _options(scan_archive, tmp_path)
    with pytest.raises(ValidationError, match=r"\[10, 5\)"):
        scan_queue(options, TOPIC, 0, 10, 5)
    with pytest.raises(ValidationError, match="scan columns"):
        scan_queue(options, TOPIC, 0, 0, 5, columns=("offset",))


_WITHOUT_PYSPARK = textwrap.dedent(
    """
    import importlib.abc
    import json
    import sys


    class NoPyspark(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "pyspark" or name.startswith("pyspark."):
                raise ImportError(f"{name} is not installed here")
            return None


    sys.meta_path.insert(0, NoPyspark())
    try:
        import tieredstore.spark  # noqa: F401
    except ImportError:
        blocked = True
    else:
        blocked = False

    from tieredstore.config import TieredStoreConfig
    from tieredstore.scan import ScanOptions, scan_queue

    cold_url, metadata_url, data_dir = sys.argv[1:4]
    config = TieredStoreConfig(data_dir=data_dir, cold_url=cold_url, metadata_url=metadata_url)
    options = ScanOptions.from_config(config, ["orders"])
    rows = [row for batch in scan_queue(options, "orders", 0, 60, 100) for row in batch.to_pylist()]
    print(json.dumps({
        "blocked": blocked,
        "pyspark_loaded": any(name.split(".")[0] == "pyspark" for name in sys.modules),
        "offsets": [row["queue_offset"] for row in rows],
        "bodies": [row["body"].hex() for row in rows],
        "columns": sorted(rows[0]),
    }))
    """
)


def test_the_scan_imports_and_reads_without_pyspark(scan_archive: Archive, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_PYSPARK, scan_archive.cold_url, scan_archive.metadata_url, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["blocked"], "the finder did not keep pyspark out: tieredstore.spark imported"
    assert not result["pyspark_loaded"]
    expected_offsets = [*range(60, 70), *range(95, 100)]
    assert result["offsets"] == expected_offsets
    assert result["bodies"] == [make_message(TOPIC, 0, offset).body.hex() for offset in expected_offsets]
    assert len(result["columns"]) == 14
