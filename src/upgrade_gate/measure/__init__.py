"""Timing: the measure session's alternating rounds, cold start and memory (rounds), the machine's load
around each round (_contention), and the benchmarks of all that (benchmarks). The ratio's statistics are
upgrade_gate.stats; the records they fill, schema.measured."""
