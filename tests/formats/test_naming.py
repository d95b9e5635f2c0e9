"""Golden names of the cold layout: segment names, queue paths and keys, and their reverse parse."""

from __future__ import annotations

import hashlib

import pytest

from tieredstore.errors import ValidationError
from tieredstore.formats.naming import FileType, index_path, parse_segment_name, queue_path, segment_key, segment_name


@pytest.mark.parametrize(
    ("base_offset", "name"),
    [(0, "cfcd208400000000000000000000"), (4294937144, "b10da56800000000004294937144")],
)
def test_golden_segment_names(base_offset: int, name: str) -> None:
    assert segment_name(base_offset) == name
    assert parse_segment_name(name) == base_offset


@pytest.mark.parametrize("base_offset", [1, 1024, 10**19, 2**63 - 1])
def test_names_round_trip_and_sort_within_a_hash(base_offset: int) -> None:
    name = segment_name(base_offset)
    assert len(name) == 28
    assert name[:8] == hashlib.md5(str(base_offset).encode()).hexdigest()[:8]
    assert parse_segment_name(name) == base_offset


@pytest.mark.parametrize(
    "name",
    ["cfcd20840000000000000000000", "ffffffff00000000000000000000", "CFCD208400000000000000000000", ".created"],
)
def test_malformed_or_mismatched_names_are_refused(name: str) -> None:
    with pytest.raises(ValidationError):
        parse_segment_name(name)


def test_negative_offsets_have_no_name() -> None:
    with pytest.raises(ValidationError):
        segment_name(-1)


def test_queue_paths_and_keys() -> None:
    cluster_hash = hashlib.md5(b"DefaultCluster").hexdigest()[:8]
    assert (
        queue_path("DefaultCluster", "broker-a", "TopicTest", 3)
        == f"{cluster_hash}_DefaultCluster/broker-a/TopicTest/3"
    )
    assert index_path("DefaultCluster", "broker-a") == f"{cluster_hash}_DefaultCluster/broker-a/rmq_sys_INDEX/0"
    assert segment_key("q", FileType.CONSUME_QUEUE, 0) == "q/CONSUME_QUEUE/cfcd208400000000000000000000"
