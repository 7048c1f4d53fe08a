from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from upgrade_gate.stats import RatioEstimate, ratio_by_rounds, summarize


def test_summary_of_known_samples():
    samples = [float(v) for v in range(1, 101)]  # 1 … 100 ms
    summary = summarize(samples)
    assert summary is not None
    assert summary.runs == 100
    assert summary.min_ms == 1.0 and summary.max_ms == 100.0
    assert summary.p50_ms == pytest.approx(50.5)
    assert summary.p90_ms == pytest.approx(90.1)
    # 10% trimmed each side: mean of 11 … 90
    assert summary.trimmed_mean_ms == pytest.approx(50.5)


def test_trimmed_mean_ignores_outliers():
    samples = [10.0] * 48 + [1000.0, 0.001]
    summary = summarize(samples)
    assert summary is not None and summary.trimmed_mean_ms == pytest.approx(10.0)


@pytest.mark.parametrize("samples", [[], [1.0, math.nan], [1.0, math.inf], [1.0, -0.5]])
def test_unusable_samples_give_no_summary(samples):
    assert summarize(samples) is None


def test_single_sample():
    summary = summarize([2.5])
    assert summary is not None
    assert (summary.p50_ms, summary.p90_ms, summary.trimmed_mean_ms) == (2.5, 2.5, 2.5)


def test_p99_iqr_and_rate():
    summary = summarize([float(v) for v in range(1, 101)])
    assert summary is not None
    assert summary.p99_ms == pytest.approx(99.01)
    assert summary.iqr_ms == pytest.approx(75.25 - 25.75)
    assert summary.per_second == pytest.approx(1000 / 50.5)


def test_ratio_is_the_median_of_per_round_ratios():
    baseline = [[10.0, 10.0, 11.0], [20.0, 20.0, 20.0], [10.0, 10.0, 10.0]]  # round 2 ran on a busy machine
    candidate = [[12.0, 12.0, 12.0], [24.0, 24.0, 30.0], [11.0, 11.0, 11.0]]
    estimate = ratio_by_rounds(candidate, baseline)
    assert estimate is not None
    assert estimate.per_round == pytest.approx((1.2, 1.2, 1.1))
    assert estimate.median == pytest.approx(1.2)
    assert estimate.low <= estimate.median <= estimate.high
    assert (estimate.low, estimate.high) == pytest.approx((1.1, 1.2))


def test_identical_rounds_give_a_point_interval():
    estimate = ratio_by_rounds([[5.0] * 8] * 7, [[4.0] * 8] * 7)
    assert estimate is not None and (estimate.low, estimate.median, estimate.high) == (1.25, 1.25, 1.25)
    assert (estimate.judge(1.3), estimate.judge(1.25), estimate.judge(1.2)) == ("passed", "passed", "failed")


@pytest.mark.parametrize("rounds", [[], [[1.0, math.nan]], [[-1.0]]])
def test_no_ratio_without_valid_rounds(rounds):
    assert ratio_by_rounds(rounds, [[1.0]] * max(len(rounds), 1)) is None


RECORDED = Path(__file__).parent / "data" / "latency"


def recorded(name: str, method: str) -> RatioEstimate:
    """Rounds measured on the reference machine (tests/data/latency, see docs/benchmarks.md)."""
    data = json.loads((RECORDED / name).read_text())
    rounds = {stack: [r["samples_ms"][method] for r in s["rounds"]] for stack, s in data["stacks"].items()}
    baseline, candidate = data["order"]
    estimate = ratio_by_rounds(rounds[candidate], rounds[baseline])
    assert estimate is not None
    return estimate


@pytest.mark.parametrize(("name", "method", "threshold", "outcome"), [
    # ViT-Ti/16 at 1 thread: rounds from 0.78 to 0.99, median 0.91.
    ("vit-ti16-threads-1.json", "forward", 1.05, "passed"),
    ("vit-ti16-threads-1.json", "forward", 0.9, "inconclusive"),
    ("vit-ti16-threads-1.json", "forward", 0.75, "failed"),
    # SmolLM2 at 2 threads: the candidate's prefill is faster by a quarter.
    ("smollm2-135m-threads-2.json", "prefill", 1.05, "passed"),
    ("smollm2-135m-threads-2.json", "prefill", 0.8, "inconclusive"),
    ("smollm2-135m-threads-2.json", "prefill", 0.7, "failed"),
    ("smollm2-135m-threads-2.json", "decode", 1.0, "passed"),
    # The sensitivity benchmark: every call of the candidate made 20% slower.
    ("planted-slowdown-vit-ti16-threads-1.json", "forward", 1.05, "failed"),
    # The noise benchmark: a stack against an identical copy of itself is no regression.
    ("identical-copy-minilm-l6-threads-2.json", "forward", 1.05, "passed"),
])
def test_recorded_rounds(name, method, threshold, outcome):
    estimate = recorded(name, method)
    assert len(estimate.per_round) == 7
    assert estimate.judge(threshold) == outcome
    # The same samples always give the same interval (a fixed bootstrap seed).
    assert recorded(name, method) == estimate
