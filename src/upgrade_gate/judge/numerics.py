"""How far one output is from another (``schema.comparison.OutputMetrics``), without thresholds, so that a saved
comparison can be judged again. A metric that cannot be computed is ``None`` or NaN: a check on it fails.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np

from upgrade_gate.schema.comparison import OutputMetrics

# Below this, a reference element counts as zero for the relative error (max_rel divides by |reference|).
REL_FLOOR = 1e-12


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
    """Each method's worst relative L2 over its outputs, an incomparable output's ``incomparable`` (None: left out)."""
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
