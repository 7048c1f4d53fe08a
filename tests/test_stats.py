from __future__ import annotations

import math

import pytest

from upgrade_gate.stats import summarize


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
