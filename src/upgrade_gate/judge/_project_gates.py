"""The team's project's gates for one candidate: project-tests (the per-test diff) and api-scan."""

from __future__ import annotations

from collections import Counter

from upgrade_gate.config.plan import Plan
from upgrade_gate.config.specs import StackSpec
from upgrade_gate.invocation import command
from upgrade_gate.judge._gates import Rule
from upgrade_gate.schema.project import NOT_IN_RUN, ProjectResults
from upgrade_gate.schema.verdict import GateResult, GateStatus, Quantity, Severity, Unit
from upgrade_gate.text import first_line

PROJECT = "project"  # the model column of the project's gates
# Newly failing tests named in the gate's one line; the report lists them all.
NAMED_TESTS = 3


def project_gates(plan: Plan, spec: StackSpec, project: ProjectResults) -> list[GateResult]:
    """The team's tests in the candidate against the baseline, and the API scan of its source."""
    settings, stack, base = plan.settings.project, spec.name, plan.baseline.name
    assert settings is not None  # there are project results only with a project table
    found: list[GateResult] = []

    def add(gate: str, severity: str, status: GateStatus, rule: Rule, *, count: int | None = None,
            note: str = "") -> None:
        if severity != "off":
            found.append(GateResult(gate=gate, stack=stack, model=PROJECT, severity=Severity(severity), status=status,
                                    metric=rule.metric, op=rule.op, threshold=rule.threshold, condition=rule.condition,
                                    evidence=rule.evidence, note=note,
                                    measured=None if count is None else Quantity(value=count, unit=Unit.COUNT)))

    accepted = f"; {len(settings.allow)} on the allow-list" if settings.allow else ""
    diff = project.diffs.get(stack)
    tests = Rule(metric="newly failing tests", op="=", threshold=Quantity(value=0, unit=Unit.COUNT),
                 condition=f"no test that passes on {base} fails, errors or goes missing on {stack}{accepted}",
                 evidence=f"{project.stacks[stack].junit} vs {project.stacks[base].junit}")
    if diff is None:
        mine, theirs = project.stacks[stack], project.stacks[base]
        if mine.run is not None and mine.run.status == "install-failed":  # a finding whatever the baseline gave
            add("project-tests", settings.severity, GateStatus.FAILED, tests, note=mine.problem or "")
        elif theirs.problem:
            # No outcomes on the baseline (not run for this report, hung past project.timeout, ended by os._exit,
            # no test): nothing to diff the candidate's against. Not the candidate's failure — the baseline is
            # what ships today — and never a pass (issue 37: both stacks hanging read GO): incomplete, exit 3.
            note = theirs.problem
            if theirs.run is not None:
                also = f" ({stack}'s did not either)" if mine.problem else ""
                note += (f"; no outcomes on {base} to compare {stack}'s with{also}: make its tests finish there "
                         f"(the test named, or project.timeout) and run {command('compat')} again")
            add("project-tests", settings.severity, GateStatus.INCOMPLETE, tests, note=note)
        else:  # the candidate's run: not run for this report (the tool's), or it did not finish there (its own)
            status = GateStatus.INCOMPLETE if mine.run is None else GateStatus.FAILED
            add("project-tests", settings.severity, status, tests, note=mine.problem or "no outcomes")
    else:
        breaking = diff.breaking
        ran = project.stacks[stack]
        notes = [f"{ran.counts.get('passed', 0)}/{ran.total} passed on {stack}"]
        if breaking:
            named = ", ".join(f"{c.test_id} ({first_line(c.message) if c.candidate != NOT_IN_RUN else 'did not run'})"
                              for c in breaking[:NAMED_TESTS])
            notes.insert(0, named + (f" and {len(breaking) - NAMED_TESTS} more" if len(breaking) > NAMED_TESTS else ""))
        elif diff.accepted:
            notes.insert(0, f"{len(diff.accepted)} accepted")
        add("project-tests", settings.severity, GateStatus.FAILED if breaking else GateStatus.PASSED, tests,
            count=len(breaking), note="; ".join(notes))
    status, scan, count, note = _scan_gate(project)
    add("api-scan", settings.scan_severity, status, scan, count=count, note=note)
    return found


def _scan_gate(project: ProjectResults) -> tuple[GateStatus, Rule, int | None, str]:
    """The api-scan gate's outcome, rule, count and note: the findings neither allowed nor set aside."""
    scan = Rule(metric="calls to change", op="=", threshold=Quantity(value=0, unit=Unit.COUNT),
                condition="none that the candidate changes, deprecates or removes (TorchFix and upgrade-gate's rules)",
                evidence=project.scan_file)
    if project.scan is None:  # the scan did not run or its file does not read: the tool's
        return GateStatus.INCOMPLETE, scan, None, project.scan_problem or "not scanned"
    to_change = project.scan.to_change
    counted = ", ".join(f"{code} ×{n}" for code, n in sorted(Counter(f.code for f in to_change).items()))
    left = [f"{n} {what}" for n, what in ((len(project.scan.findings) - len(to_change), "on the scan allow-list"),
                                           (len(project.scan.set_aside), "set aside (never run on the candidate)"))
            if n]
    where = f"in {project.scan.files_scanned} files"
    return (GateStatus.FAILED if to_change else GateStatus.PASSED, scan, len(to_change),
            "; ".join([f"{where}: {counted}" if counted else where, *left]))
