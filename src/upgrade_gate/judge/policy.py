"""Gates and the verdict: thresholds applied to the results.

The go/no-go table, every gate outcome and whose it is, and the project's gates: docs/report.md, "Verdict". The
one rule to hold: nothing passes unmeasured, and no failure is charged to the wrong party.
"""

from __future__ import annotations

import datetime
from dataclasses import replace

from upgrade_gate import __version__
from upgrade_gate.config.plan import Plan
from upgrade_gate.invocation import command
from upgrade_gate.judge._busy_machine import machine_busy_line
from upgrade_gate.judge._findings import baseline_findings, export_memory_warnings
from upgrade_gate.judge._model_gates import model_gates
from upgrade_gate.judge._project_gates import project_gates
from upgrade_gate.judge._remedies import remedies
from upgrade_gate.judge.fail_fast import not_reached_note, stopped_at
from upgrade_gate.schema.comparison import HEADLINE, NOT_FINITE_REFERENCE
from upgrade_gate.schema.project import ProjectResults
from upgrade_gate.schema.results import ModelResults
from upgrade_gate.schema.verdict import (
    GateResult,
    GateStatus,
    JudgedArtifact,
    Severity,
    Verdict,
    VerdictRecord,
    WithRemedies,
)

# Every gate a model can have, by the name its results carry (the project's: project-tests, api-scan);
# tests/test_releases.py checks each name model_gates.py and latency_gates.py give a gate is here.
MODEL_GATES = ("same-inputs", "export", "delegation", "artifact-size", "numerics",
               *(f"task-{kind}" for kind in HEADLINE), "latency", "device-latency", "memory", "device-memory",
               "budget-latency", "budget-memory", "device-budget-latency", "device-budget-memory",
               "quantized-export", "quantized-numerics", *(f"quantized-task-{kind}" for kind in HEADLINE))

# What to do about incomplete evidence: the result cache keeps what finished (the command as the user types it).
def resume_advice() -> str:
    return f"run `{command('compare')}` again with the same options: it reuses what finished and redoes the rest"


def decide(results: list[GateResult]) -> Verdict:
    """The table in docs/report.md, "Verdict"."""
    failed = [r for r in results if r.status is GateStatus.FAILED]
    if any(r.severity is Severity.HARD for r in failed):
        return Verdict.NO_GO
    if any(r.status is GateStatus.INCOMPLETE for r in results):
        return Verdict.INCOMPLETE
    if failed:
        return Verdict.GO_WITH_CONDITIONS
    return Verdict.GO


def with_remedies(verdict: VerdictRecord, stack: str) -> WithRemedies | None:
    """A NO-GO candidate's verdict were its passing remedies applied, how many, the gates they clear and what stays a
    condition: only when they answer every failed hard gate (whatever else failed still counts, by the same
    table); None otherwise. ``evaluate`` keeps it in the record (``VerdictRecord.with_remedies``)."""
    own = verdict.of(stack)
    hard = [g for g in own if g.status is GateStatus.FAILED and g.severity is Severity.HARD]
    hard_gates = {(g.model, g.gate) for g in hard}
    # A remedy of a soft gate (a quantized variant's layers in float) lifts a condition, not the NO-GO.
    passing = [r for r in verdict.remedies if r.stack == stack and r.passes and (r.model, r.gate) in hard_gates]
    # A passing remedy answers the gate it was found for, and every other gate it was judged by and passes.
    answered = {(r.model, gate) for r in passing
                for gate in (r.gate, *(g.gate for g in r.gates if g.status is GateStatus.PASSED))}
    if not hard or any((g.model, g.gate) not in answered for g in hard):
        return None
    after = decide([g for g in own if (g.model, g.gate) not in answered])
    # What a failed export blocked (latency, size …) is not measured with the remedy that exports it: a condition;
    # so is a remedy's own cost.
    conditions = [*(condition for r in passing for condition in r.conditions),
                  *(f"{g.gate} ({g.model}): not measured with the remedy that exports it" for g in own
                    if g.status is GateStatus.BLOCKED and (g.model, g.blocked_by) in answered)]
    if after is Verdict.GO and conditions:
        after = Verdict.GO_WITH_CONDITIONS
    cleared = tuple(f"{g.gate} ({g.model})" for g in own
                    if g.status is GateStatus.FAILED and (g.model, g.gate) in answered)
    return WithRemedies(verdict=after, remedies=len(passing), clears=cleared,
                        conditions=tuple(dict.fromkeys(conditions)))


def headline(verdict: VerdictRecord, stack: str) -> str:
    """A candidate's verdict in one plain line, as the console prints it: the verdict as configured, what its
    remedies make of it, and the hard gates that decide ("NO-GO as configured; GO-WITH-CONDITIONS with 1
    remedy — hard: numerics (nanovlm)")."""
    value = str(verdict.candidates[stack])
    remedied = verdict.with_remedies.get(stack)
    if remedied is not None:
        value += f" as configured; {remedied.said}"
    hard = [f"{g.gate} ({g.model})" for g in verdict.of(stack)
            if g.status is GateStatus.FAILED and g.severity is Severity.HARD]
    return value + (f" — hard: {', '.join(hard)}" if hard else "")


def evaluate(plan: Plan, models: list[ModelResults], project: ProjectResults | None = None) -> VerdictRecord:
    """Every gate for every candidate and model (and the project); the verdict per candidate and overall."""
    results: list[GateResult] = []
    for spec in plan.candidates:
        for model in models:
            results += model_gates(plan, spec, model)
        if project is not None:
            results += project_gates(plan, spec, project)
    # --fail-fast: what a stopped candidate did not reach is said once, not per gate, and is not resumed.
    stops = {spec.name: stop for spec in plan.candidates if (stop := stopped_at(plan.settings.out_dir, spec.name))}
    results = [replace(g, note=not_reached_note(stops[g.stack]), not_reached=True)
               if g.stack in stops and g.status is GateStatus.INCOMPLETE else g for g in results]
    per_stack = {spec.name: decide([r for r in results if r.stack == spec.name]) for spec in plan.candidates}
    busy, busy_gates = machine_busy_line(models, results)
    incomplete = [*([busy] if busy else []), *(f"{g.model}: {g.note}" for g in results
                                               if g.status is GateStatus.INCOMPLETE and g not in busy_gates
                                               and g.stack not in stops)]
    # Running again resumes what the machine or the run cut short; a NaN reference stays.
    resume = [resume_advice()] if any(NOT_FINITE_REFERENCE not in note for note in incomplete) else []
    for stack, stop in stops.items():
        unreached = sum(g.stack == stack and g.status is GateStatus.INCOMPLETE for g in results)
        incomplete.append(f"{stack}: {unreached} gate(s) not reached: --fail-fast stopped the run at "
                          f"{stop.get('model')}'s failed {stop.get('gate')} gate; run without --fail-fast "
                          "to judge every gate")
    record = VerdictRecord(
        tool_version=__version__,
        generated_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        verdict=max(per_stack.values(), key=lambda v: v.rank), baseline=plan.baseline.name, candidates=per_stack,
        gates=tuple(results), baseline_findings=baseline_findings(plan, models),
        warnings=export_memory_warnings(plan, models),
        incomplete=(*dict.fromkeys(incomplete), *resume), remedies=remedies(plan, models, results),
        artifacts=judged_artifacts(plan, models))
    return with_remedied_verdicts(record)


def judged_artifacts(plan: Plan, models: list[ModelResults]) -> tuple[JudgedArtifact, ...]:
    """Every file a candidate saved for a model, with the SHA-256 the save stage took of it."""
    found = []
    for spec in plan.candidates:
        for model in models:
            stack = model.stacks.get(spec.name)
            for saved in (stack.saved_files if stack is not None else {}).values():
                if saved.get("sha256"):
                    found.append(JudgedArtifact(stack=spec.name, model=model.name, file=str(saved["file"]),
                                                sha256=str(saved["sha256"]), bytes=int(saved["bytes"])))
    return tuple(found)


def with_remedied_verdicts(record: VerdictRecord) -> VerdictRecord:
    """The record with each candidate's verdict with its passing remedies (``with_remedies``) kept in it."""
    return replace(record, with_remedies={stack: found for stack in record.candidates
                                          if (found := with_remedies(record, stack)) is not None})
