"""Gates and the verdict: thresholds applied to the results.

The go/no-go rule, per candidate stack:

| a hard gate failed | a gate is incomplete | a soft gate failed | verdict            |
|--------------------|----------------------|--------------------|--------------------|
| yes                | either               | either             | NO-GO              |
| no                 | yes                  | either             | INCOMPLETE         |
| no                 | no                   | yes                | GO-WITH-CONDITIONS |
| no                 | no                   | no                 | GO                 |

The overall verdict is the worst candidate's (GO < GO-WITH-CONDITIONS <
INCOMPLETE < NO-GO): a hard failure the evidence shows decides whatever else is
missing; anything missing for a reason that is not the candidate's keeps GO
from being said.

Nothing passes unmeasured, and no failure is charged to the wrong party. A gate
whose evidence is missing is, by who caused it:

- *failed* — the candidate's own failure (its export raised, its artifact gave
  NaN, its runtime crashed under measurement). The first such gate of a model
  (``export``, ``quantized-export``) is the root cause; the gates that needed its
  missing evidence are *blocked* by it: listed, not counted again.
- *not comparable* — the baseline failed to give what the gate compares with (its
  export or measurement failed): neither passed nor failed; the model is listed
  under baseline findings, and the candidate is still judged on what it shows
  alone (its artifact against its own eager model).
- *incomplete* — the tool or the machine: the run was interrupted, a session did
  not run for this report, a file of the report folder is damaged, the disk was
  full, a worker or measurement server was killed from outside, the machine was too
  busy for enough quiet latency rounds — or the reference itself is NaN or Inf
  (the model or its inputs: nothing can pass or fail against it). The verdict says
  INCOMPLETE with the reasons, and what to do.

The latency gate has one more outcome: *inconclusive*, when the ratio's
interval (at least 95% coverage) straddles the threshold — the noise is larger
than the difference. It does not fail the verdict; more rounds (``rounds``) or a
quieter machine can decide it.

With ``[tool.upgrade-gate.project]``, two gates judge the team's own project
for each candidate (model "project"): ``project-tests`` — no test that passes
on the baseline fails, errors or goes missing on the candidate, but for the
allow-list (hard by default) — and ``api-scan`` — no use of an API in the project's
source that the candidate changes or removes (soft by default).

Beside the gates, two judgements that are not gates: *baseline findings* (a
baseline artifact further from its own eager model than the numerics gate lets
a candidate be, or a model the baseline cannot export, run or measure — what
ships today) and *warnings* (an export that came near the memory limit).
"""

from __future__ import annotations

import datetime
from collections import Counter
from dataclasses import dataclass, field

from upgrade_gate import __version__, layout
from upgrade_gate.config.plan import Plan
from upgrade_gate.config.specs import StackSpec
from upgrade_gate.invocation import command
from upgrade_gate.judge.agreement import HEADLINE, TaskAgreement
from upgrade_gate.judge.gather import reference_side
from upgrade_gate.measure.stats import CONFIDENCE, RatioEstimate, fewest_rounds
from upgrade_gate.schema.comparison import NOT_FINITE_REFERENCE, Comparison, Side
from upgrade_gate.schema.measured import Contention, Measured
from upgrade_gate.schema.project import NOT_IN_RUN, ProjectResults
from upgrade_gate.schema.results import ModelResults
from upgrade_gate.schema.stack import StackResults
from upgrade_gate.schema.verdict import (
    BaselineFinding,
    GateResult,
    GateStatus,
    Quantity,
    Severity,
    Unit,
    Verdict,
    VerdictRecord,
)
from upgrade_gate.text import first_line, size

# Every gate a model can have, by the name its results carry (the project's: project-tests, api-scan);
# tests/test_releases.py checks each name this module gives a gate is here.
MODEL_GATES = ("same-inputs", "export", "delegation", "artifact-size", "numerics",
               *(f"task-{kind}" for kind in HEADLINE), "latency", "memory", "budget-latency", "budget-memory",
               "quantized-export", "quantized-numerics", *(f"quantized-task-{kind}" for kind in HEADLINE))

# An export whose peak resident memory reaches this share of the memory limit
# is one model size away from being killed (seed 000: OOM at 5-6 GB, a 0-byte .pte).
EXPORT_MEMORY_WARNING = 0.8
PROJECT = "project"  # the model column of the project's gates
# Newly failing tests named in the gate's one line; the report lists them all.
NAMED_TESTS = 3
# What each task's gate is called in its line, and the unit of its headline value.
TASK_METRIC = {"classification": ("top-1 agreement", Unit.AGREEMENT), "embedding": ("min cosine", Unit.COSINE),
               "generation": ("token agreement", Unit.AGREEMENT)}
# What to do about incomplete evidence: the result cache keeps what finished (the command as the user types it).
def resume_advice() -> str:
    return f"run `{command('compare')}` again with the same options: it reuses what finished and redoes the rest"


def decide(results: list[GateResult]) -> Verdict:
    """The table in this module's docstring."""
    failed = [r for r in results if r.status is GateStatus.FAILED]
    if any(r.severity is Severity.HARD for r in failed):
        return Verdict.NO_GO
    if any(r.status is GateStatus.INCOMPLETE for r in results):
        return Verdict.INCOMPLETE
    if failed:
        return Verdict.GO_WITH_CONDITIONS
    return Verdict.GO


def evaluate(plan: Plan, models: list[ModelResults], project: ProjectResults | None = None) -> VerdictRecord:
    """Every gate for every candidate and model (and the project); the verdict per candidate and overall."""
    results: list[GateResult] = []
    for spec in plan.candidates:
        for model in models:
            results += _gates_for(plan, spec, model)
        if project is not None:
            results += project_gates(plan, spec, project)
    per_stack = {spec.name: decide([r for r in results if r.stack == spec.name]) for spec in plan.candidates}
    busy, busy_gates = machine_busy_line(models, results)
    incomplete = [*([busy] if busy else []), *(f"{g.model}: {g.note}" for g in results
                                               if g.status is GateStatus.INCOMPLETE and g not in busy_gates)]
    # Running again resumes what the machine or the run cut short; a NaN reference stays.
    resume = [resume_advice()] if any(NOT_FINITE_REFERENCE not in note for note in incomplete) else []
    return VerdictRecord(
        tool_version=__version__,
        generated_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        verdict=max(per_stack.values(), key=lambda v: v.rank), baseline=plan.baseline.name, candidates=per_stack,
        gates=tuple(results), baseline_findings=baseline_findings(plan, models),
        warnings=export_memory_warnings(plan, models),
        incomplete=(*dict.fromkeys(incomplete), *resume))


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
class _Gates:
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
        """A gate that cannot be judged, and why."""
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
        """Why one stack has no whole measurement: whoever's stage failed, the measurement's own end, or the tool's.

        A server killed from outside (the kernel's out-of-memory killer, another
        process) was stopped by the machine: incomplete. One that raised, faulted,
        hung or outgrew the memory limit ended by what it runs: the candidate's
        failure, or the baseline's (nothing to compare with). Either way the rounds
        it finished are kept in the measurement file and no ratio is made of them.
        """
        is_base = name == self.plan.baseline.name
        if (self.baseline if is_base else self.candidate).first_problem() is not None:
            return self.baseline_missing() if is_base else self.candidate_missing()
        problem = f"{name}: {measured.status}" + (f" ({measured.problem})" if measured.problem else "")
        if measured.status in ("not run", "not measured", "interrupted", "killed"):
            return Missing(status=GateStatus.INCOMPLETE, note=problem)
        if is_base:
            return Missing(status=GateStatus.NOT_COMPARABLE, note=f"nothing to compare with: {problem}")
        return Missing(status=GateStatus.FAILED, note=problem)  # the candidate's runtime failed under measurement


def _gates_for(plan: Plan, spec: StackSpec, model: ModelResults) -> list[GateResult]:
    gates = plan.settings.gates
    out = plan.settings.out_dir
    name, stack = model.name, spec.name
    record_path = layout.model_dir(out, stack, name).relative_to(out).as_posix()
    found = _Gates(plan=plan, model=model, stack=stack, root="quantized-export" if model.quantized else "export")
    if model.quantized and (gates["quantized"].severity == "off" or found.candidate.skipped_variant):
        return []  # off, or this stack has no recipe for the variant: nothing to judge
    _same_inputs_gate(found)
    if model.quantized:
        _quantized_gates(found, record_path)
        return found.results

    _root_gate(found, gates["export"].severity, "every stage ok (build → export → save → load → run)", record_path)
    _delegation_gate(found, record_path, gates["delegation"].severity)
    _size_gate(found, record_path, gates["artifact-size"].severity)
    comparison = _numerics_gate(found, gates["numerics"].severity)
    if model.task_kind in HEADLINE:
        _task_gate(found, comparison, f"task-{model.task_kind}", gates["task"].severity,
                   embedding_ranking=model.task_kind == "embedding")
    _latency_gate(found, gates["latency"].severity)
    _memory_gate(found, gates["memory"].severity)
    budget = dict(gates.budgets).get(name)
    if budget is not None:
        _budget_gates(found, budget.latency_p50_ms, budget.peak_rss_mb, budget.severity)
    return found.results


def _same_inputs_gate(found: _Gates) -> None:
    """Same numbers in: both stacks loaded byte-identical weights and inputs."""
    mine, theirs = found.candidate.fixtures, found.baseline.fixtures
    rule = Rule(metric="weights and inputs", condition="weights and inputs sha256 equal to the baseline's",
                evidence=f"weights {(mine or {}).get('weights_sha256', '?')[:12]}, "
                         f"inputs {(mine or {}).get('inputs_sha256', '?')[:12]}")
    if mine is None:
        found.missing("same-inputs", "hard", rule, found.candidate_missing())
    elif theirs is None:
        found.missing("same-inputs", "hard", rule, found.baseline_missing())
    else:
        found.add("same-inputs", "hard", mine == theirs, rule, note="equal" if mine == theirs else "differ")


def _root_gate(found: _Gates, severity: str, condition: str, record_path: str) -> None:
    """export / quantized-export: every stage succeeded — the root cause of what a model cannot show."""
    rule = Rule(metric="stages", condition=condition, evidence=f"{record_path}/{{export,runtime}}.json")
    problem = found.candidate.first_problem()
    if problem is not None and problem.unfinished:
        found.missing(found.root, severity, rule, found.candidate_missing())
    elif found.candidate.damaged:
        found.missing(found.root, severity, rule, Missing(status=GateStatus.INCOMPLETE,
                                                          note="; ".join(found.candidate.damaged)))
    else:
        found.add(found.root, severity, problem is None, rule,
                  note="all stages ok" if problem is None else problem.explain())


def _quantized_gates(found: _Gates, record_path: str) -> None:
    """A quantized variant against the fp32 reference: its own thresholds
    (``gates["quantized"]``), one severity for all of them. Latency and memory
    are judged against the baseline's same variant, where it has a recipe for it."""
    gates, model = found.plan.settings.gates, found.model
    severity = gates["quantized"].severity
    _root_gate(found, severity, f"every stage ok (quantize ({model.variant}) → export → save → load → run)",
               record_path)
    comparison = _reference_comparison(found)
    min_snr, min_cosine = gates.for_model(model.name, "min-snr-db"), gates.for_model(model.name, "min-cosine")
    rule = Rule(metric="SNR", op="≥", threshold=Quantity(value=min_snr, unit=Unit.DB),
                condition=f"and cosine ≥ {min_cosine:g}, every output",
                evidence=comparison.label if comparison else "artifact vs reference")
    why = _comparison_missing(found, comparison)
    if why is not None:
        found.missing("quantized-numerics", severity, rule, why)
    else:
        assert comparison is not None
        outputs = comparison.comparable_outputs
        worst_snr = min(outputs, key=lambda o: o.snr_db if o.snr_db is not None else float("inf"))
        worst_cos = min(outputs, key=lambda o: o.cosine if o.cosine is not None else 1.0)
        snr = worst_snr.snr_db if worst_snr.snr_db is not None else float("inf")
        cosine = worst_cos.cosine if worst_cos.cosine is not None else 1.0
        found.add("quantized-numerics", severity, snr >= min_snr and cosine >= min_cosine, rule,
                  measured=Quantity(value=snr, unit=Unit.DB),
                  note=f"{worst_snr.name}; cosine {cosine:.5f} ({worst_cos.name})",
                  warnings=_degenerate_warnings(comparison))
    if model.task_kind in ("classification", "generation"):
        _task_gate(found, comparison, f"quantized-task-{model.task_kind}", severity)
    _size_gate(found, record_path, gates["artifact-size"].severity)
    _delegation_gate(found, record_path, gates["delegation"].severity)
    if not found.baseline.skipped_variant:
        # Against the baseline's own variant: what the team could ship quantized today.
        _latency_gate(found, gates["latency"].severity)
        _memory_gate(found, gates["memory"].severity)


def _reference_comparison(found: _Gates) -> Comparison | None:
    """The candidate's artifact against the reference; against its own eager model when the
    baseline has no reference to give (what the candidate can show on its own)."""
    actual = Side(stack=found.stack, kind="artifact")
    comparison = found.model.comparison(actual, reference_side(found.plan))
    if comparison is not None and reference_side(found.plan) in comparison.absent and \
            found.baseline_missing().status is GateStatus.NOT_COMPARABLE:
        return found.model.comparison(actual, Side(stack=found.stack, kind="eager")) or comparison
    return comparison


def _comparison_missing(found: _Gates, comparison: Comparison | None) -> Missing | None:
    """Why a comparison has nothing to judge: a damaged file (the tool's), a side with no
    outputs (whoever's stage failed), outputs that do not compare (the candidate's); None when it does."""
    if comparison is None:
        return found.candidate_missing()
    if comparison.damaged:
        return Missing(status=GateStatus.INCOMPLETE, note=comparison.damaged)
    if comparison.absent:  # the candidate's own failure first: it is charged to whoever failed
        stacks = {side.stack for side in comparison.absent}
        return found.candidate_missing() if found.stack in stacks else found.baseline_missing()
    if comparison.reference_not_finite:
        # The reference (the baseline's eager output) has NaN or Inf: the model or its inputs
        # do, and the artifact's NaN there is the same NaN — not the candidate's failure. Nor
        # can anything pass on it, so the gate is incomplete (exit 3), not a configuration
        # error (exit 2): exit 2 is the one message about a file, key or option that stops a
        # command before it runs, and this is found only once both stacks have run — the
        # other models' evidence stands, and the report must be written to show which model
        # and which output. The note says to fix the model or its inputs; resume_advice() is not
        # offered for it (running again gives the same NaN).
        return Missing(status=GateStatus.INCOMPLETE, note=comparison.reference_not_finite)
    outputs = comparison.comparable_outputs
    if not outputs or len(outputs) != len(comparison.outputs or ()):
        return Missing(status=GateStatus.FAILED, note=comparison.why_incomparable())
    return None


def _against(comparison: Comparison, found: _Gates) -> str:
    """Where the comparison is not the reference's: the baseline could not give one."""
    if comparison.reference == reference_side(found.plan):
        return ""
    return f"against its own eager model: {found.baseline_missing().note}"


def _numerics_gate(found: _Gates, severity: str) -> Comparison | None:
    comparison = _reference_comparison(found)
    tolerance = found.plan.settings.gates.for_model(found.model.name, "max-rel-l2")
    rule = Rule(metric="rel_l2", op="≤", threshold=Quantity(value=tolerance, unit=Unit.REL_L2),
                evidence=comparison.label if comparison else "artifact vs reference")
    why = _comparison_missing(found, comparison)
    if why is not None:
        found.missing("numerics", severity, rule, why)
        return comparison
    assert comparison is not None
    worst = comparison.worst_output
    assert worst is not None and worst.rel_l2 is not None
    # With several outputs, name the one that decides: "vision_encoder.output_0".
    where = [worst.name] if len(comparison.outputs or ()) > 1 else []
    found.add("numerics", severity, worst.rel_l2 <= tolerance, rule,
              measured=Quantity(value=worst.rel_l2, unit=Unit.REL_L2),
              note="; ".join([*where, *filter(None, [_against(comparison, found)])]),
              warnings=_degenerate_warnings(comparison))
    return comparison


def _degenerate_warnings(comparison: Comparison) -> tuple[str, ...]:
    """Reference outputs too flat for the comparison to say much (metrics.DEGENERATE_OUTPUT): said
    beside the gate's outcome, which stands — a dead model's outputs are still its outputs."""
    return tuple(f"reference output {output.name} is degenerate ({why}): the comparison with it says little"
                 for output in comparison.comparable_outputs if (why := output.degenerate_reference))


def _task_gate(found: _Gates, comparison: Comparison | None, gate: str, severity: str, *,
               embedding_ranking: bool = False) -> None:
    """The task's headline agreement with the reference; an encoder must also keep its similarity ranking."""
    model = found.model
    _, threshold_key = HEADLINE[model.task_kind]
    metric, unit = TASK_METRIC[model.task_kind]
    minimum = found.plan.settings.gates.for_model(model.name, threshold_key)
    rule = Rule(metric=metric, op="≥", threshold=Quantity(value=minimum, unit=unit),
                condition="and similarity ranking preserved" if embedding_ranking else "",
                evidence=comparison.label if comparison else "artifact vs reference")
    why = _comparison_missing(found, comparison)
    task = comparison.task if comparison else None
    if why is None and (task is None or task.headline is None):
        # The outputs compare, but the task's loop gave nothing to compare.
        why = found.candidate_missing() if found.candidate.first_problem() else Missing(
            status=GateStatus.FAILED, note=(comparison.task_missing if comparison else None) or "not measured")
    if why is not None:
        found.missing(gate, severity, rule, why)
        return
    assert comparison is not None and task is not None and task.headline is not None
    passed = task.headline >= minimum and (not embedding_ranking or bool(task.values.get("ranking_preserved")))
    note = "; ".join(filter(None, [_task_note(task), _against(comparison, found)]))
    found.add(gate, severity, passed, rule, measured=Quantity(value=task.headline, unit=unit), note=note)


def _task_note(task: TaskAgreement) -> str:
    """What the task measured beside its headline value."""
    v = task.values
    if task.kind == "classification":
        return f"top-5 overlap {v['top5_overlap']:.3f} over {v['items']} inputs"
    if task.kind == "embedding":
        return (f"ranking {'preserved' if v['ranking_preserved'] else 'CHANGED'} "
                f"(pair-order agreement {v['pair_order_agreement']:.3f})")
    snr = v["logits_snr_db"]
    return (f"{v['identical_prompts']}/{v['prompts']} prompts identical, first divergence {v['first_divergence']}, "
            f"logits SNR {'∞' if snr == float('inf') else f'{snr:.1f}'} dB, top-5 overlap {v['top5_overlap']:.3f}")


def _size_gate(found: _Gates, record_path: str, severity: str) -> None:
    size_bytes = found.candidate.artifact_bytes
    limit = found.plan.settings.gates["artifact-size"].threshold
    rule = Rule(metric="size", op="≤", threshold=Quantity(value=limit, unit=Unit.BYTES),
                evidence=f"{record_path}/export.json (save)")
    if size_bytes is None:
        found.missing("artifact-size", severity, rule, found.candidate_missing())
    else:
        found.add("artifact-size", severity, size_bytes <= limit, rule,
                  measured=Quantity(value=size_bytes, unit=Unit.BYTES))


def _delegation_gate(found: _Gates, record_path: str, severity: str) -> None:
    """The share of operator nodes inside delegate partitions, the least of any method."""
    minimum = found.plan.settings.gates["delegation"].threshold
    rule = Rule(metric="delegated share", op="≥", threshold=Quantity(value=minimum, unit=Unit.SHARE),
                condition="of operator nodes, every method", evidence=f"{record_path}/export.json (export)")
    coverage = found.candidate.delegation
    export = found.candidate.stage("export")
    if not coverage and (export is None or not export.ok):
        found.missing("delegation", severity, rule, found.candidate_missing())
        return
    if not coverage:
        found.add("delegation", severity, False, rule, note="no delegation record: the stack has no delegate")
        return
    method, worst = min(coverage.items(), key=lambda item: item[1].share)
    where = [method] if method != "forward" else []
    where += [f"not delegated: {worst.portable_summary()}"] if worst.portable_ops else []
    found.add("delegation", severity, worst.share >= minimum, rule,
              measured=Quantity(value=worst.share, unit=Unit.SHARE), note="; ".join(where))


def _latency_gate(found: _Gates, severity: str) -> None:
    """Over every thread count and method: the deciding row's ratio and its interval.

    A method at most ``min-delta-ms`` slower even at the top of its interval
    passes whatever its ratio. Of the rest, the gate fails if one interval lies wholly beyond the threshold,
    is inconclusive if one straddles it, and passes when all are within. A thread count
    with fewer quiet rounds than an interval needs (the machine was busy) is incomplete:
    neither a failure nor a pass. A definite failure at another thread count still fails.
    """
    plan, model, stack, base = found.plan, found.model, found.stack, found.plan.baseline.name
    gates = plan.settings.gates
    max_ratio, min_delta = gates["latency"].threshold, gates["latency"]["min-delta-ms"]
    rule = Rule(metric="ratio", op="≤", threshold=Quantity(value=max_ratio, unit=Unit.RATIO),
                condition=f"the median's whole interval (at least {CONFIDENCE:.0%} coverage), per thread count and "
                          f"method; methods at most {min_delta:g} ms slower at its top pass",
                evidence=f"measurements/{model.name}/threads-*.json ({plan.settings.rounds} quiet rounds, "
                         "the order alternating)")
    judged: list[tuple[str, str, RatioEstimate | None]] = []  # (outcome, where, estimate)
    for threads in plan.settings.threads:
        mine, theirs = found.candidate.measured[threads], found.baseline.measured[threads]
        if mine.host and theirs.host and mine.host != theirs.host:
            # Shards of a CI matrix, one stack each: two machines' clocks, not a ratio.
            found.add("latency", severity, True, rule, inconclusive=True,
                      note=f"not comparable: {stack} was timed on {mine.host}, {base} on {theirs.host}; run both "
                           "stacks of a shard in one job to gate on latency")
            return
        for name, measured in ((stack, mine), (base, theirs)):
            if measured.status != "ok" or not measured.latency:
                found.missing("latency", severity, rule, found.measured_missing(name, measured))
                return
        if set(mine.latency) != set(theirs.latency):
            found.add("latency", severity, False, rule,
                      note=f"the stacks measured different methods at {threads} thread(s): "
                           f"{sorted(mine.latency)} / {sorted(theirs.latency)}")
            return
        machine = model.contention.get(threads)
        busy = model.busy_at(threads)
        if busy is not None:
            judged.append(("incomplete", _busy_note(threads, busy), None))
            continue
        for method in mine.latency:
            estimate = model.ratio(stack, threads, method)
            if estimate is None:
                judged.append(("incomplete", f"{threads} thread(s), {method}: no rounds in common", None))
                continue
            # The most the candidate can be slower by, at the interval's top: within
            # min-delta-ms it passes whatever the ratio (timer and call overhead).
            slower_ms = theirs.latency[method].p50_ms * (estimate.high - 1)
            where = (f"{threads} thread(s){'' if method == 'forward' else f', {method}'}: "
                     f"{mine.latency[method].p50_ms:.3f} ms / {theirs.latency[method].p50_ms:.3f} ms")
            if machine is not None and machine.oversubscribed:
                where += f" ({machine.threads} threads on {machine.free_cores:.2f} free cores)"
            outcome = "passed" if slower_ms <= min_delta else estimate.judge(max_ratio)
            judged.append((outcome, where, estimate))
    if not judged:
        found.missing("latency", severity, rule, Missing(status=GateStatus.INCOMPLETE, note="no thread count measured"))
        return
    order = {"failed": 0, "incomplete": 1, "inconclusive": 2, "passed": 3}
    # The deciding row: the worst outcome, and within it the highest interval.
    outcome, where, estimate = min(judged, key=lambda j: (order[j[0]], -(j[2].high if j[2] else 0)))
    if estimate is None:
        found.missing("latency", severity, rule, Missing(status=GateStatus.INCOMPLETE, note=where))
        return
    if outcome == "inconclusive":
        where += (f"; only {len(estimate.per_round)} rounds: the interval covers {estimate.level:.1%}, short of "
                  f"{estimate.confidence:.0%}" if not estimate.holds else f"; the interval straddles {max_ratio:.2f}")
    if estimate.dropped:
        where += f"; {estimate.dropped} round(s) left out (samples that are not durations)"
    found.add("latency", severity, outcome != "failed", rule, inconclusive=outcome == "inconclusive",
              measured=Quantity(value=estimate.median, unit=Unit.RATIO, low=estimate.low, high=estimate.high,
                                level=estimate.level), note=where)


def _busy_note(threads: int, machine: Contention) -> str:
    """A latency gate incomplete for a busy machine: short, as every busy model's gate says it; the figures
    are said once, under the verdict (machine_busy_line), and in the model's latency section."""
    return (f"{threads} thread(s): machine busy: {machine.quiet} of {len(machine.rounds)} rounds quiet; an interval "
            f"needs {fewest_rounds()} quiet rounds")


def machine_busy_line(models: list[ModelResults], gates: list[GateResult]) -> tuple[str | None, list[GateResult]]:
    """One line for every latency gate a busy machine left incomplete — the models and thread counts, and how
    busy — and those gates (issue 26: a paragraph per model filled the report's first screen)."""
    by_name = {model.name: model for model in models}
    affected: list[GateResult] = []
    for gate in gates:
        model = by_name.get(gate.model)
        if gate.gate != "latency" or gate.status is not GateStatus.INCOMPLETE or model is None:
            continue
        if any(gate.note == _busy_note(threads, machine) for threads, machine in model.contention.items()):
            affected.append(gate)
    if not affected:
        return None, []
    where, machines = [], []
    for name in dict.fromkeys(gate.model for gate in affected):
        busy = [(threads, machine) for threads, machine in sorted(by_name[name].contention.items()) if machine.busy]
        machines += [machine for _, machine in busy]
        where.append(f"{name} at " + ", ".join(f"{threads} thread(s) ({machine.quiet} of {len(machine.rounds)} quiet)"
                                               for threads, machine in busy))
    figures = []
    others = [m.typical_others for m in machines if m.typical_others is not None]
    if others:
        cores = max((m.cores for m in machines if m.cores), default=None)
        figures.append(f"other processes kept up to {max(others):.2f}" + (f" of {cores}" if cores else "")
                       + " cores busy")
    waits = [m.typical_wait for m in machines if m.typical_wait is not None]
    if waits:
        figures.append(f"the timed threads waited up to {max(waits):.1%} of their time for a CPU")
    queues = [m.peak_run_queue for m in machines if m.peak_run_queue is not None]
    if queues:
        figures.append(f"the run queue reached {max(queues)}")
    line = (f"machine busy: too few quiet rounds to judge latency (an interval needs {fewest_rounds()}) for "
            + "; ".join(where) + (f" — {', '.join(figures)}" if figures else "")
            + ". Measure again when the machine is quieter: `--remeasure` times again without exporting")
    return line, affected


def _memory_missing(found: _Gates) -> Missing | None:
    """Why one stack has no runtime memory figure: the first thread count's measurement says."""
    for name, stack in ((found.stack, found.candidate), (found.plan.baseline.name, found.baseline)):
        if stack.runtime_memory_bytes is None:
            return found.measured_missing(name, next(iter(stack.measured.values())))
    return None


def _memory_gate(found: _Gates, severity: str) -> None:
    """Runtime memory, candidate over baseline; passes when it needs at most ``min-delta-mb`` more."""
    gates = found.plan.settings.gates
    max_ratio, min_delta = gates["memory"].threshold, gates["memory"]["min-delta-mb"]
    rule = Rule(metric="memory ratio", op="≤", threshold=Quantity(value=max_ratio, unit=Unit.RATIO),
                condition=f"or at most {min_delta:g} MiB more",
                evidence=f"measurements/{found.model.name}/threads-*.json (peak RSS of load → run minus the started "
                         "runtime)")
    why = _memory_missing(found)
    if why is not None:
        found.missing("memory", severity, rule, why)
        return
    mine, theirs = found.candidate.runtime_memory_bytes, found.baseline.runtime_memory_bytes
    assert mine is not None and theirs is not None
    ratio = mine / theirs if theirs else float("inf")
    found.add("memory", severity, ratio <= max_ratio or (mine - theirs) / 2**20 <= min_delta, rule,
              measured=Quantity(value=ratio, unit=Unit.RATIO), note=f"{size(mine)} / {size(theirs)}")


def _budget_gates(found: _Gates, latency_ms: float | None, memory_mib: float | None, severity: str) -> None:
    """The candidate alone against the team's budgets for the model."""
    name, threads = found.model.name, found.plan.settings.threads[0]
    first = found.candidate.measured[threads]
    if latency_ms is not None:
        rule = Rule(metric="p50", op="≤", threshold=Quantity(value=latency_ms, unit=Unit.MS),
                    condition=f"every method summed, at {threads} thread(s)",
                    evidence=f"measurements/{name}/threads-{threads}.json")
        p50 = first.p50_sum_ms
        if p50 is None:
            found.missing("budget-latency", severity, rule, found.measured_missing(found.stack, first))
        else:
            found.add("budget-latency", severity, p50 <= latency_ms, rule, measured=Quantity(value=p50, unit=Unit.MS))
    if memory_mib is not None:
        rule = Rule(metric="runtime memory", op="≤", threshold=Quantity(value=memory_mib, unit=Unit.MIB),
                    evidence=f"measurements/{name}/threads-*.json (peak RSS of load → run minus the started runtime)")
        used = found.candidate.runtime_memory_bytes
        if used is None:
            found.missing("budget-memory", severity, rule, found.measured_missing(found.stack, first))
        else:
            found.add("budget-memory", severity, used / 2**20 <= memory_mib, rule,
                      measured=Quantity(value=used / 2**20, unit=Unit.MIB))


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
        if theirs.problem:  # did not run for this report: the tool's; ran and did not finish: nothing to compare
            status = GateStatus.INCOMPLETE if theirs.run is None else GateStatus.NOT_COMPARABLE
            add("project-tests", settings.severity, status, tests, note=theirs.problem)
        else:  # the candidate's run: not run for this report, or did not install or finish there
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
    scan = Rule(metric="calls to change", op="=", threshold=Quantity(value=0, unit=Unit.COUNT),
                condition="none that the candidate changes, deprecates or removes (TorchFix and upgrade-gate's rules)",
                evidence=project.scan_file)
    if project.scan is None:  # the scan did not run or its file does not read: the tool's
        add("api-scan", settings.scan_severity, GateStatus.INCOMPLETE, scan, note=project.scan_problem or "not scanned")
    else:
        by_code = Counter(finding.code for finding in project.scan.findings)
        where = f"in {project.scan.files_scanned} files"
        counted = ", ".join(f"{code} ×{n}" for code, n in sorted(by_code.items()))
        add("api-scan", settings.scan_severity, GateStatus.FAILED if project.scan.findings else GateStatus.PASSED,
            scan, count=len(project.scan.findings), note=f"{where}: {counted}" if counted else where)
    return found


def baseline_findings(plan: Plan, models: list[ModelResults]) -> tuple[BaselineFinding, ...]:
    """What ships today that is already off: a model the baseline does not export, run or measure,
    a float model whose baseline artifact is further from the baseline's eager output than the
    numerics gate lets a candidate be (a bug in today's export), and a quantized variant whose
    baseline artifact is further from the fp32 reference than the quantized-numerics gate lets a
    candidate's be (issue 26: legacy's int8 of a team's model at -1.3 dB SNR, the candidate's at 36.2)."""
    base = plan.baseline.name
    findings = []
    for model in models:
        stack = model.stacks[base]
        if model.quantized:
            if not stack.skipped_variant:  # a variant the baseline has no recipe for ships nowhere today
                findings += _baseline_variant_finding(plan, model)
            continue
        problem = stack.first_problem()
        if problem is not None and not problem.unfinished:
            findings.append(BaselineFinding(model=model.name, failure=problem.explain()))
            continue
        unmeasured = [f"measurement at {t} thread(s) {m.status}" + (f": {m.problem}" if m.problem else "")
                      for t, m in stack.measured.items() if m.status not in ("ok", "not run")]
        if unmeasured:
            findings.append(BaselineFinding(model=model.name, failure="; ".join(unmeasured)))
        comparison = model.comparison(Side(stack=base, kind="artifact"), Side(stack=base, kind="eager"))
        worst = comparison.worst_output if comparison else None
        tolerance = plan.settings.gates.for_model(model.name, "max-rel-l2")
        if worst is None or worst.rel_l2 is None or worst.rel_l2 <= tolerance:
            continue
        task = {}
        if comparison and comparison.task and comparison.task.headline is not None:
            task[HEADLINE[comparison.task.kind][0]] = comparison.task.headline
        findings.append(BaselineFinding(model=model.name, output=worst.name, rel_l2=worst.rel_l2,
                                        max_rel_l2=tolerance, task=task))
    return tuple(findings)


def _baseline_variant_finding(plan: Plan, model: ModelResults) -> list[BaselineFinding]:
    """The baseline's own quantized artifact, failed or judged as the candidate's is (_quantized_gates): worst SNR
    and cosine against the fp32 reference — a quantized artifact departs from its float model by design, by
    less than the gate allows."""
    base = plan.baseline.name
    problem = model.stacks[base].first_problem()
    if problem is not None:
        return [] if problem.unfinished else [BaselineFinding(model=model.name, failure=problem.explain())]
    comparison = model.comparison(Side(stack=base, kind="artifact"), reference_side(plan))
    outputs = comparison.comparable_outputs if comparison else ()
    snrs = [(o.snr_db, o.name) for o in outputs if o.snr_db is not None]
    cosines = [o.cosine for o in outputs if o.cosine is not None]
    if not snrs:
        return []
    snr, output = min(snrs)
    cosine = min(cosines, default=None)
    gates = plan.settings.gates
    min_snr, min_cosine = gates.for_model(model.name, "min-snr-db"), gates.for_model(model.name, "min-cosine")
    if snr >= min_snr and (cosine is None or cosine >= min_cosine):
        return []
    task = {}
    if comparison and comparison.task and comparison.task.headline is not None:
        task[HEADLINE[comparison.task.kind][0]] = comparison.task.headline
    return [BaselineFinding(model=model.name, output=output, snr_db=snr, min_snr_db=min_snr, cosine=cosine,
                            gate_min_cosine=min_cosine, task=task)]


def export_memory_warnings(plan: Plan, models: list[ModelResults]) -> tuple[str, ...]:
    """Exports that came close to the memory limit: the next bigger model will not export here."""
    limit = plan.settings.memory_limit_bytes
    warnings = []
    for model in models:
        for name, stack in model.stacks.items():
            peak = stack.export_peak_rss_bytes
            if peak is not None and peak >= EXPORT_MEMORY_WARNING * limit:
                warnings.append(f"{model.name} in {name}: the export peaked at {peak / 2**30:.2f} GiB resident, "
                                f"{peak / limit:.0%} of the memory limit ({limit / 2**30:.2f} GiB, memory-limit)")
    return tuple(warnings)
