"""The read side above the tiers: what the fetcher serves and how (result types, the read-ahead cache,
prefetching, tier routing, per-queue read state), and the read node the CLI and restore open."""
