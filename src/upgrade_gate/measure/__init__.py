"""Timing: the measure session's alternating rounds, cold start and memory (rounds), the machine's load
around each round (_contention), the ratio's statistics (stats), and the benchmarks of all that
(benchmarks)."""
