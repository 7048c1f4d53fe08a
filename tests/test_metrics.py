from __future__ import annotations

import math

import numpy as np
import pytest

from upgrade_gate.metrics import compare_arrays, compare_outputs

inf, nan = math.inf, math.nan


@pytest.mark.parametrize(
    ("actual", "reference", "expected"),
    [
        # identical
        ([1.0, 2.0], [1.0, 2.0], dict(max_abs=0.0, mean_abs=0.0, max_rel=0.0, rel_l2=0.0, snr_db=inf, cosine=1.0, min_atol=0.0)),
        # one element off by 0.5: ‖e‖=0.5, ‖r‖=√5
        ([1.0, 2.5], [1.0, 2.0], dict(max_abs=0.5, mean_abs=0.25, max_rel=0.25, rel_l2=0.5 / math.sqrt(5),
                                      snr_db=20 * math.log10(math.sqrt(5) / 0.5), min_atol=0.5)),
        # opposite sign: cosine −1, rel_l2 2
        ([-1.0, -2.0], [1.0, 2.0], dict(max_abs=4.0, rel_l2=2.0, cosine=-1.0)),
        # reference all zero, actual not: relative errors are infinite, SNR −∞
        ([0.0, 1.0], [0.0, 0.0], dict(max_abs=1.0, rel_l2=inf, snr_db=-inf, cosine=None)),
        # both zero: identical, no error
        ([0.0, 0.0], [0.0, 0.0], dict(max_abs=0.0, rel_l2=0.0, snr_db=inf, cosine=1.0)),
        # integers compare in float64
        (np.array([3, 4], dtype=np.int64), np.array([3, 4], dtype=np.int64), dict(max_abs=0.0, rel_l2=0.0)),
    ],
)
def test_metric_values(actual, reference, expected):
    metrics = compare_arrays("out", np.asarray(actual), np.asarray(reference))
    assert metrics.comparable
    for key, value in expected.items():
        got = getattr(metrics, key)
        if value is None or (isinstance(value, float) and math.isinf(value)):
            assert got == value, key
        else:
            assert got == pytest.approx(value, rel=1e-12, abs=1e-15), key


@pytest.mark.parametrize(
    ("actual", "reference"),
    [
        ([nan, 1.0], [1.0, 1.0]),
        ([1.0, 1.0], [inf, 1.0]),
        ([-inf], [1.0]),
        ([nan], [nan]),  # NaN on both sides still fails: NaN anywhere fails
    ],
)
def test_non_finite_anywhere_is_incomparable(actual, reference):
    metrics = compare_arrays("out", np.asarray(actual, dtype=np.float32), np.asarray(reference, dtype=np.float32))
    assert not metrics.finite
    assert not metrics.comparable
    assert metrics.rel_l2 is None and metrics.max_abs is None


def test_shape_mismatch_is_incomparable():
    metrics = compare_arrays("out", np.zeros((1, 4)), np.zeros((4,)))
    assert (metrics.shape, metrics.reference_shape, metrics.shape_match) == ((1, 4), (4,), False)
    assert not metrics.comparable and metrics.rel_l2 is None


def test_empty_tensors_of_equal_shape_match_exactly():
    metrics = compare_arrays("out", np.zeros((0, 3), np.float32), np.zeros((0, 3), np.float32))
    assert metrics.comparable
    assert (metrics.max_abs, metrics.rel_l2, metrics.snr_db, metrics.cosine) == (0.0, 0.0, inf, 1.0)


def test_float32_inputs_are_measured_in_float64():
    reference = np.full(1000, 1.0, np.float32)
    actual = reference + np.float32(1e-7)
    metrics = compare_arrays("out", actual, reference)
    assert metrics.max_abs == pytest.approx(1.1920929e-07, rel=1e-6)  # one float32 ulp at 1.0


def test_compare_outputs_orders_numerically_and_flags_missing_names():
    ones = np.ones(2, np.float32)
    results = compare_outputs(
        {f"output_{i}": ones for i in (0, 2, 10)},
        {f"output_{i}": ones for i in (0, 1, 2, 10)},
    )
    assert [r.name for r in results] == ["output_0", "output_1", "output_2", "output_10"]
    missing = results[1]
    assert not missing.shape_match and missing.shape == () and missing.reference_shape == (2,)
