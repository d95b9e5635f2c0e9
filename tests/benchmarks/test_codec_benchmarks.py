"""The issue-33 benchmarks measure what they say: codecs reach the cold tier through the config they set, and
the bytes are counted per file type from what the cold tier holds.

Figures are not asserted beyond their direction (compressed is smaller, sealed is larger than unsealed):
those follow from the codecs being on at all, whatever the machine.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.cold_codecs import tally
from benchmarks.harness import discover, run_one


def test_stored_bytes_are_summed_by_the_type_folder_in_each_key() -> None:
    stored = tally(
        [
            ("c/b/T/0/COMMIT_LOG/cfcd208400000000000000000000/.codec", 100),
            ("c/b/T/0/COMMIT_LOG/cfcd208400000000000000000000/00000000000000000000", 5_000),
            ("c/b/T/0/CONSUME_QUEUE/cfcd208400000000000000000000", 400),
            ("c/b/rmq_sys_INDEX/0/INDEX/cfcd208400000000000000000000", 70),
            ("c/b/.created", 0),
        ]
    )

    assert (stored.commit_log, stored.consume_queue, stored.index) == (5_100, 400, 70)
    assert stored.data == 5_500 and stored.total == 5_570


def test_codec_bytes_compresses_and_seals_the_demo_archive_beside_its_uncompressed_copy(tmp_path: Path) -> None:
    registry, _ = discover()

    document = run_one(registry["codec_bytes"], quick=True, out_dir=tmp_path)

    assert document["status"] == "ok", document["error"]
    compressed, sealed = document["comparisons"]
    plain = compressed["baseline"]["extras"]
    assert plain["consume_queue_bytes"]["median"] == document["parameters"]["messages"] * 20, "logical units"
    assert compressed["ours"]["values"][0] < compressed["baseline"]["values"][0], "zstd must shrink the demo"
    assert sealed["ours"]["values"][0] > sealed["baseline"]["values"][0], "a tag per frame, a wrapped key each"
    figures = {figure["name"]: figure["median"] for figure in document["figures"]}
    assert 0 < figures["zstd stored / logical, commit log"] < 1
    assert figures["zstd + AES-256-GCM stored / zstd stored, consume queues"] > 1
