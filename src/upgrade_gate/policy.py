"""Gates and the verdict: thresholds applied to evidence.

The go/no-go rule, per candidate stack:

| a hard gate failed | a soft gate failed | verdict            |
|--------------------|--------------------|--------------------|
| yes                | either             | NO-GO              |
| no                 | yes                | GO-WITH-CONDITIONS |
| no                 | no                 | GO                 |

The overall verdict is the worst candidate's. A gate whose measurement is
missing (the stage that produces it failed) fails: nothing passes unmeasured.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import Enum

from upgrade_gate import layout
from upgrade_gate.compare import ModelEvidence, Side, reference_side
from upgrade_gate.config import Gate, Plan
from upgrade_gate.specs import StackSpec


class Verdict(str, Enum):
    GO = "GO"
    GO_WITH_CONDITIONS = "GO-WITH-CONDITIONS"
    NO_GO = "NO-GO"

    @property
    def rank(self) -> int:
        return list(Verdict).index(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class GateResult:
    gate: str
    stack: str
    model: str
    severity: str  # "hard" | "soft"
    passed: bool
    threshold: str
    measured: str
    evidence: str  # the record or comparison the measurement comes from

    @property
    def status(self) -> str:
        return "passed" if self.passed else "FAILED"

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "status": self.status}


def decide(results: list[GateResult]) -> Verdict:
    """The table in this module's docstring."""
    failed = [r for r in results if not r.passed]
    if any(r.severity == "hard" for r in failed):
        return Verdict.NO_GO
    if failed:
        return Verdict.GO_WITH_CONDITIONS
    return Verdict.GO


def evaluate(plan: Plan, evidence: list[ModelEvidence]) -> tuple[list[GateResult], dict[str, Verdict], Verdict]:
    """Every gate for every candidate and model; verdict per candidate and overall."""
    results: list[GateResult] = []
    for spec in plan.candidates:
        for model in evidence:
            results += _gates_for(plan, spec, model)
    per_stack = {spec.name: decide([r for r in results if r.stack == spec.name]) for spec in plan.candidates}
    overall = max(per_stack.values(), key=lambda v: v.rank)
    return results, per_stack, overall


def _gates_for(plan: Plan, spec: StackSpec, model: ModelEvidence) -> list[GateResult]:
    gates = plan.settings.gates
    out = plan.settings.out_dir
    name, stack = model.model.name, spec.name
    candidate = model.stacks[stack]
    baseline = model.stacks[plan.baseline.name]
    record_path = layout.model_dir(out, stack, name).relative_to(out).as_posix()
    results = []

    def add(gate_name: str, gate: Gate | str, passed: bool, threshold: str, measured: str, evidence: str) -> None:
        severity = gate if isinstance(gate, str) else gate.severity
        if severity != "off":
            results.append(GateResult(gate=gate_name, stack=stack, model=name, severity=severity, passed=passed,
                                      threshold=threshold, measured=measured, evidence=evidence))

    # Same numbers in: both stacks loaded byte-identical weights and inputs.
    hashes = model.fixture_hashes
    same = hashes[stack] is not None and hashes[stack] == hashes[plan.baseline.name]
    add("same-inputs", "hard", same, "weights and inputs sha256 equal to the baseline's",
        "equal" if same else "differ or not loaded",
        f"weights {(hashes[stack] or {}).get('weights_sha256', '?')[:12]}, "
        f"inputs {(hashes[stack] or {}).get('inputs_sha256', '?')[:12]}")

    problem = candidate.record.first_problem()
    add("export", gates.export, problem is None, "every stage ok (build → export → save → load → run → latency)",
        "all stages ok" if problem is None else problem.explain(), f"{record_path}/{{export,runtime}}.json")

    size = candidate.artifact_bytes
    limit = gates.artifact_size.threshold or 0
    add("artifact-size", gates.artifact_size, size is not None and size <= limit, f"≤ {_bytes(limit)}",
        _bytes(size) if size is not None else "no artifact", f"{record_path}/export.json (save)")

    comparison = model.comparison(Side(stack=stack, kind="artifact"), reference_side(plan))
    worst = comparison.worst_rel_l2 if comparison else None
    tolerance = gates.numerics.threshold or 0
    add("numerics", gates.numerics, worst is not None and worst <= tolerance, f"rel_l2 ≤ {tolerance:.1e}",
        f"rel_l2 = {worst:.2e}" if worst is not None else _why_incomparable(comparison),
        comparison.label if comparison else "artifact vs reference")

    max_ratio = gates.latency.threshold or 0
    if candidate.latency and baseline.latency:
        ratio = candidate.latency.p50_ms / baseline.latency.p50_ms
        add("latency", gates.latency, ratio <= max_ratio, f"p50 ratio ≤ {max_ratio:.2f}",
            f"{ratio:.3f} ({candidate.latency.p50_ms:.3f} ms / {baseline.latency.p50_ms:.3f} ms)",
            f"p50 of {candidate.latency.runs} runs at {plan.settings.threads} thread(s) per stack")
    else:
        missing = [s for s, e in ((stack, candidate), (plan.baseline.name, baseline)) if e.latency is None]
        add("latency", gates.latency, False, f"p50 ratio ≤ {max_ratio:.2f}",
            f"not measured in {', '.join(missing)}", f"{record_path}/runtime.json (latency)")

    budget = dict(gates.budgets).get(name)
    if budget is not None:
        if budget.latency_p50_ms is not None:
            p50 = candidate.latency.p50_ms if candidate.latency else None
            add("budget-latency", budget.severity, p50 is not None and p50 <= budget.latency_p50_ms,
                f"p50 ≤ {budget.latency_p50_ms:g} ms", f"{p50:.3f} ms" if p50 is not None else "not measured",
                f"{record_path}/runtime.json (latency)")
        if budget.peak_rss_mb is not None:
            rss = candidate.record.peak_rss_bytes("runtime")
            mb = rss / 2**20 if rss is not None else None
            add("budget-memory", budget.severity, mb is not None and mb <= budget.peak_rss_mb,
                f"runtime peak RSS ≤ {budget.peak_rss_mb:g} MiB", f"{mb:.0f} MiB" if mb is not None else "not measured",
                f"{record_path}/runtime.json (peak_rss_bytes: load → run → latency process)")
    return results


def _why_incomparable(comparison: object) -> str:
    if comparison is None:
        return "not compared"
    if comparison.missing:  # type: ignore[attr-defined]
        return comparison.missing  # type: ignore[attr-defined]
    for output in comparison.outputs or ():  # type: ignore[attr-defined]
        if not output.shape_match:
            return f"{output.name}: shape {list(output.shape)} vs reference {list(output.reference_shape)}"
        if not output.finite:
            return f"{output.name}: NaN or Inf in the outputs"
    return "no outputs"


def _bytes(count: float | None) -> str:
    if count is None:
        return "?"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= size:
            return f"{count / size:.2f} {unit} ({int(count):,} B)"
    return f"{int(count)} B"


def exit_code(verdict: Verdict) -> int:
    return 1 if verdict is Verdict.NO_GO else 0
