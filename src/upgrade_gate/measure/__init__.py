"""Timing: the measure session's alternating rounds, cold start and memory (rounds) and the machine's load
around each round (_contention). The ratio's statistics are upgrade_gate.stats; the records they fill,
schema.measured. The benchmarks of all that are a checkout's tests/benchmarks/ (``nox -s benchmark``)."""
