"""Each process role's allocator tuning (``tieredstore.tuning``): the archiver's batch-sized buffers reuse freed
pages instead of faulting in new ones; a restore maps its large buffers on their own.

Each probe runs in its own interpreter, since the tuning is process-wide and cannot be undone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.archiver.processes import child_env, run_producer, run_tieredstore

MIB = 1 << 20

# Tune for the role named (or not at all), then fill and free a 4 MiB buffer (a batch of group_commit_size) 40
# times; print what was applied and the minor page faults.
_PROBE = """
import json, resource, sys
from tieredstore import tuning
applied = {"archiver": tuning.tune_for_archiver, "restore": tuning.tune_for_restore}.get(sys.argv[1], dict)()
size, page = 4 << 20, b"x" * 4096
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(40):
    buffer = bytearray(size)
    buffer[:] = page * (size // 4096)
    del buffer
print(json.dumps({"faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before, "applied": applied}))
"""


def _probe(role: str, **environment: str) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")} | environment
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, role], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    result = json.loads(done.stdout)
    assert isinstance(result, dict)
    return result


def test_tuned_allocator_reuses_a_freed_batch_buffer_instead_of_faulting_in_a_new_one() -> None:
    default, tuned = _probe("none"), _probe("archiver")
    assert tuned["applied"] == {
        "MALLOC_TRIM_THRESHOLD_": 32 << 20,
        "MALLOC_MMAP_THRESHOLD_": 32 << 20,
        "MALLOC_ARENA_MAX": 2,
    }
    faults, tuned_faults = int(str(default["faults"])), int(str(tuned["faults"]))
    # glibc's defaults map every 4 MiB block afresh (1,024 page faults each, twice a round here); tuned,
    # the first round's pages are reused by the next 39.
    assert faults > 40 * 1024
    assert tuned_faults * 10 < faults, (tuned_faults, faults)


def test_a_malloc_variable_the_user_set_is_left_to_win() -> None:
    tuned = _probe("archiver", MALLOC_ARENA_MAX="3")
    assert tuned["applied"] == {"MALLOC_TRIM_THRESHOLD_": 32 << 20, "MALLOC_MMAP_THRESHOLD_": 32 << 20}
    # A restore maps every buffer of 1 MiB or more on its own, so that freeing one returns it; not over the user's.
    assert _probe("restore")["applied"] == {"MALLOC_MMAP_THRESHOLD_": 1 * MIB}
    assert _probe("restore", MALLOC_MMAP_THRESHOLD_=str(8 * MIB))["applied"] == {}


def test_run_tunes_the_allocator_and_an_old_setting_to_switch_it_off_is_ignored(tmp_path: Path) -> None:
    env = child_env({"TIEREDSTORE_DATA_DIR": tmp_path / "data"})
    run_producer(50, seed=3, env=env)
    # The line is logged at INFO: the CLI shows it with --debug.
    on = run_tieredstore(["--debug", "--output", "json", "run", "--once"], env)
    assert on.returncode == 0, on.stderr
    assert "allocator tuned for batches" in on.stderr and "malloc_arena_max=2" in on.stderr
    old = run_tieredstore(
        ["--debug", "--output", "json", "run", "--once"], env | {"TIEREDSTORE_ARCHIVER__TUNE_ALLOCATOR": "false"}
    )
    assert old.returncode == 0, old.stderr
    assert "archiver.tune_allocator is ignored" in old.stderr
    assert "allocator tuned for batches" in old.stderr
