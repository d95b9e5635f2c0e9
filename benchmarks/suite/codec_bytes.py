"""Cold bytes with zstd and with zstd + AES-256-GCM (issue 33), beside the same archive without them.

The demo's JSON messages (``tieredstore run --demo``'s producer) are archived by the real Dispatcher to a
POSIX cold tier three ways per round: uncompressed, zstd at its default level, and zstd with envelope
encryption under a fixed test key. What the cold tier then holds is counted by file type, every file
included (``.codec`` descriptors, segment markers). The uncompressed archive stores the logical bytes
(it is checked against the hot store's), so zstd's bytes over it are stored / logical; the
sealed archive's bytes over zstd's alone are encryption's overhead (a 16-byte tag per frame and the
wrapped data key in each segment's descriptor).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.cold_codecs import (
    DEMO_QUEUES,
    StoredBytes,
    codec_label,
    codec_sections,
    fill_demo_hot_store,
    stored_in_directory,
)
from benchmarks.harness import BenchmarkContext, Contender, Measurement, Metric, Target, benchmark
from benchmarks.workloads import HotData, archive_run, config_for, node_dir_over
from tieredstore.formats.consume_queue import UNIT_SIZE

FULL_MESSAGES = 200_000
COMPRESSION_TARGET = Target.at_most(1 / 3, "≤ 1/3 of uncompressed")
BLANK_SLACK = 0.99
OVERHEAD_TARGET = Target.at_most(1.01, "≤ 1.01 (1% overhead)")


def _side(hot: HotData, *, compression: bool, encrypt: bool) -> Contender:
    def run(directory: Path) -> Measurement:
        config = config_for(
            node_dir_over(hot, directory),
            queues=hot.queues,
            codecs=codec_sections(directory, compression=compression, encrypt=encrypt),
        )
        archived = archive_run(config, with_index=False, expected=hot.messages)
        stored = stored_in_directory(Path(config.effective_cold_url))
        if not compression and not encrypt:
            _check_logical(stored, hot)
        return Measurement(seconds=archived.seconds, items=hot.messages, bytes=stored.data, extras=stored.as_extras())

    return Contender(codec_label(compression=compression, encrypt=encrypt), run)


def _check_logical(stored: StoredBytes, hot: HotData) -> None:
    """The uncompressed archive must hold the logical bytes, or it is no baseline for stored / logical.

    The hot store's record bytes also count the blank record ending each full hot file, which is not
    archived: the commit log may fall short of them by that much (well under a percent).
    """
    units = hot.messages * UNIT_SIZE
    if stored.consume_queue != units or not BLANK_SLACK * hot.record_bytes <= stored.commit_log <= hot.record_bytes:
        raise RuntimeError(
            f"the uncompressed archive holds {stored.commit_log} commit-log and {stored.consume_queue} consume-queue "
            f"bytes where the hot store holds {hot.record_bytes} and {units}"
        )


def _per_type_ratios(ctx: BenchmarkContext, comparison: dict[str, Any], what: str) -> None:
    """Figures for the commit log and the consume queues apart, round by round (the pair gives them together)."""
    for extra, label in (("commit_log_bytes", "commit log"), ("consume_queue_bytes", "consume queues")):
        ours: Sequence[float] = comparison["ours"]["extras"][extra]["values"]
        base: Sequence[float] = comparison["baseline"]["extras"][extra]["values"]
        ctx.figure(f"{what}, {label}", [o / b for o, b in zip(ours, base, strict=True)], "ratio")


@benchmark(
    "codec_bytes",
    title="Cold bytes with zstd, and with zstd + AES-256-GCM, vs without",
    issue=33,
    summary=(
        f"The demo's JSON messages (`tieredstore run --demo`'s own producer: ~700 B order bodies with a key and a "
        f"tag, {len(DEMO_QUEUES)} queues over two topics) archived by the real `Dispatcher.run_once` to a POSIX "
        'cold tier uncompressed, with `[cold] compression = "zstd"` (default level) and with zstd plus '
        "`[encryption]` under a keyring file's fixed test key; the bytes the cold tier holds for the commit log "
        "and the consume queues, descriptors included."
    ),
)
def codec_bytes(ctx: BenchmarkContext) -> None:
    _measure(ctx)


def _measure(ctx: BenchmarkContext) -> None:
    messages = ctx.scale(full=FULL_MESSAGES, quick=2_000)
    hot = fill_demo_hot_store(ctx.work_dir / "source", messages=messages)
    ctx.parameter(
        messages=messages,
        queues=hot.queues,
        hot_record_bytes=hot.record_bytes,
        cold_tier="POSIX",
        key_index="not written",
    )
    plain = _side(hot, compression=False, encrypt=False)
    zstd = _side(hot, compression=True, encrypt=False)
    sealed = _side(hot, compression=True, encrypt=True)
    pairs = (
        ("zstd vs uncompressed", "over the same uncompressed (= logical bytes)", plain, zstd, COMPRESSION_TARGET),
        ("zstd + AES-256-GCM vs zstd", "sealed over unsealed", zstd, sealed, OVERHEAD_TARGET),
    )
    for name, over, baseline, ours, target in pairs:
        comparison = ctx.compare(
            name,
            description=f"commit log + consume queues stored, {over}",
            baseline=baseline,
            ours=ours,
            unit="msg",
            metric=Metric.STORED_BYTES,
            target=target,
        )
        _per_type_ratios(
            ctx, comparison, f"{ours.label} stored / {'logical' if baseline is plain else baseline.label + ' stored'}"
        )
    ctx.note(
        "Every demo body carries a 600-character run of one letter (its `note` field), so these bodies compress "
        "far better than most JSON would; the ratio says what zstd does to the demo's messages, no more."
    )
    ctx.note(
        "Each commit is compressed on its own (one frame per commit, at most 4 MiB), so a read fetches only the "
        "frames its range covers; the consume queues' frames are small (20 bytes a message), which is where the "
        "per-frame header and tag weigh most."
    )
