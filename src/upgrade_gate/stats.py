"""Latency summaries from raw per-run samples (milliseconds)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

TRIM_FRACTION = 0.1  # drop the fastest and slowest 10% for the trimmed mean


@dataclass(frozen=True, kw_only=True, slots=True)
class LatencySummary:
    runs: int
    min_ms: float
    p50_ms: float
    p90_ms: float
    trimmed_mean_ms: float
    max_ms: float

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


def summarize(samples_ms: list[float]) -> LatencySummary | None:
    """None when there is nothing to summarize or a sample is not a finite duration."""
    values = np.asarray(samples_ms, dtype=np.float64)
    if values.size == 0 or not np.isfinite(values).all() or (values < 0).any():
        return None
    ordered = np.sort(values)
    cut = int(math.floor(ordered.size * TRIM_FRACTION))
    trimmed = ordered[cut : ordered.size - cut] if ordered.size > 2 * cut else ordered
    return LatencySummary(
        runs=int(ordered.size),
        min_ms=float(ordered[0]),
        p50_ms=float(np.percentile(ordered, 50)),
        p90_ms=float(np.percentile(ordered, 90)),
        trimmed_mean_ms=float(trimmed.mean()),
        max_ms=float(ordered[-1]),
    )
