"""The statistics of latency rounds: the candidate/baseline ratio's interval, whose coverage is known,
how many rounds it needs, and where rounds that may stop early look. Pure maths: the records that
carry the figures (``schema.measured``: ``RatioEstimate``, ``ratio_by_rounds``, ``LatencySummary``)
are built on it.

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

CONFIDENCE = 0.95
# A round's samples kept per method. A call of a few microseconds is timed some 70 000 times in a
# round's 0.2 s floor: every one of them made a two-layer MLP's measurement file 15.7 MB. More are
# kept as their order statistics at this many evenly spaced ranks (odd: the median is one of them;
# every half percent of the round's distribution, its p99 among them).
SAMPLES_KEPT = 201


def gate_intervals(thread_counts: int, methods: int, targets: int = 1) -> int:
    """The intervals a latency gate judges: one per thread count and method on this machine; the device-latency
    gate one per target, thread count and method, since it is one gate over every target it names (the worst
    deciding) and each target's rounds are a measurement of their own, as a thread count's are."""
    return max(1, targets) * thread_counts * max(1, methods)


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
def sequential_looks(rounds: int, confidence: float = CONFIDENCE, most: int = 0) -> dict[int, int]:
    """Where a measurement of ``rounds`` rounds looks, and each look's rank ``{n: k}``.

    The last planned look is the fixed design's (``median_interval_rank``): a measurement that runs
    to the end reports the interval it always did. Earlier looks are added from the fewest rounds
    up, each with the tightest rank that keeps the chance that any look misses within
    1 − ``confidence`` (a look that cannot fit is skipped): 9 rounds look at 7 and 8
    ([min, max]) and at 9 ([x(2), x(8)]), 95.7% in all.

    With ``most`` past ``rounds``, an interval that still straddles after them may go on
    (``looks_past``): the looks up to ``rounds`` stay as they are, so a measurement decided by
    then is the same as without, and what they left of 1 − ``confidence`` pays for the looks after."""
    looks = {rounds: median_interval_rank(rounds, confidence)[0]}
    for n in range(fewest_rounds(confidence), rounds):
        fits = [k for k in range(1, (n + 1) // 2 + 1) if miss_probability({**looks, n: k}) <= 1 - confidence]
        if fits:
            looks[n] = max(fits)
    return dict(sorted({**looks, **looks_past(looks, most, confidence)}.items()))


def looks_past(looks: dict[int, int], most: int, confidence: float = CONFIDENCE) -> dict[int, int]:
    """Looks after the last of ``looks``, up to ``most`` rounds, each narrower than that last one (a
    look of its rank or less over more rounds is only wider: it could decide nothing new), keeping
    the chance that any look misses within 1 − ``confidence``. The last, ``most``, gets the tightest
    rank that fits, then the rounds between from the first up, as the planned looks are chosen. None
    where even a rank one tighter does not fit: a gate of 12 intervals, whose 9 rounds spend nearly
    all of its share, gets none up to 15; a gate of 2 gets 12–14 ([x(2), …]) and 15 ([x(3), …])."""
    last_round = max(looks)
    last = looks[last_round]

    def tightest(n: int, past: dict[int, int]) -> int | None:
        fits = [k for k in range(last + 1, (n + 1) // 2 + 1)
                if miss_probability({**looks, **past, n: k}) <= 1 - confidence]
        return max(fits, default=None)

    past: dict[int, int] = {}
    if most <= last_round or (at_most := tightest(most, past)) is None:
        return past
    past[most] = at_most
    for n in range(last_round + 1, most):
        if (k := tightest(n, past)) is not None:
            past[n] = k
    return past


@functools.cache
def sequential_rank(n: int, planned: int, confidence: float = CONFIDENCE, most: int = 0) -> tuple[int, float]:
    """The rank of n rounds' interval in a measurement of ``planned`` rounds (up to ``most`` while an
    interval straddles) that may stop at its looks, and the coverage the whole procedure guarantees for
    it. At a look: the look's rank. Short of one (a busy machine or an ended server stopped the rounds,
    not the ratios): the earlier looks' chances plus the tightest rank at n that keeps them within, else
    [min, max]."""
    looks = sequential_looks(planned, confidence, most)
    if n in looks:
        return looks[n], 1.0 - miss_probability(looks)
    earlier = {m: k for m, k in looks.items() if m < n}
    k = 1
    while k + 1 <= (n + 1) // 2 and miss_probability({**earlier, n: k + 1}) <= 1 - confidence:
        k += 1
    return k, 1.0 - miss_probability({**earlier, n: k})


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


def median_interval(values: list[float], confidence: float = CONFIDENCE,
                    planned: int = 0, most: int = 0) -> tuple[float, float, float, float]:
    """The median of ``values``, its order-statistic interval, and the interval's coverage
    (of the sequential design of ``planned`` rounds, up to ``most`` while one straddles, when not 0)."""
    ordered = sorted(values)
    n = len(ordered)
    k, level = sequential_rank(n, planned, confidence, most) if planned else median_interval_rank(n, confidence)
    middle = (ordered[(n - 1) // 2] + ordered[n // 2]) / 2
    return middle, ordered[k - 1], ordered[n - k], level
