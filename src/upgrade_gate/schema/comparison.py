"""One comparison of two tensor sets (a stack's eager reference or its artifact's outputs): per output
(``OutputMetrics``, measured by judge.numerics) and per task (``TaskAgreement``, by judge.agreement)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from upgrade_gate.errors import RecordError
from upgrade_gate.schema import codec
from upgrade_gate.schema.reader import NON_FINITE, Reader

# -- per output ----------------------------------------------------------------------

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


# -- per task ------------------------------------------------------------------------

# The value each task's gate checks, and the config key of its threshold.
HEADLINE = {
    "classification": ("top1_agreement", "min-top1-agreement"),
    "embedding": ("min_cosine", "min-cosine"),
    "generation": ("token_agreement", "min-token-agreement"),
}


@dataclass(frozen=True, kw_only=True, slots=True)
class TaskAgreement(codec.Record):
    kind: str = field(metadata=codec.custom(read=lambda r, key: _kind(r)))
    # The task's own values, written beside its kind: numbers, flags, a list of divergence steps.
    values: dict[str, Any] = field(default_factory=dict, metadata=codec.spread(read=lambda r, _: _values(r)))

    @property
    def headline(self) -> float | None:
        key, _ = HEADLINE[self.kind]
        value = self.values.get(key)
        return float(value) if value is not None else None


def _kind(r: Reader) -> str:
    kind = r.text("kind")
    if kind not in HEADLINE:
        raise RecordError(f"Unknown task {kind!r} in '{r.where}.kind'")
    return kind


def _values(r: Reader) -> dict[str, Any]:
    return {key: float(value) if value in NON_FINITE else value for key, value in r.data.items() if key != "kind"}


# -- comparisons ---------------------------------------------------------------------

# How a comparison whose reference has NaN or Inf says so (``Comparison.reference_not_finite``).
NOT_FINITE_REFERENCE = "the reference output is not finite"

@dataclass(frozen=True, kw_only=True, slots=True)
class Side(codec.Text):
    """One tensor set: a stack's eager reference or its artifact's outputs; written as its text."""

    stack: str
    kind: str  # "eager" | "quantized" (a variant's quantized model run eagerly) | "artifact"

    KINDS = ("eager", "quantized", "artifact")

    def __str__(self) -> str:
        return f"{self.kind}({self.stack})"

    @classmethod
    def parse(cls, shown: str) -> Side:
        """The inverse of ``str``: ``Side.parse(str(side)) == side``."""
        match = _SIDE.fullmatch(shown)
        if match is None:
            raise ValueError(f"not a side: {shown!r} (expected {', '.join(f'{k}(<stack>)' for k in cls.KINDS)})")
        return cls(kind=match[1], stack=match[2])


_SIDE = re.compile(rf"({'|'.join(Side.KINDS)})\((.+)\)")


@dataclass(frozen=True, kw_only=True, slots=True)
class Comparison(codec.Record):
    purpose: str
    actual: Side
    reference: Side
    missing: str | None = None  # why it could not be computed
    outputs: tuple[OutputMetrics, ...] | None  # None: one side has no outputs
    task: TaskAgreement | None = None
    task_missing: str | None = None
    absent: tuple[Side, ...] = ()  # the sides that have no outputs (their stage did not succeed)
    damaged: str | None = None  # a file of the report folder that does not read: the tool's problem, not a side's

    # Derived, for readers of the file; not read back.
    DERIVED = (codec.derived("worst_rel_l2", after="missing"),
               codec.derived("worst_output", lambda c: c.worst_output.name if c.worst_output else None,
                             after="worst_rel_l2"))

    @property
    def label(self) -> str:
        return f"{self.actual} vs {self.reference}"

    @property
    def comparable_outputs(self) -> tuple[OutputMetrics, ...]:
        return tuple(o for o in self.outputs or () if o.comparable)

    @property
    def worst_output(self) -> OutputMetrics | None:
        """The output with the largest relative L2 error; None if any output is incomparable."""
        if not self.outputs or not all(o.comparable for o in self.outputs):
            return None
        return max((o for o in self.outputs if o.rel_l2 is not None), key=lambda o: o.rel_l2 or 0.0, default=None)

    @property
    def worst_rel_l2(self) -> float | None:
        worst = self.worst_output
        return worst.rel_l2 if worst else None

    @property
    def reference_not_finite(self) -> str | None:
        """Why the reference cannot judge anything: an output of it is NaN or Inf (the model's
        or its inputs' doing, not the artifact's); None when every reference output is finite."""
        bad = [o.name for o in self.outputs or () if not o.reference_finite]
        if not bad:
            return None
        return (f"{NOT_FINITE_REFERENCE} ({self.reference}: {', '.join(bad)}): the model or its inputs give NaN or "
                "Inf — fix them; no artifact can be judged against it")

    def why_incomparable(self) -> str:
        if self.missing:
            return self.missing
        if self.reference_not_finite:
            return self.reference_not_finite
        for output in self.outputs or ():
            if not output.shape_match:
                return f"{output.name}: shape {list(output.shape)} vs reference {list(output.reference_shape)}"
            if not output.finite:
                return f"{output.name}: NaN or Inf in the outputs"
        return "no outputs"


# -- a quantized variant's two departures, weighed -------------------------------------

LOWERING_FACTOR = 2.0  # the lowering may add up to this times the quantization's own error (6 dB)


@dataclass(frozen=True, kw_only=True, slots=True)
class Attribution(codec.Record):
    """One method of a candidate's quantized variant: what its quantization and its lowering each depart by, at the
    output that departs most for what it may (judge/attribution.py weighs them, once, with the float numerics gate's
    threshold as the floor; the diagnose phase searches the lowering where it departs, and the report says why)."""

    stack: str = ""
    method: str
    output: str = ""
    quantization_rel_l2: float  # the quantized model run eagerly, against the float model
    lowering_rel_l2: float  # the artifact, against the quantized model run eagerly
    floor: float  # the float numerics gate's max-rel-l2: what any lowering may add
    factor: float = LOWERING_FACTOR  # the lowering may add up to this times the quantization's error
    method_threshold: float = 0.0  # the largest any output of the method allows
    # What each output of the method may depart by, by its name after the method's (``output_1``): the search
    # holds each to its own, so that one output's lenient allowance does not pass another that departs.
    allowances: dict[str, float] = field(default_factory=dict)

    @property
    def threshold(self) -> float:
        """What the lowering may depart by: the quantization's own error times the factor, or the float floor."""
        return max(self.factor * self.quantization_rel_l2, self.floor)

    @property
    def search_threshold(self) -> float:
        """The most any output of the method allows: the scale the search's figures are said in, each output's
        error weighed by it over the output's own allowance (``allowances``; compat/diagnose/diagnose_phase.py)."""
        return max(self.method_threshold, self.threshold)

    @property
    def lowering_departs(self) -> bool:
        return not self.lowering_rel_l2 <= self.threshold  # NaN departs: it never passes silently

    @staticmethod
    def snr_db(rel_l2: float) -> float:
        return -20 * math.log10(rel_l2) + 0.0 if rel_l2 > 0 else math.inf  # + 0.0: never "-0.0 dB"

    def said(self) -> str:
        """The rule's figures, as the report and the job say them."""
        where = f"{self.output} " if self.output else ""
        return (f"the artifact's {where}is at SNR {self.snr_db(self.lowering_rel_l2):.1f} dB against its own quantized "
                f"model run eagerly, whose quantization is at SNR {self.snr_db(self.quantization_rel_l2):.1f} dB "
                "against the float model")
