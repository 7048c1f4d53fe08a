"""Latency statistics from raw per-run samples (milliseconds): summaries, and
the candidate/baseline ratio with a confidence interval whose coverage is known.

The ratio is judged by rounds, not by pooled samples: the stacks are measured
in turn within each round, so a round's two medians saw the same machine, and
the spread of the per-round ratios is the noise the verdict must see through.

The interval is the distribution-free one for a median: with n per-round ratios
sorted, [x(k), x(n−k+1)] holds the true median with probability
1 − 2·P(B ≤ k−1), B ~ Binomial(n, ½), whatever the ratios' distribution (for a
continuous one; ties only widen it). The tightest k that keeps that at or above
``CONFIDENCE`` is used, and the probability it achieves is reported with the
interval: 9 rounds give [x(2), x(8)] at 96.1%; 6 to 8 rounds can only give
[min, max] (96.9–99.2%); fewer than 6 cannot reach 95% at all. (A percentile
bootstrap of 7 rounds, used before, always returned x(2) and x(6): 87.5%.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from upgrade_gate.schema import codec

TRIM_FRACTION = 0.1  # drop the fastest and slowest 10% for the trimmed mean
CONFIDENCE = 0.95


def median_coverage(n: int, k: int) -> float:
    """The probability that [x(k), x(n−k+1)] of n samples holds their distribution's median."""
    return 1.0 - 2.0 * sum(math.comb(n, i) for i in range(k)) / 2.0**n


def median_interval_rank(n: int, confidence: float = CONFIDENCE) -> tuple[int, float]:
    """The largest k whose [x(k), x(n−k+1)] covers the median with at least ``confidence``
    (1, [min, max], when none does), and the coverage it achieves."""
    k = 1
    while k + 1 <= (n + 1) // 2 and median_coverage(n, k + 1) >= confidence:
        k += 1
    return k, median_coverage(n, k)


def fewest_rounds(confidence: float = CONFIDENCE) -> int:
    """The fewest rounds whose [min, max] reaches ``confidence``: 6 for 95%."""
    n = 1
    while median_coverage(n, 1) < confidence:
        n += 1
    return n


@dataclass(frozen=True, kw_only=True, slots=True)
class LatencySummary(codec.Record):
    DERIVED = (codec.derived("per_second"),)  # for readers of the file

    runs: int
    min_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    trimmed_mean_ms: float
    iqr_ms: float  # p75 − p25
    max_ms: float

    @property
    def per_second(self) -> float:
        """Calls per second at the median: frames per second for a vision model."""
        return 1000.0 / self.p50_ms if self.p50_ms > 0 else math.inf


def summarize(samples_ms: list[float]) -> LatencySummary | None:
    """None when there is nothing to summarize or a sample is not a finite duration."""
    values = _valid(samples_ms)
    if values is None:
        return None
    ordered = np.sort(values)
    cut = int(math.floor(ordered.size * TRIM_FRACTION))
    trimmed = ordered[cut : ordered.size - cut] if ordered.size > 2 * cut else ordered
    p25, p50, p75, p90, p99 = np.percentile(ordered, [25, 50, 75, 90, 99])
    return LatencySummary(
        runs=int(ordered.size),
        min_ms=float(ordered[0]),
        p50_ms=float(p50),
        p90_ms=float(p90),
        p99_ms=float(p99),
        trimmed_mean_ms=float(trimmed.mean()),
        iqr_ms=float(p75 - p25),
        max_ms=float(ordered[-1]),
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class RatioEstimate(codec.Record):
    """Candidate/baseline latency: the median of the per-round ratios of medians, with
    the order-statistic interval of that median and the coverage it achieves."""

    median: float
    low: float
    high: float
    per_round: tuple[float, ...]  # the rounds the ratio is made of
    confidence: float = CONFIDENCE  # the coverage asked for
    level: float = CONFIDENCE  # the coverage the interval has (≥ confidence, or less with too few rounds)
    dropped: int = 0  # rounds left out: samples that were not finite durations on either side

    @property
    def holds(self) -> bool:
        """Whether the interval has the coverage asked for."""
        return self.level >= self.confidence

    def judge(self, threshold: float) -> str:
        """``passed`` when the whole interval is within the threshold, ``failed``
        when it lies wholly beyond, ``inconclusive`` when it straddles it — or when
        too few rounds leave the interval short of its stated coverage."""
        if not self.holds:
            return "inconclusive"
        if self.high <= threshold:
            return "passed"
        if self.low > threshold:
            return "failed"
        return "inconclusive"

    def __str__(self) -> str:
        return f"{self.median:.3f}, {self.level:.1%} interval [{self.low:.3f}, {self.high:.3f}]"


def ratio_by_rounds(candidate_rounds: list[list[float]], baseline_rounds: list[list[float]],
                    confidence: float = CONFIDENCE) -> RatioEstimate | None:
    """One ratio per round (the candidate's median over the baseline's, both measured
    in that round), their median, and the order-statistic interval of that median.

    A round whose samples are not finite durations on either side is left out and
    counted; the others keep their ratio. None without one round of valid samples.
    """
    ratios, dropped = [], 0
    for candidate, baseline in zip(candidate_rounds, baseline_rounds):
        a, b = _valid(candidate), _valid(baseline)
        if a is None or b is None or np.median(b) <= 0:
            dropped += 1
            continue
        ratios.append(float(np.median(a) / np.median(b)))
    if not ratios:
        return None
    median, low, high, level = median_interval(ratios, confidence)
    return RatioEstimate(median=median, low=low, high=high, per_round=tuple(ratios), confidence=confidence,
                         level=level, dropped=dropped)


def median_interval(values: list[float], confidence: float = CONFIDENCE) -> tuple[float, float, float, float]:
    """The median of ``values``, its order-statistic interval, and the interval's coverage."""
    ordered = sorted(values)
    n = len(ordered)
    k, level = median_interval_rank(n, confidence)
    middle = (ordered[(n - 1) // 2] + ordered[n // 2]) / 2
    return middle, ordered[k - 1], ordered[n - k], level


def _valid(samples_ms: list[float]) -> np.ndarray | None:
    values = np.asarray(samples_ms, dtype=np.float64)
    if values.size == 0 or not np.isfinite(values).all() or (values < 0).any():
        return None
    return values
