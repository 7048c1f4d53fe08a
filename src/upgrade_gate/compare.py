"""From the stacks' records to evidence: comparisons, latency summaries, sizes.

Pure functions over what the workers wrote; no torch, no thresholds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from upgrade_gate.config import ModelEntry, Plan
from upgrade_gate import tasks
from upgrade_gate.metrics import OutputMetrics, compare_outputs
from upgrade_gate.records import StackModelRecord, load_measurement, load_stack_model
from upgrade_gate.stats import LatencySummary, RatioEstimate, ratio_by_rounds, summarize
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
class Measured:
    """One stack at one thread count, from the measure session."""

    status: str  # "ok", "not measured", or how its server ended
    problem: str | None = None
    latency: dict[str, LatencySummary] = field(default_factory=dict)  # per method, every round pooled
    rounds: dict[str, list[list[float]]] = field(default_factory=dict)  # per method, the samples of each round
    load_ms: float | None = None  # cold start: loading every method's artifact in a fresh process
    first_run_ms: float | None = None  # cold start: the first call of every method, summed
    runtime_memory_bytes: int | None = None  # peak RSS minus the process with only the runtime started
    peak_rss_bytes: int | None = None
    idle_rss_bytes: int | None = None
    image_input: bool = False  # a method takes images (N, C, H, W): its rate is frames per second
    host: str | None = None  # the machine that timed it

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> Measured:
        status = str(data.get("status", "not measured"))
        error = data.get("error") or {}
        problem = data.get("reason") or (f"{error.get('stage')}: {error.get('message')}" if error else None)
        rounds: dict[str, list[list[float]]] = {}
        for entry in data.get("rounds", []):
            for method, samples in entry.get("samples_ms", {}).items():
                rounds.setdefault(method, []).append([float(v) for v in samples])
        latency = {m: summary for m, r in rounds.items() if (summary := summarize([v for rnd in r for v in rnd]))}
        cold = data.get("cold") or {}
        exit_memory = data.get("exit_memory") or {}
        shapes = data.get("input_shapes") or {}
        return cls(
            status=status if status != "ok" or latency else "not measured",
            problem=problem if status != "ok" or latency else "no timed rounds",
            latency=latency,
            rounds=rounds,
            load_ms=cold.get("load_ms"),
            first_run_ms=sum(cold["first_ms"].values()) if cold.get("first_ms") else None,
            runtime_memory_bytes=data.get("runtime_memory_bytes"),
            peak_rss_bytes=exit_memory.get("peak_rss_bytes"),
            idle_rss_bytes=(data.get("idle_memory") or {}).get("rss_bytes"),
            image_input=any(len(s) == 4 and s[1] in (1, 3) for ins in shapes.values() for s in ins[:1]),
            host=data.get("host"),
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class Delegation:
    """How much of one method's graph a delegate took (ExecuTorch's get_delegation_info)."""

    delegate: str
    partitions: int
    delegated_nodes: int
    portable_nodes: int
    portable_ops: dict[str, int]  # operator → nodes left to the portable kernels

    @property
    def share(self) -> float:
        total = self.delegated_nodes + self.portable_nodes
        return self.delegated_nodes / total if total else 0.0

    def portable_summary(self, limit: int = 8) -> str:
        ops = sorted(self.portable_ops.items(), key=lambda item: (-item[1], item[0]))
        text = ", ".join(f"{op} ×{count}" for op, count in ops[:limit])
        return text + (f", … ({len(ops) - limit} more)" if len(ops) > limit else "")

    @classmethod
    def from_details(cls, details: dict[str, Any]) -> Delegation | None:
        if "delegated_nodes" not in details:
            return None
        return cls(delegate=str(details.get("delegate", "delegate")), partitions=int(details["delegate_partitions"]),
                   delegated_nodes=int(details["delegated_nodes"]), portable_nodes=int(details["portable_nodes"]),
                   portable_ops={str(k): int(v) for k, v in (details.get("portable_ops") or {}).items()})


@dataclass(frozen=True, kw_only=True, slots=True)
class OperatorTime:
    name: str
    calls: int
    total_ms: float
    share: float  # of the profiled run's time


@dataclass(frozen=True, kw_only=True, slots=True)
class StackEvidence:
    record: StackModelRecord
    measured: dict[int, Measured]  # per thread count, in the configured order

    @property
    def artifact_bytes(self) -> int | None:
        artifact = self.record.artifact
        return int(artifact["bytes"]) if artifact else None

    @property
    def latency(self) -> dict[str, LatencySummary] | None:
        """Per method at the first thread count (the budgets' and the matrix's)."""
        first = next(iter(self.measured.values()), None)
        return first.latency if first and first.latency else None

    @property
    def runtime_memory_bytes(self) -> int | None:
        """The most loading and running took, over the thread counts."""
        values = [m.runtime_memory_bytes for m in self.measured.values() if m.runtime_memory_bytes is not None]
        return max(values) if values else None

    @property
    def delegation(self) -> dict[str, Delegation]:
        """Per method, where the stack delegates (none for the Lite Interpreter)."""
        export = self.record.stage("export")
        methods = export.details.get("methods", {}) if export and export.ok else {}
        found = {name: Delegation.from_details(d) for name, d in methods.items() if isinstance(d, dict)}
        return {name: d for name, d in found.items() if d is not None}

    @property
    def profile(self) -> dict[str, list[OperatorTime]]:
        """Per method, operators by time in the stack's own runtime (the runtime phase's profile stage)."""
        stage = self.record.stage("profile")
        methods = stage.details.get("methods", {}) if stage and stage.ok else {}
        return {name: [OperatorTime(name=str(op["name"]), calls=int(op["calls"]), total_ms=float(op["total_ms"]),
                                    share=float(op["share"])) for op in found.get("operators", [])]
                for name, found in methods.items() if isinstance(found, dict)}

    @property
    def other_backends(self) -> dict[str, dict[str, dict[str, Any]]]:
        """Export-only tries of the stack's other backends: backend → method → status and evidence."""
        stage = self.record.stage("backends")
        found = stage.details.get("backends", {}) if stage and stage.ok else {}
        return {name: methods for name, methods in found.items() if isinstance(methods, dict)}

    @property
    def localized(self) -> dict[str, Any] | None:
        """Where a failed export breaks: the culprit submodules (compat/localize.py)."""
        stage = self.record.stage("localize")
        return stage.details if stage and stage.ok else None

    @property
    def planned_memory_bytes(self) -> dict[str, int] | None:
        """Each method's memory-planned buffers (ExecuTorch), from the export; None where the runtime has no plan."""
        export = self.record.stage("export")
        methods = export.details.get("methods", {}) if export and export.ok else {}
        planned = {name: sum(d["planned_memory_bytes"].values()) for name, d in methods.items()
                   if isinstance(d, dict) and isinstance(d.get("planned_memory_bytes"), dict)}
        return planned or None


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelEvidence:
    model: ModelEntry
    stacks: dict[str, StackEvidence]
    comparisons: tuple[Comparison, ...]
    task_kind: str = "generic"
    # (candidate stack, thread count, method) → its latency ratio to the baseline, by rounds
    ratios: dict[tuple[str, int, str], RatioEstimate] = field(default_factory=dict)

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
    measurements = {t: load_measurement(out, model.name, t) or {} for t in plan.settings.threads}
    stacks = {}
    for spec in plan.stacks:
        record = load_stack_model(out, spec.name, model.name)
        measured = {}
        for threads, data in measurements.items():
            entry = (data.get("stacks") or {}).get(spec.name)
            measured[threads] = Measured.from_record(entry) if entry else Measured(
                status="not measured", problem="no measurement (nox -s measure did not run for this report)")
        stacks[spec.name] = StackEvidence(record=record, measured=measured)
    ratios = {}
    base = stacks[plan.baseline.name]
    for spec in plan.candidates:
        for threads, at_threads in stacks[spec.name].measured.items():
            for method, rounds in at_threads.rounds.items():
                estimate = ratio_by_rounds(rounds, base.measured[threads].rounds.get(method, []))
                if estimate is not None:
                    ratios[(spec.name, threads, method)] = estimate
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
    return ModelEvidence(model=model, stacks=stacks, comparisons=tuple(comparisons), task_kind=kind, ratios=ratios)


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

