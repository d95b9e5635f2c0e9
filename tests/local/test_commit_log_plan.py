"""CommitLog.plan lays a large batch out a file at a time exactly as record by record would."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tieredstore.local import commit_log as commit_log_module
from tieredstore.local.commit_log import CommitLog

FILE_SIZE = 4096


@settings(max_examples=100, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=100, max_value=FILE_SIZE), min_size=64, max_size=300),
    write_offset=st.integers(min_value=0, max_value=3 * FILE_SIZE),
)
def test_a_large_batch_is_planned_as_one_record_at_a_time_would_plan_it(sizes: list[int], write_offset: int) -> None:
    log = CommitLog(Path("unused"), file_size=FILE_SIZE, writable=False)
    log.write_offset = write_offset
    whole = log.plan(sizes)
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(commit_log_module, "_VECTOR_PLAN_FROM", len(sizes) + 1)
        one_by_one = log.plan(sizes)
    assert whole == one_by_one
    # and what that means: each record starts where the last ended or, after a blank, where its file starts
    ends = {position + size for position, size in zip(whole.positions, sizes, strict=True)}
    blank_ends = {at + size for at, size in whole.blanks}
    assert all(p in ends or p in blank_ends or p == write_offset for p in whole.positions)
    assert all(size >= 0 for _at, size in whole.blanks) and whole.end_offset == whole.positions[-1] + sizes[-1]
