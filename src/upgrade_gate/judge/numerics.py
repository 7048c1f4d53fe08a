"""How far one output is from another: measuring only, no thresholds.

A threshold is applied later (gates), so a saved comparison can be re-judged
without re-running anything. A metric that cannot be computed is ``None`` or
NaN, and a check on it fails; it never passes silently.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from upgrade_gate.schema import codec

# Below this, a reference element counts as zero for the relative error
# (max_rel divides by |reference|).
REL_FLOOR = 1e-12
# A reference output whose every value is within this of zero, or whose values spread over
# less than this share of their magnitude (a constant), is degenerate: a dead or saturated
# model gives such outputs, and a small error against them says nothing of the model
# (issue 18). A warning, not a failure: the gates judge the numbers as they are.
DEGENERATE_OUTPUT = 1e-6


@dataclass(frozen=True, kw_only=True, slots=True)
class OutputMetrics(codec.Record):
    """Distance of ``actual`` from ``reference`` for one output tensor."""

    name: str
    shape: tuple[int, ...]
    reference_shape: tuple[int, ...]
    shape_match: bool
    finite: bool  # no NaN/Inf in either tensor
    # No NaN/Inf in the reference: when it has some, the model or its inputs do, not the
    # artifact (records written before this field was: True, as they were judged).
    reference_finite: bool = True
    max_abs: float | None = None
    mean_abs: float | None = None
    max_rel: float | None = None
    rel_l2: float | None = None
    snr_db: float | None = None
    cosine: float | None = None
    # The smallest atol for which np.allclose(actual, reference, rtol=0, atol=…) holds.
    min_atol: float | None = None
    # The reference's own range: max |value| and max − min (is there a signal to compare?).
    reference_max_abs: float | None = None
    reference_spread: float | None = None
    # Compared on part of the output only: the first ``count`` of ``length`` entries along
    # ``axis``, the part a later call reads (axis, count, length); None: all of it.
    read_extent: tuple[int, int, int] | None = None

    @property
    def comparable(self) -> bool:
        return self.shape_match and self.finite

    @property
    def read_note(self) -> str | None:
        """What part of the output was compared, when not all of it."""
        if self.read_extent is None:
            return None
        axis, count, length = self.read_extent
        return (f"compared on entries 0–{count - 1} of {length} along axis {axis}, the ones a later call reads "
                "(the rest is padding, overwritten before it is read)")

    @property
    def degenerate_reference(self) -> str | None:
        """Why the reference output carries too little signal for an error against it to mean
        much (≈ 0 everywhere, or constant); None when it does, or its range was not measured."""
        top, spread = self.reference_max_abs, self.reference_spread
        if top is None or spread is None:
            return None
        if top <= DEGENERATE_OUTPUT:
            return f"≈ 0: max |value| {top:.1e} ≤ {DEGENERATE_OUTPUT:.0e}"
        if math.prod(self.reference_shape) > 1 and spread <= DEGENERATE_OUTPUT * top:
            return f"constant: values spread {spread:.1e} ≤ {DEGENERATE_OUTPUT:.0e} × max |value| {top:.3g}"
        return None


def compare_arrays(name: str, actual: np.ndarray, reference: np.ndarray) -> OutputMetrics:
    """Every metric of ``actual`` against ``reference``, in float64."""
    shape, reference_shape = tuple(actual.shape), tuple(reference.shape)
    base: dict[str, Any] = {"name": name, "shape": shape, "reference_shape": reference_shape}
    if shape != reference_shape:
        return OutputMetrics(**base, shape_match=False, finite=_finite(actual) and _finite(reference),
                             reference_finite=_finite(reference))
    a = np.asarray(actual, dtype=np.float64)
    r = np.asarray(reference, dtype=np.float64)
    if not (_finite(a) and _finite(r)):
        return OutputMetrics(**base, shape_match=True, finite=False, reference_finite=_finite(r))
    if a.size == 0:
        # Two empty tensors of the same shape are identical; there is no error.
        return OutputMetrics(
            **base, shape_match=True, finite=True, max_abs=0.0, mean_abs=0.0, max_rel=0.0,
            rel_l2=0.0, snr_db=math.inf, cosine=1.0, min_atol=0.0,
        )
    diff = a - r
    abs_diff = np.abs(diff)
    max_abs = float(abs_diff.max())
    err_norm = float(np.linalg.norm(diff))
    ref_norm = float(np.linalg.norm(r))
    act_norm = float(np.linalg.norm(a))
    return OutputMetrics(
        **base,
        shape_match=True,
        finite=True,
        max_abs=max_abs,
        mean_abs=float(abs_diff.mean()),
        max_rel=float((abs_diff / np.maximum(np.abs(r), REL_FLOOR)).max()),
        rel_l2=_ratio(err_norm, ref_norm),
        snr_db=_snr_db(ref_norm, err_norm),
        cosine=float(np.dot(a.ravel(), r.ravel()) / (act_norm * ref_norm)) if act_norm and ref_norm else
        (1.0 if act_norm == ref_norm == 0.0 else None),
        min_atol=max_abs,
        reference_max_abs=float(np.abs(r).max()),
        reference_spread=float(r.max() - r.min()),
    )


def _finite(array: np.ndarray) -> bool:
    if not np.issubdtype(array.dtype, np.inexact):
        return True
    return bool(np.isfinite(array).all())


def _ratio(numerator: float, denominator: float) -> float:
    if denominator == 0.0:
        return 0.0 if numerator == 0.0 else math.inf
    return numerator / denominator


def _snr_db(signal_norm: float, noise_norm: float) -> float:
    """10·log10(signal power / noise power); +inf when there is no noise."""
    if noise_norm == 0.0:
        return math.inf
    if signal_norm == 0.0:
        return -math.inf
    return 20.0 * math.log10(signal_norm / noise_norm)


def read_part(array: np.ndarray, extent: tuple[int, int] | None) -> np.ndarray:
    """The first ``count`` entries along ``axis`` (``extent``), or the whole array."""
    if extent is None:
        return array
    axis, count = extent
    return array[(slice(None),) * axis + (slice(0, count),)]


def method_of(output: str) -> str:
    """The method an output belongs to: ``vision_encoder`` of ``vision_encoder.output_0`` (the workers'
    one namespace for every method's outputs, compat/phases.py ``method_outputs``)."""
    return output.partition(".")[0]


def worst_rel_l2_by_method(outputs: list[OutputMetrics], incomparable: float | None) -> dict[str, float]:
    """Each method's worst relative L2 over its outputs; an output that does not compare counts as
    ``incomparable`` (None: it is left out)."""
    worst: dict[str, float] = {}
    for output in outputs:
        value = output.rel_l2 if output.comparable and output.rel_l2 is not None else incomparable
        if value is not None:
            worst[method_of(output.name)] = max(worst.get(method_of(output.name), 0.0), value)
    return worst


def compare_outputs(
    actual: dict[str, np.ndarray],
    reference: dict[str, np.ndarray],
    read_extents: dict[str, tuple[int, int]] | None = None,
) -> list[OutputMetrics]:
    """Compare outputs by name. A name missing on either side is a shape mismatch
    against an empty placeholder, so it fails like any incomparable output. An
    output with a read extent (axis, count) is compared on that part alone: the
    part a later call reads (an LLM cache's filled slots)."""
    read_extents = read_extents or {}
    results = []
    for name in sorted(set(actual) | set(reference), key=_output_order):
        missing = np.empty((0,), dtype=np.float32)
        a, r = actual.get(name), reference.get(name)
        if a is None or r is None:
            results.append(
                OutputMetrics(
                    name=name,
                    shape=tuple(a.shape) if a is not None else (),
                    reference_shape=tuple(r.shape) if r is not None else (),
                    shape_match=False,
                    finite=_finite(a if a is not None else missing) and _finite(r if r is not None else missing),
                    reference_finite=_finite(r if r is not None else missing),
                )
            )
            continue
        extent = read_extents.get(name)
        fits = extent is not None and a.shape == r.shape and 0 <= extent[0] < a.ndim and extent[1] <= a.shape[extent[0]]
        if not fits:
            results.append(compare_arrays(name, a, r))
            continue
        assert extent is not None
        whole = compare_arrays(name, read_part(a, extent), read_part(r, extent))
        results.append(replace(whole, shape=a.shape, reference_shape=r.shape,
                               read_extent=(extent[0], extent[1], a.shape[extent[0]])))
    return results


def _output_order(name: str) -> tuple[int, str]:
    # "forward.output_1" and "forward.output_1[logits]": by position, then name.
    prefix, _, index = name.split("[", 1)[0].rpartition("_")
    return (int(index), prefix) if index.isdigit() else (1 << 30, name)
