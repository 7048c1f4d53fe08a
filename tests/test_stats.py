from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from upgrade_gate.measure.stats import (
    RatioEstimate,
    fewest_rounds,
    median_interval,
    median_interval_rank,
    ratio_by_rounds,
    summarize,
)


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
    assert (estimate.low, estimate.high) == pytest.approx((1.1, 1.2))
    # Three rounds cannot give 95%: [min, max] covers the median 75% of the time, and says so.
    assert estimate.level == 0.75 and not estimate.holds and estimate.judge(2.0) == "inconclusive"


@pytest.mark.parametrize(("n", "k", "level"), [
    (6, 1, 1 - 2 / 2**6), (7, 1, 1 - 2 / 2**7), (8, 1, 1 - 2 / 2**8), (9, 2, 1 - 2 * 10 / 2**9),
    (12, 3, 1 - 2 * (1 + 12 + 66) / 2**12), (5, 1, 1 - 2 / 2**5),
])
def test_the_interval_is_the_tightest_order_statistics_that_keep_the_level(n, k, level):
    assert median_interval_rank(n) == (k, pytest.approx(level))
    assert fewest_rounds() == 6


@pytest.mark.parametrize("n", [6, 7, 9, 12])
@pytest.mark.parametrize("noise", ["lognormal", "heavy-tailed"])
def test_the_interval_covers_the_true_ratio_as_often_as_it_says(n, noise):
    """Simulated experiments with a known true ratio (the per-round ratios' median, 1.1): the
    interval holds it at least as often as its stated level, whatever the rounds' distribution."""
    rng = np.random.default_rng(17)
    trials, true_ratio = 20_000, 1.1
    spread = rng.standard_t(2, size=(trials, n)) if noise == "heavy-tailed" else rng.standard_normal((trials, n))
    ratios = true_ratio * np.exp(0.1 * spread)  # median-preserving: the noise is symmetric in log
    covered = 0
    for row in ratios.tolist():
        _, low, high, level = median_interval(row)
        covered += low <= true_ratio <= high
    observed = covered / trials
    assert observed >= level - 3 * math.sqrt(level * (1 - level) / trials), (observed, level)
    assert level >= 0.95


def test_whole_experiments_from_raw_samples_cover_the_true_ratio_as_often_as_they_say():
    """Through ratio_by_rounds, from samples: each round a machine factor both stacks share
    (the reason rounds exist), 20 samples a side around a candidate 10% slower."""
    rng = np.random.default_rng(5)
    trials, rounds, true_ratio = 4000, 9, 1.1
    covered, levels = 0, set()
    for _ in range(trials):
        machine = np.exp(0.15 * rng.standard_normal(rounds))
        baseline = [(10 * m * np.exp(0.05 * rng.standard_normal(20))).tolist() for m in machine]
        candidate = [(10 * true_ratio * m * np.exp(0.05 * rng.standard_normal(20))).tolist() for m in machine]
        estimate = ratio_by_rounds(candidate, baseline)
        assert estimate is not None
        covered += estimate.low <= true_ratio <= estimate.high
        levels.add(estimate.level)
    (level,) = levels
    assert level == pytest.approx(1 - 2 * 10 / 2**9)
    assert covered / trials >= level - 3 * math.sqrt(level * (1 - level) / trials), covered / trials


def test_an_invalid_round_is_left_out_and_counted_not_the_whole_ratio():
    good = [[10.0] * 4] * 8
    candidate = [*[[11.0] * 4] * 7, [math.nan, 11.0]]
    estimate = ratio_by_rounds(candidate, good)
    assert estimate is not None and estimate.dropped == 1 and len(estimate.per_round) == 7
    assert estimate.median == pytest.approx(1.1) and estimate.holds


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
    # ViT-Ti/16 at 1 thread: rounds from 0.76 to 1.07, median 0.91; seven rounds give [min, max].
    ("vit-ti16-threads-1.json", "forward", 1.1, "passed"),
    ("vit-ti16-threads-1.json", "forward", 1.05, "inconclusive"),
    ("vit-ti16-threads-1.json", "forward", 0.9, "inconclusive"),
    ("vit-ti16-threads-1.json", "forward", 0.75, "failed"),
    # SmolLM2 at 2 threads: the candidate's prefill is faster by a quarter.
    ("smollm2-135m-threads-2.json", "prefill", 1.05, "passed"),
    ("smollm2-135m-threads-2.json", "prefill", 0.8, "inconclusive"),
    ("smollm2-135m-threads-2.json", "prefill", 0.7, "failed"),
    ("smollm2-135m-threads-2.json", "decode", 1.2, "passed"),
    ("smollm2-135m-threads-2.json", "decode", 1.0, "inconclusive"),
    # The sensitivity benchmark: every call of the candidate made 20% slower.
    ("planted-slowdown-vit-ti16-threads-1.json", "forward", 1.05, "failed"),
    # The noise benchmark: a stack against an identical copy of itself is no regression.
    ("identical-copy-minilm-l6-threads-2.json", "forward", 1.05, "passed"),
])
def test_recorded_rounds(name, method, threshold, outcome):
    estimate = recorded(name, method)
    assert len(estimate.per_round) == 7 and estimate.level == pytest.approx(1 - 2 / 2**7)
    assert estimate.judge(threshold) == outcome
    # The same samples always give the same interval.
    assert recorded(name, method) == estimate
