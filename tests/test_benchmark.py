"""The benchmarks' own bookkeeping: the statuses they count are the ones verdict.json writes."""

from __future__ import annotations

from upgrade_gate import benchmark
from upgrade_gate.results import GateStatus


def run(index: int, **statuses: str) -> dict:
    return {"run": index, "seconds": 90.0, "ratios": [], "machine": [],
            "latency_gates": {model: {"status": status, "measured": None, "note": ""} for model, status in statuses.items()}}


def test_a_planted_slowdown_counts_as_failed_as_verdict_json_writes_it():
    # verdict.json writes GateStatus values; the variant only one stack ran has no latency gate.
    runs = [run(i, a=GateStatus.FAILED.value, b=GateStatus.FAILED.value if i < 4 else "inconclusive") for i in range(1, 6)]
    summary = benchmark.summarize("sensitivity", "quiet", ["a", "b", "b@int8"], runs)
    assert summary["failed"] == 8 and summary["inconclusive"] == 2
    assert summary["failed_runs_per_model"] == {"a": 5, "b": 3, "b@int8": 0}
    assert summary["met"] is False  # b failed in 3 of 5
    assert benchmark.summarize("sensitivity", "quiet", ["a"], runs)["met"] is True
    assert benchmark.summarize("sensitivity", "all-cores", ["a", "b"], runs)["met"] is None
    assert benchmark.summarize("noise", "quiet", ["a"], runs)["met"] is False
    assert benchmark.summarize("noise", "quiet", ["a"], [run(1, a="passed"), run(2, a="incomplete")])["met"] is True
    assert "no gate (one stack)" in benchmark._compare_markdown(
        {**summary, "runs": [{**runs[0], "machine": [{"model": "b@int8", "threads": 1, "rounds": 9, "quiet": 9,
                                                       "others_cores": 0.01, "oversubscribed": False}]}]})
