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

Rounds may stop early (``sequential_looks``): after some rounds before the last the
interval is looked at, and the measurement stops once it lies wholly on one side of
the threshold. Every look is a chance to be wrong, so the looks' ranks are chosen so
that the probability that *any* look's interval misses the median stays within
1 − ``CONFIDENCE``. That probability is exact and distribution-free: whether each
round's ratio falls below the median is a fair coin, so a look at n rounds with rank k
misses when fewer than k of the first n coins fell on one side (``miss_probability``,
a walk over the coins). The interval a stopped measurement reports, at whatever look,
holds the median with at least the stated level, however the stop was decided.

A latency gate judges several intervals (one per thread count and method) and fails when any
one lies wholly beyond its threshold, so its own chance of being wrong is theirs added up. Each
interval is therefore held to ``interval_confidence``: 1 − (1 − ``CONFIDENCE``)/m for a gate of m
intervals, and the m of them hold their true ratios together with at least ``CONFIDENCE``,
whatever the dependence between them (the chance that any misses is at most the sum of theirs).
The price is rounds: [min, max] of n rounds reaches 1 − 2/2ⁿ, so a gate of 2 or 3 intervals needs
7 rounds, of 4 to 6 needs 8, of 7 to 12 needs 9 (``fewest_rounds``), and the default 9 rounds give
[min, max] where one interval had [x(2), x(8)].
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass

import numpy as np

from upgrade_gate.schema import codec

TRIM_FRACTION = 0.1  # drop the fastest and slowest 10% for the trimmed mean
CONFIDENCE = 0.95
# A round's samples kept per method. A call of a few microseconds is timed some 70 000 times in a
# round's 0.2 s floor: every one of them made a two-layer MLP's measurement file 15.7 MB. More are
# kept as their order statistics at this many evenly spaced ranks (odd: the median is one of them;
# every half percent of the round's distribution, its p99 among them).
SAMPLES_KEPT = 201


def interval_confidence(intervals: int, confidence: float = CONFIDENCE) -> float:
    """What each of a gate's ``intervals`` intervals must cover for all of them to hold their true
    ratios together with at least ``confidence``: the chance that any one misses is at most the sum
    of their chances, whatever the dependence between them (Bonferroni)."""
    return 1.0 - (1.0 - confidence) / max(1, intervals)


def together(levels: list[float]) -> float:
    """The coverage intervals of these levels have together, at least (the same bound): a gate's own."""
    return max(0.0, 1.0 - sum(1.0 - level for level in levels))


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
    """The fewest rounds whose [min, max] reaches ``confidence``: 6 for 95%, 7 for 97.5% (each of a
    gate's 2 intervals), 9 for 99.58% (each of 12)."""
    n = 1
    while median_coverage(n, 1) < confidence:
        n += 1
    return n


def miss_probability(looks: dict[int, int]) -> float:
    """The probability that at least one look's interval — ``{rounds: k}``, [x(k), x(n−k+1)] of
    the first n rounds — misses the median: each round's ratio lies below it with probability ½,
    independently, so this is a walk over the count below, counted exactly."""
    below = {0: 1.0}  # rounds below the median so far → probability, among walks not yet missed
    missed = 0.0
    for n in range(1, max(looks, default=0) + 1):
        step: dict[int, float] = {}
        for count, p in below.items():
            step[count] = step.get(count, 0.0) + p / 2
            step[count + 1] = step.get(count + 1, 0.0) + p / 2
        below = step
        if n in looks:
            k = looks[n]
            missed += sum(p for count, p in below.items() if count < k or n - count < k)
            below = {count: p for count, p in below.items() if not (count < k or n - count < k)}
    return missed


@functools.cache
def sequential_looks(rounds: int, confidence: float = CONFIDENCE) -> dict[int, int]:
    """Where a measurement of at most ``rounds`` rounds looks, and each look's rank ``{n: k}``.

    The last look is the fixed design's (``median_interval_rank``): a measurement that runs to
    the end reports the interval it always did. Earlier looks are added from the fewest rounds
    up, each with the tightest rank that keeps the chance that any look misses within
    1 − ``confidence`` (a look that cannot fit is skipped): 9 rounds look at 7 and 8
    ([min, max]) and at 9 ([x(2), x(8)]), 95.7% in all."""
    looks = {rounds: median_interval_rank(rounds, confidence)[0]}
    for n in range(fewest_rounds(confidence), rounds):
        fits = [k for k in range(1, (n + 1) // 2 + 1) if miss_probability({**looks, n: k}) <= 1 - confidence]
        if fits:
            looks[n] = max(fits)
    return dict(sorted(looks.items()))


@functools.cache
def sequential_rank(n: int, planned: int, confidence: float = CONFIDENCE) -> tuple[int, float]:
    """The rank of n rounds' interval in a measurement of at most ``planned`` rounds that may stop
    at its looks, and the coverage the whole procedure guarantees for it. At a look: the look's
    rank. Short of one (a busy machine or an ended server stopped the rounds, not the ratios):
    the earlier looks' chances plus the tightest rank at n that keeps them within, else [min, max]."""
    looks = sequential_looks(planned, confidence)
    if n in looks:
        return looks[n], 1.0 - miss_probability(looks)
    earlier = {m: k for m, k in looks.items() if m < n}
    k = 1
    while k + 1 <= (n + 1) // 2 and miss_probability({**earlier, n: k + 1}) <= 1 - confidence:
        k += 1
    return k, 1.0 - miss_probability({**earlier, n: k})


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


def kept_samples(samples_ms: list[float], most: int = SAMPLES_KEPT) -> list[float]:
    """A round's samples as the measurement file keeps them: all of them when there are at most ``most``,
    else their order statistics at ``most`` evenly spaced ranks — the fastest, the slowest and the median
    among them. Every round of a method times as many calls (the server's runs per round), so the rounds'
    kept samples pooled stand for their calls pooled, each at 1/200 of the distribution's ranks."""
    if len(samples_ms) <= most:
        return list(samples_ms)
    ordered = sorted(samples_ms)
    last = len(ordered) - 1
    return [ordered[round(j * last / (most - 1))] for j in range(most)]


def summarize(samples_ms: list[float], calls: int | None = None) -> LatencySummary | None:
    """None when there is nothing to summarize or a sample is not a finite duration. ``calls``: how many
    calls the samples stand for, when a round kept fewer (``kept_samples``)."""
    values = _valid(samples_ms)
    if values is None:
        return None
    ordered = np.sort(values)
    cut = int(math.floor(ordered.size * TRIM_FRACTION))
    trimmed = ordered[cut : ordered.size - cut] if ordered.size > 2 * cut else ordered
    p25, p50, p75, p90, p99 = np.percentile(ordered, [25, 50, 75, 90, 99])
    return LatencySummary(
        runs=calls or int(ordered.size),
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
    confidence: float = CONFIDENCE  # the coverage asked of this interval (interval_confidence: its gate's share)
    level: float = CONFIDENCE  # the coverage the interval has (≥ confidence, or less with too few rounds)
    dropped: int = 0  # rounds left out: samples that were not finite durations on either side
    planned: int = 0  # a measurement that could stop early (sequential_looks): its rounds at most; 0: fixed rounds

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

    def outcome(self, threshold: float, baseline_ms: float, min_delta_ms: float) -> str:
        """The latency gate's rule for one ratio: ``passed`` when the candidate is at most
        ``min_delta_ms`` slower than the baseline's ``baseline_ms`` even at the interval's top
        (timer and call overhead), else ``judge``. What the rounds stop on (stop-early) too."""
        return "passed" if baseline_ms * (self.high - 1) <= min_delta_ms else self.judge(threshold)

    def __str__(self) -> str:
        return f"{self.median:.3f}, {self.level:.1%} interval [{self.low:.3f}, {self.high:.3f}]"


def ratio_by_rounds(candidate_rounds: list[list[float]], baseline_rounds: list[list[float]],
                    confidence: float = CONFIDENCE, planned: int = 0) -> RatioEstimate | None:
    """One ratio per round (the candidate's median over the baseline's, both measured
    in that round), their median, and the order-statistic interval of that median —
    of the sequential design when the rounds could stop early (``planned``: their most).

    A round whose samples are not finite durations on either side is left out and
    counted; the others keep their ratio. None without one round of valid samples.
    """
    ratios, dropped = [], 0
    for candidate, baseline in zip(candidate_rounds, baseline_rounds):
        a, b = _valid(candidate), _valid(baseline)
        theirs = statistics.median(b.tolist()) if b is not None else 0.0  # a few samples: numpy's call costs more
        if a is None or theirs <= 0:
            dropped += 1
            continue
        ratios.append(statistics.median(a.tolist()) / theirs)
    if not ratios:
        return None
    median, low, high, level = median_interval(ratios, confidence, planned)
    return RatioEstimate(median=median, low=low, high=high, per_round=tuple(ratios), confidence=confidence,
                         level=level, dropped=dropped, planned=planned)


def median_interval(values: list[float], confidence: float = CONFIDENCE,
                    planned: int = 0) -> tuple[float, float, float, float]:
    """The median of ``values``, its order-statistic interval, and the interval's coverage
    (of the sequential design of at most ``planned`` rounds, when not 0)."""
    ordered = sorted(values)
    n = len(ordered)
    k, level = sequential_rank(n, planned, confidence) if planned else median_interval_rank(n, confidence)
    middle = (ordered[(n - 1) // 2] + ordered[n // 2]) / 2
    return middle, ordered[k - 1], ordered[n - k], level


def _valid(samples_ms: list[float]) -> np.ndarray | None:
    values = np.asarray(samples_ms, dtype=np.float64)
    if values.size == 0 or not np.isfinite(values).all() or (values < 0).any():
        return None
    return values
