"""How one candidate's gates for one model are recorded: each rule, the number it measured, and —
where there is no number — why, charged to whoever caused it (judge/policy.py has the rules)."""

from __future__ import annotations

from dataclasses import dataclass, field

from upgrade_gate.config.plan import Plan
from upgrade_gate.schema.measured import Measured
from upgrade_gate.schema.results import ModelResults
from upgrade_gate.schema.stack import StackResults
from upgrade_gate.schema.verdict import GateResult, GateStatus, Quantity, Severity


@dataclass(frozen=True, kw_only=True, slots=True)
class Rule:
    """What a gate holds its number to, and where the number comes from."""

    metric: str
    op: str = ""
    threshold: Quantity | None = None
    condition: str = ""
    evidence: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class Missing:
    """Why a gate has no evidence to judge, charged to whoever caused it."""

    status: GateStatus  # FAILED, BLOCKED, NOT_COMPARABLE or INCOMPLETE
    note: str
    blocked_by: str = ""


@dataclass
class Gates:
    """The gates of one candidate and model, as they are judged; an ``off`` gate is left out."""

    plan: Plan
    model: ModelResults
    stack: str
    root: str  # the gate whose failure is this model's root cause: export, quantized-export
    results: list[GateResult] = field(default_factory=list)

    @property
    def candidate(self) -> StackResults:
        return self.model.stacks[self.stack]

    @property
    def baseline(self) -> StackResults:
        return self.model.stacks[self.plan.baseline.name]

    def add(self, gate: str, severity: str, passed: bool, rule: Rule, *, measured: Quantity | None = None,
            note: str = "", inconclusive: bool = False, warnings: tuple[str, ...] = ()) -> None:
        status = GateStatus.INCONCLUSIVE if inconclusive else GateStatus.PASSED if passed else GateStatus.FAILED
        self._append(gate, severity, status, rule, measured=measured, note=note, warnings=warnings)

    def missing(self, gate: str, severity: str, rule: Rule, why: Missing) -> None:
        self._append(gate, severity, why.status, rule, note=why.note, blocked_by=why.blocked_by)

    def _append(self, gate: str, severity: str, status: GateStatus, rule: Rule, *, measured: Quantity | None = None,
                note: str = "", blocked_by: str = "", warnings: tuple[str, ...] = ()) -> None:
        if severity == "off":
            return
        self.results.append(GateResult(
            gate=gate, stack=self.stack, model=self.model.name, severity=Severity(severity), status=status,
            metric=rule.metric, measured=measured, op=rule.op, threshold=rule.threshold, condition=rule.condition,
            note=note, evidence=rule.evidence, blocked_by=blocked_by, warnings=warnings))

    def candidate_missing(self) -> Missing:
        """The candidate has no such evidence: its root gate's failure (blocked), or an unfinished run."""
        problem = self.candidate.first_problem()
        if problem is None:
            return Missing(status=GateStatus.INCOMPLETE, note=f"{self.stack}: every stage passed but this evidence "
                                                              "is missing from the report folder")
        if problem.unfinished:
            return Missing(status=GateStatus.INCOMPLETE, note=f"{self.stack}: {problem.explain()}")
        return Missing(status=GateStatus.BLOCKED, note=f"blocked by {self.root} ({problem.explain()})",
                       blocked_by=self.root)

    def baseline_missing(self) -> Missing:
        """The baseline has no such evidence: nothing to compare with (or an unfinished run)."""
        base, problem = self.plan.baseline.name, self.baseline.first_problem()
        if problem is None or problem.unfinished:
            why = problem.explain() if problem else "every stage passed but this evidence is missing"
            return Missing(status=GateStatus.INCOMPLETE, note=f"{base}: {why}")
        return Missing(status=GateStatus.NOT_COMPARABLE, note=f"nothing to compare with: {base}'s {problem.explain()}")

    def measured_missing(self, name: str, measured: Measured) -> Missing:
        """Why one stack has no whole measurement: whoever's stage failed, the measurement's own end, or the tool's. A
        server killed from outside was the machine's (incomplete); one that raised, faulted, hung or outgrew the memory
        limit, what it runs (the candidate's failure, or nothing to compare with)."""
        is_base = name == self.plan.baseline.name
        if (self.baseline if is_base else self.candidate).first_problem() is not None:
            return self.baseline_missing() if is_base else self.candidate_missing()
        problem = f"{name}: {measured.status}" + (f" ({measured.problem})" if measured.problem else "")
        if measured.status in ("not run", "not measured", "interrupted", "killed"):
            return Missing(status=GateStatus.INCOMPLETE, note=problem)
        if is_base:
            return Missing(status=GateStatus.NOT_COMPARABLE, note=f"nothing to compare with: {problem}")
        return Missing(status=GateStatus.FAILED, note=problem)  # the candidate's runtime failed under measurement
