"""From the stacks' records to evidence: comparisons, latency summaries, sizes.

Pure functions over what the workers wrote; no torch, no thresholds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from upgrade_gate.config import ModelEntry, Plan
from upgrade_gate import tasks
from upgrade_gate.metrics import OutputMetrics, compare_outputs
from upgrade_gate.records import StackModelRecord, load_stack_model
from upgrade_gate.stats import LatencySummary, summarize
from upgrade_gate.tasks import TaskAgreement


@dataclass(frozen=True, kw_only=True, slots=True)
class Side:
    """One tensor set: a stack's eager reference or its artifact's outputs."""

    stack: str
    kind: str  # "eager" | "artifact"

    def __str__(self) -> str:
        return f"{self.kind}({self.stack})"


@dataclass(frozen=True, kw_only=True, slots=True)
class Comparison:
    purpose: str
    actual: Side
    reference: Side
    outputs: tuple[OutputMetrics, ...] | None  # None: one side has no outputs
    missing: str | None = None  # why it could not be computed
    task: TaskAgreement | None = None
    task_missing: str | None = None

    @property
    def label(self) -> str:
        return f"{self.actual} vs {self.reference}"

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

    def to_dict(self) -> dict[str, object]:
        return {
            "purpose": self.purpose,
            "actual": str(self.actual),
            "reference": str(self.reference),
            "missing": self.missing,
            "worst_rel_l2": self.worst_rel_l2,
            "worst_output": self.worst_output.name if self.worst_output else None,
            "outputs": [o.to_dict() for o in self.outputs] if self.outputs is not None else None,
            "task": self.task.to_dict() if self.task else None,
            "task_missing": self.task_missing,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class StackEvidence:
    record: StackModelRecord
    latency: dict[str, LatencySummary] | None  # per method

    @property
    def artifact_bytes(self) -> int | None:
        artifact = self.record.artifact
        return int(artifact["bytes"]) if artifact else None


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelEvidence:
    model: ModelEntry
    stacks: dict[str, StackEvidence]
    comparisons: tuple[Comparison, ...]
    task_kind: str = "generic"

    def comparison(self, actual: Side, reference: Side) -> Comparison | None:
        return next((c for c in self.comparisons if c.actual == actual and c.reference == reference), None)

    @property
    def fixture_hashes(self) -> dict[str, dict[str, str] | None]:
        """Weights and inputs hashes each stack loaded: equal means same numbers in."""
        hashes = {}
        for name, evidence in self.stacks.items():
            build = evidence.record.stage("build")
            hashes[name] = build.details.get("fixtures") if build and build.ok else None
        return hashes


def reference_side(plan: Plan) -> Side:
    """What every artifact is judged against: the baseline's eager outputs,
    the numbers the team has validated today."""
    return Side(stack=plan.baseline.name, kind="eager")


def comparison_pairs(plan: Plan) -> list[tuple[str, Side, Side]]:
    """Which outputs are compared with which, and why."""
    base = plan.baseline.name
    pairs = [("baseline export fidelity", Side(stack=base, kind="artifact"), Side(stack=base, kind="eager"))]
    for spec in plan.candidates:
        cand = spec.name
        pairs += [
            ("torch upgrade drift (eager)", Side(stack=cand, kind="eager"), Side(stack=base, kind="eager")),
            ("candidate export fidelity", Side(stack=cand, kind="artifact"), Side(stack=cand, kind="eager")),
            ("artifact vs artifact", Side(stack=cand, kind="artifact"), Side(stack=base, kind="artifact")),
            ("candidate artifact vs reference", Side(stack=cand, kind="artifact"), reference_side(plan)),
        ]
    return pairs


def gather_model(plan: Plan, model: ModelEntry) -> ModelEvidence:
    out = plan.settings.out_dir
    stacks = {}
    for spec in plan.stacks:
        record = load_stack_model(out, spec.name, model.name)
        summaries = {m: summarize(s) for m, s in (record.latency_samples or {}).items()}
        # A method without valid samples is left out; the latency gate then finds
        # the stacks' methods differ and fails as "not measured".
        latency = {m: summary for m, summary in summaries.items() if summary is not None}
        stacks[spec.name] = StackEvidence(record=record, latency=latency or None)
    kind = next((e.record.task_kind for e in stacks.values() if e.record.stage("build")), "generic")

    comparisons = []
    for purpose, actual, reference in comparison_pairs(plan):
        actual_out = stacks[actual.stack].record.outputs(actual.kind)
        reference_out = stacks[reference.stack].record.outputs(reference.kind)
        if actual_out is None or reference_out is None:
            absent = [str(side) for side, data in ((actual, actual_out), (reference, reference_out)) if data is None]
            comparisons.append(Comparison(purpose=purpose, actual=actual, reference=reference, outputs=None,
                                          missing=f"no outputs from {' and '.join(absent)}"))
            continue
        task, task_missing = _task_agreement(kind, stacks, actual, reference, actual_out, reference_out)
        comparisons.append(
            Comparison(
                purpose=purpose,
                actual=actual,
                reference=reference,
                outputs=tuple(compare_outputs(actual_out, reference_out)),
                task=task,
                task_missing=task_missing,
            )
        )
    return ModelEvidence(model=model, stacks=stacks, comparisons=tuple(comparisons), task_kind=kind)


def _task_agreement(
    kind: str, stacks: dict[str, StackEvidence], actual: Side, reference: Side,
    actual_out: dict[str, np.ndarray], reference_out: dict[str, np.ndarray],
) -> tuple[TaskAgreement | None, str | None]:
    """The task metric for one comparison; the first output carries logits or embeddings."""
    if kind in ("classification", "embedding"):
        first = sorted(reference_out)[0]
        a, r = actual_out.get(first), reference_out.get(first)
        if a is None or r is None or a.shape != r.shape or not (np.isfinite(a).all() and np.isfinite(r).all()):
            return None, f"{first}: missing, shape mismatch or NaN/Inf"
        return (tasks.classification(a, r) if kind == "classification" else tasks.embedding(a, r)), None
    if kind == "generation":
        a_task = stacks[actual.stack].record.task_result(actual.kind)
        r_task = stacks[reference.stack].record.task_result(reference.kind)
        if a_task is None or r_task is None:
            absent = [str(side) for side, t in ((actual, a_task), (reference, r_task)) if t is None]
            return None, f"no generation from {' and '.join(absent)}"
        if a_task.step_logits.shape != r_task.step_logits.shape:
            return None, f"step logits shape {a_task.step_logits.shape} vs {r_task.step_logits.shape}"
        return tasks.generation(a_task.tokens, r_task.tokens, a_task.step_logits, r_task.step_logits), None
    return None, None


def gather(plan: Plan) -> list[ModelEvidence]:
    return [gather_model(plan, model) for model in plan.models]

