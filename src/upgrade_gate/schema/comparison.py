"""One comparison of two tensor sets (a stack's eager reference or its artifact's outputs): per output and task."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from upgrade_gate.errors import RecordError
from upgrade_gate.judge.agreement import TaskAgreement
from upgrade_gate.judge.numerics import OutputMetrics
from upgrade_gate.judge.records import Reader

# How a comparison whose reference has NaN or Inf says so (``Comparison.reference_not_finite``).
NOT_FINITE_REFERENCE = "the reference output is not finite"



# -- comparisons ---------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Side:
    """One tensor set: a stack's eager reference or its artifact's outputs."""

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
class Comparison:
    purpose: str
    actual: Side
    reference: Side
    outputs: tuple[OutputMetrics, ...] | None  # None: one side has no outputs
    missing: str | None = None  # why it could not be computed
    task: TaskAgreement | None = None
    task_missing: str | None = None
    absent: tuple[Side, ...] = ()  # the sides that have no outputs (their stage did not succeed)
    damaged: str | None = None  # a file of the report folder that does not read: the tool's problem, not a side's

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

    def to_dict(self) -> dict[str, Any]:
        return {
            "purpose": self.purpose,
            "actual": str(self.actual),
            "reference": str(self.reference),
            "missing": self.missing,
            # Derived, for readers of the file; not read back.
            "worst_rel_l2": self.worst_rel_l2,
            "worst_output": self.worst_output.name if self.worst_output else None,
            "outputs": [o.to_dict() for o in self.outputs] if self.outputs is not None else None,
            "task": self.task.to_dict() if self.task else None,
            "task_missing": self.task_missing,
            "absent": [str(side) for side in self.absent],
            "damaged": self.damaged,
        }

    @classmethod
    def from_reader(cls, r: Reader) -> Comparison:
        outputs, task = r.opt_children("outputs"), r.child("task")
        return cls(purpose=r.text("purpose"), actual=_side(r, "actual"), reference=_side(r, "reference"),
                   outputs=None if outputs is None else tuple(OutputMetrics.from_reader(o) for o in outputs),
                   missing=r.opt_text("missing"), task=TaskAgreement.from_reader(task) if task else None,
                   task_missing=r.opt_text("task_missing"), damaged=r.opt_text("damaged"),
                   absent=tuple(_parse_side(text, f"{r.where}.absent") for text in r.texts("absent")))


def _side(r: Reader, key: str) -> Side:
    return _parse_side(r.text(key), f"{r.where}.{key}")


def _parse_side(shown: str, where: str) -> Side:
    try:
        return Side.parse(shown)
    except ValueError as error:
        raise RecordError(f"{error} in '{where}'") from None
