from __future__ import annotations

import math

import numpy as np
import pytest

from upgrade_gate.judge.numerics import compare_arrays, compare_outputs
from upgrade_gate.schema.comparison import OutputMetrics
from upgrade_gate.schema.reader import Reader

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
    ("actual", "reference", "reference_finite"),
    [
        ([nan, 1.0], [1.0, 1.0], True),
        ([1.0, 1.0], [inf, 1.0], False),
        ([-inf], [1.0], True),
        ([nan], [nan], False),  # NaN on both sides is incomparable, and the reference's NaN is said so
        ([1.0, 2.0], [nan], False),  # and with another shape
    ],
)
def test_non_finite_anywhere_is_incomparable(actual, reference, reference_finite):
    metrics = compare_arrays("out", np.asarray(actual, dtype=np.float32), np.asarray(reference, dtype=np.float32))
    assert not metrics.finite
    assert not metrics.comparable
    assert metrics.rel_l2 is None and metrics.max_abs is None
    assert metrics.reference_finite is reference_finite


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


# (reference, why it is degenerate, or None): real arrays, compared with themselves.
DEGENERATE_CASES = {
    "all zero": (np.zeros((2, 8), np.float32), "≈ 0: max |value| 0.0e+00 ≤ 1e-06"),
    "all tiny": (np.linspace(-5e-7, 5e-7, 16), "≈ 0: max |value| 5.0e-07 ≤ 1e-06"),
    "constant": (np.full((1, 16), -0.25, np.float32),
                 "constant: values spread 0.0e+00 ≤ 1e-06 × max |value| 0.25"),
    "constant up to rounding": (np.array([1000.0, 1000.0 + 1e-4, 1000.0]),
                                "constant: values spread 1.0e-04 ≤ 1e-06 × max |value| 1e+03"),
    "a normal output": (np.linspace(-1.0, 1.0, 16, dtype=np.float32), None),
    "small but varying": (np.array([2e-6, -2e-6, 0.0]), None),
    "one value, not ≈ 0": (np.array([[0.5]], np.float32), None),  # nothing to spread: rel_l2 of a scalar
    "integers that vary": (np.array([3, 4, 5], dtype=np.int64), None),
}


@pytest.mark.parametrize(("reference", "why"), DEGENERATE_CASES.values(), ids=DEGENERATE_CASES.keys())
def test_a_degenerate_reference_is_named(reference, why):
    metrics = compare_arrays("out", reference.copy(), reference)
    assert metrics.comparable and metrics.rel_l2 == 0.0  # the comparison itself passes whatever
    assert metrics.degenerate_reference == why


def test_the_reference_range_is_measured_and_reads_back():
    metrics = compare_arrays("out", np.array([1.0, 2.0]), np.array([-3.0, 1.0]))
    assert (metrics.reference_max_abs, metrics.reference_spread) == (3.0, 4.0)
    assert OutputMetrics.from_reader(Reader(metrics.to_dict(), "out")) == metrics
    # A record written before the range was measured reads as unmeasured: no warning.
    older = {key: value for key, value in metrics.to_dict().items()
             if key not in ("reference_max_abs", "reference_spread")}
    assert OutputMetrics.from_reader(Reader(older, "out")).degenerate_reference is None


def test_no_range_when_there_is_nothing_to_compare():
    assert compare_arrays("out", np.zeros((1, 4)), np.zeros((4,))).degenerate_reference is None
    assert compare_arrays("out", np.array([math.nan]), np.zeros(1)).degenerate_reference is None
    assert compare_arrays("out", np.zeros((0, 3)), np.zeros((0, 3))).degenerate_reference is None


def test_an_output_with_a_read_extent_is_compared_on_that_part_alone():
    # A cache [layers, heads, slots, dim] whose first 3 slots a later step reads; the rest is
    # padding the two sides fill differently (it is overwritten before anything reads it).
    reference = np.random.default_rng(0).standard_normal((2, 1, 8, 4))
    actual = reference.copy()
    actual[:, :, 3:] = 1e3
    whole, = compare_outputs({"prefill.output_1": actual}, {"prefill.output_1": reference})
    assert whole.snr_db is not None and whole.snr_db < 0 and whole.read_extent is None
    part, = compare_outputs({"prefill.output_1": actual}, {"prefill.output_1": reference}, {"prefill.output_1": (2, 3)})
    assert part.snr_db == math.inf and part.max_abs == 0.0
    assert (part.shape, part.read_extent) == ((2, 1, 8, 4), (2, 3, 8))
    assert part.read_note == ("compared on entries 0–2 of 8 along axis 2, the ones a later call reads "
                              "(the rest is padding, overwritten before it is read)")
    # A difference inside the read part counts.
    actual[0, 0, 2, 0] += 1.0
    inside, = compare_outputs({"prefill.output_1": actual}, {"prefill.output_1": reference}, {"prefill.output_1": (2, 3)})
    assert inside.max_abs == pytest.approx(1.0)
    assert OutputMetrics.from_reader(Reader(inside.to_dict(), "o")) == inside


def test_a_read_extent_that_does_not_fit_the_output_compares_all_of_it():
    reference = np.ones((2, 5))
    result, = compare_outputs({"x.output_0": reference * 2}, {"x.output_0": reference}, {"x.output_0": (3, 1)})
    assert result.read_extent is None and result.max_abs == 1.0
