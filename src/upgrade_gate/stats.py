"""Latency statistics from raw per-run samples (milliseconds): summaries, and
the candidate/baseline ratio with a confidence interval.

The ratio is judged by rounds, not by pooled samples: the stacks are measured
alternately (A B A B …), so a round's two medians saw the same machine, and
the spread of the per-round ratios is the noise the verdict must see through.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import numpy as np

from upgrade_gate.records import Reader

TRIM_FRACTION = 0.1  # drop the fastest and slowest 10% for the trimmed mean
CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 10_000
# A fixed seed: the same samples give the same interval, in the report and in the tests.
BOOTSTRAP_SEED = 0


@dataclass(frozen=True, kw_only=True, slots=True)
class LatencySummary:
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

    def to_dict(self) -> dict[str, float | int]:
        return {**asdict(self), "per_second": self.per_second}

    @classmethod
    def from_reader(cls, r: Reader) -> LatencySummary:
        return cls(runs=r.integer("runs"), **{f.name: r.number(f.name) for f in fields(cls) if f.name != "runs"})


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
class RatioEstimate:
    """Candidate/baseline latency: the median of the per-round ratios of medians,
    with a bootstrap interval over the rounds."""

    median: float
    low: float
    high: float
    per_round: tuple[float, ...]
    confidence: float = CONFIDENCE

    def judge(self, threshold: float) -> str:
        """``passed`` when the whole interval is within the threshold, ``failed``
        when it lies wholly beyond, ``inconclusive`` when it straddles it."""
        if self.high <= threshold:
            return "passed"
        if self.low > threshold:
            return "failed"
        return "inconclusive"

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "per_round": list(self.per_round)}

    @classmethod
    def from_reader(cls, r: Reader) -> RatioEstimate:
        return cls(median=r.number("median"), low=r.number("low"), high=r.number("high"),
                   per_round=r.numbers("per_round"), confidence=r.number("confidence"))

    def __str__(self) -> str:
        return f"{self.median:.3f} [{self.low:.3f}, {self.high:.3f}]"


def ratio_by_rounds(candidate_rounds: list[list[float]], baseline_rounds: list[list[float]]) -> RatioEstimate | None:
    """One ratio per round (the candidate's median over the baseline's, both
    measured in that round), their median, and a percentile-bootstrap interval
    of that median. None without at least one round of valid samples on both sides."""
    ratios = []
    for candidate, baseline in zip(candidate_rounds, baseline_rounds):
        a, b = _valid(candidate), _valid(baseline)
        if a is None or b is None or np.median(b) <= 0:
            return None
        ratios.append(float(np.median(a) / np.median(b)))
    if not ratios:
        return None
    values = np.asarray(ratios)
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    medians = np.median(values[rng.integers(0, values.size, size=(BOOTSTRAP_RESAMPLES, values.size))], axis=1)
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(medians, [tail, 100 - tail])
    return RatioEstimate(median=float(np.median(values)), low=float(low), high=float(high), per_round=tuple(ratios))


def _valid(samples_ms: list[float]) -> np.ndarray | None:
    values = np.asarray(samples_ms, dtype=np.float64)
    if values.size == 0 or not np.isfinite(values).all() or (values < 0).any():
        return None
    return values
