"""The benchmark suite: one harness, every benchmark beside its baseline in the same run; see BENCHMARKS.md."""
