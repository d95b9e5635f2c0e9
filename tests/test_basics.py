"""The shared vocabulary: a bad queue id is refused with one message wherever it is given, and a time boundary
means the same whether it is written as the facade's literal or the CLI's enum."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.helpers import Node
from tieredstore.basics import BoundaryType, check_queue_id
from tieredstore.errors import InvalidQueueError
from tieredstore.local import LocalMessageStore

from .local.conftest import small_config


@pytest.mark.parametrize("bad", [-1, True, "3", 2.0])
def test_a_bad_queue_id_is_refused_with_one_message(bad: object) -> None:
    with pytest.raises(InvalidQueueError, match=r"^queue id .+ is outside 0\.\.max_queues_per_topic-1$"):
        check_queue_id(bad)
    with pytest.raises(InvalidQueueError, match=r"^queue id .+ is outside 0\.\.7 \(max_queues_per_topic=8\)$"):
        check_queue_id(bad, 8)


def test_a_queue_id_in_range_is_taken() -> None:
    assert check_queue_id(0) == 0
    assert check_queue_id(7, 8) == 7
    with pytest.raises(InvalidQueueError, match=r"queue id 8 is outside 0\.\.7"):
        check_queue_id(8, 8)


def test_the_hot_store_and_the_cli_word_a_negative_queue_id_alike(tmp_path: Path) -> None:
    with LocalMessageStore(tmp_path / "hot", config=small_config()) as store:
        with pytest.raises(InvalidQueueError, match=r"^queue id -1 is outside 0\.\.1023 \(max_queues_per_topic=1024\)"):
            store.put_message("t", -1, b"x")
        with pytest.raises(InvalidQueueError, match=r"^queue id -1 is outside 0\.\."):
            store.max_offset("t", -1)
    result = Node("posix-sqlite", tmp_path / "node")("verify", "t", "--queue", "-1")
    assert result.exit_code == 2
    assert "queue id -1 is outside 0.." in result.stderr


def test_a_boundary_converts_both_ways() -> None:
    assert BoundaryType.of("lower") is BoundaryType.LOWER
    assert BoundaryType.of("upper") is BoundaryType.UPPER
    assert [member.boundary for member in BoundaryType] == ["lower", "upper"]
