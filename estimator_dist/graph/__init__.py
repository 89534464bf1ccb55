"""Graph building blocks: minimize, heads, towers, gradient accumulation, numerics, precision,
XLA, gradient compression, per-replica collections, SyncReplicasOptimizer."""
