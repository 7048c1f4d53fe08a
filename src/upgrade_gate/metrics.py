"""How far one output is from another: measuring only, no thresholds.

A threshold is applied later (gates), so a saved comparison can be re-judged
without re-running anything. A metric that cannot be computed is ``None`` or
NaN, and a check on it fails; it never passes silently.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from upgrade_gate.records import Reader

# Below this, a reference element counts as zero for the relative error
# (max_rel divides by |reference|).
REL_FLOOR = 1e-12


@dataclass(frozen=True, kw_only=True, slots=True)
class OutputMetrics:
    """Distance of ``actual`` from ``reference`` for one output tensor."""

    name: str
    shape: tuple[int, ...]
    reference_shape: tuple[int, ...]
    shape_match: bool
    finite: bool  # no NaN/Inf in either tensor
    max_abs: float | None = None
    mean_abs: float | None = None
    max_rel: float | None = None
    rel_l2: float | None = None
    snr_db: float | None = None
    cosine: float | None = None
    # The smallest atol for which np.allclose(actual, reference, rtol=0, atol=…) holds.
    min_atol: float | None = None

    @property
    def comparable(self) -> bool:
        return self.shape_match and self.finite

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["shape"], data["reference_shape"] = list(self.shape), list(self.reference_shape)
        return data

    @classmethod
    def from_reader(cls, r: Reader) -> OutputMetrics:
        return cls(name=r.text("name"), shape=r.integers("shape"), reference_shape=r.integers("reference_shape"),
                   shape_match=r.flag("shape_match"), finite=r.flag("finite"),
                   **{key: r.opt_number(key) for key in METRIC_KEYS})


# The metrics of one output, each None when it cannot be computed.
METRIC_KEYS = ("max_abs", "mean_abs", "max_rel", "rel_l2", "snr_db", "cosine", "min_atol")


def compare_arrays(name: str, actual: np.ndarray, reference: np.ndarray) -> OutputMetrics:
    """Every metric of ``actual`` against ``reference``, in float64."""
    shape, reference_shape = tuple(actual.shape), tuple(reference.shape)
    base: dict[str, Any] = {"name": name, "shape": shape, "reference_shape": reference_shape}
    if shape != reference_shape:
        return OutputMetrics(**base, shape_match=False, finite=_finite(actual) and _finite(reference))
    a = np.asarray(actual, dtype=np.float64)
    r = np.asarray(reference, dtype=np.float64)
    if not (_finite(a) and _finite(r)):
        return OutputMetrics(**base, shape_match=True, finite=False)
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


def compare_outputs(actual: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> list[OutputMetrics]:
    """Compare outputs by name. A name missing on either side is a shape mismatch
    against an empty placeholder, so it fails like any incomparable output."""
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
                )
            )
            continue
        results.append(compare_arrays(name, a, r))
    return results


def _output_order(name: str) -> tuple[int, str]:
    prefix, _, index = name.rpartition("_")
    return (int(index), prefix) if index.isdigit() else (1 << 30, name)
