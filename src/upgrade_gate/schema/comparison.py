"""One comparison of two tensor sets (a stack's eager reference or its artifact's outputs): per output and task."""

from __future__ import annotations

import re
from dataclasses import dataclass

from upgrade_gate.judge.agreement import TaskAgreement
from upgrade_gate.judge.numerics import OutputMetrics
from upgrade_gate.schema import codec

# How a comparison whose reference has NaN or Inf says so (``Comparison.reference_not_finite``).
NOT_FINITE_REFERENCE = "the reference output is not finite"



# -- comparisons ---------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Side(codec.Text):
    """One tensor set: a stack's eager reference or its artifact's outputs; written as its text."""

    stack: str
    kind: str  # "eager" | "artifact"

    KINDS = ("eager", "artifact")

    def __str__(self) -> str:
        return f"{self.kind}({self.stack})"

    @classmethod
    def parse(cls, shown: str) -> Side:
        """The inverse of ``str``: ``Side.parse(str(side)) == side``."""
        match = _SIDE.fullmatch(shown)
        if match is None:
            raise ValueError(f"not a side: {shown!r} (expected eager(<stack>) or artifact(<stack>))")
        return cls(kind=match[1], stack=match[2])


_SIDE = re.compile(r"(eager|artifact)\((.+)\)")


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
