"""Gates and the verdict: thresholds applied to the results.

The go/no-go rule, per candidate stack:

| a hard gate failed | a soft gate failed | verdict            |
|--------------------|--------------------|--------------------|
| yes                | either             | NO-GO              |
| no                 | yes                | GO-WITH-CONDITIONS |
| no                 | no                 | GO                 |

The overall verdict is the worst candidate's. A gate whose measurement is
missing (the stage that produces it failed) fails: nothing passes unmeasured.

With ``[tool.upgrade-gate.project]``, two gates judge the team's own project
for each candidate (model "project"): ``project-tests`` — no test that passes
on the baseline fails, errors or goes missing on the candidate, but for the
allow-list (hard by default) — and ``api-scan`` — no call in the project's
source that the candidate changes or removes (soft by default).

The latency gate has a third outcome: *inconclusive*, when the ratio's 95%
interval straddles the threshold — the noise is larger than the difference.
It does not fail the verdict; the report says so, with the interval, and more
rounds (``rounds``) or a quieter machine can decide it.

Beside the gates, two judgements that are not gates: *baseline findings* (a
baseline artifact further from its own eager model than the numerics gate lets
a candidate be — a bug in what ships today) and *warnings* (an export that came
near the memory limit).
"""

from __future__ import annotations

import datetime
from collections import Counter
from dataclasses import dataclass, field

from upgrade_gate import __version__, layout
from upgrade_gate.compare import reference_side
from upgrade_gate.plan import Plan
from upgrade_gate.project import ProjectResults
from upgrade_gate.results import (
    BaselineFinding,
    Comparison,
    GateResult,
    GateStatus,
    ModelResults,
    Quantity,
    Severity,
    Side,
    Unit,
    Verdict,
    VerdictRecord,
)
from upgrade_gate.specs import StackSpec
from upgrade_gate.stats import CONFIDENCE, RatioEstimate
from upgrade_gate.tasks import HEADLINE, TaskAgreement
from upgrade_gate.text import first_line, size

# An export whose peak resident memory reaches this share of the memory limit
# is one model size away from being killed (seed 000: OOM at 5-6 GB, a 0-byte .pte).
EXPORT_MEMORY_WARNING = 0.8
PROJECT = "project"  # the model column of the project's gates
# Newly failing tests named in the gate's one line; the report lists them all.
NAMED_TESTS = 3
# What each task's gate is called in its line, and the unit of its headline value.
TASK_METRIC = {"classification": ("top-1 agreement", Unit.AGREEMENT), "embedding": ("min cosine", Unit.COSINE),
               "generation": ("token agreement", Unit.AGREEMENT)}


def decide(results: list[GateResult]) -> Verdict:
    """The table in this module's docstring."""
    failed = [r for r in results if r.status is GateStatus.FAILED]
    if any(r.severity is Severity.HARD for r in failed):
        return Verdict.NO_GO
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
    return VerdictRecord(
        tool_version=__version__,
        generated_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        verdict=max(per_stack.values(), key=lambda v: v.rank), baseline=plan.baseline.name, candidates=per_stack,
        gates=tuple(results), baseline_findings=baseline_findings(plan, models),
        warnings=export_memory_warnings(plan, models))


@dataclass(frozen=True, kw_only=True, slots=True)
class Rule:
    """What a gate holds its number to, and where the number comes from."""

    metric: str
    op: str = ""
    threshold: Quantity | None = None
    condition: str = ""
    evidence: str = ""


@dataclass
class _Gates:
    """The gates of one candidate and model, as they are judged; an ``off`` gate is left out."""

    stack: str
    model: str
    results: list[GateResult] = field(default_factory=list)

    def add(self, gate: str, severity: str, passed: bool, rule: Rule, *, measured: Quantity | None = None,
            note: str = "", inconclusive: bool = False) -> None:
        if severity == "off":
            return
        status = GateStatus.INCONCLUSIVE if inconclusive else GateStatus.PASSED if passed else GateStatus.FAILED
        self.results.append(GateResult(
            gate=gate, stack=self.stack, model=self.model, severity=Severity(severity), status=status,
            metric=rule.metric, measured=measured, op=rule.op, threshold=rule.threshold, condition=rule.condition,
            note=note, evidence=rule.evidence))


def _gates_for(plan: Plan, spec: StackSpec, model: ModelResults) -> list[GateResult]:
    gates = plan.settings.gates
    out = plan.settings.out_dir
    name, stack = model.name, spec.name
    candidate = model.stacks[stack]
    record_path = layout.model_dir(out, stack, name).relative_to(out).as_posix()
    found = _Gates(stack=stack, model=name)

    # Same numbers in: both stacks loaded byte-identical weights and inputs.
    hashes = model.fixture_hashes
    same = hashes[stack] is not None and hashes[stack] == hashes[plan.baseline.name]
    found.add("same-inputs", "hard", same, Rule(
        metric="weights and inputs", condition="weights and inputs sha256 equal to the baseline's",
        evidence=f"weights {(hashes[stack] or {}).get('weights_sha256', '?')[:12]}, "
                 f"inputs {(hashes[stack] or {}).get('inputs_sha256', '?')[:12]}"),
        note="equal" if same else "differ or not loaded")

    if model.quantized:
        return found.results + _quantized_gates(plan, spec, model, record_path)

    problem = candidate.first_problem()
    found.add("export", gates["export"].severity, problem is None, Rule(
        metric="stages", condition="every stage ok (build → export → save → load → run)",
        evidence=f"{record_path}/{{export,runtime}}.json"),
        note="all stages ok" if problem is None else problem.explain())
    _delegation_gate(found, plan, model, record_path, gates["delegation"].severity)
    _size_gate(found, plan, model, record_path, gates["artifact-size"].severity)

    comparison = model.comparison(Side(stack=stack, kind="artifact"), reference_side(plan))
    worst = comparison.worst_output if comparison else None
    tolerance = gates.for_model(name, "max-rel-l2")
    measured = worst.rel_l2 if worst is not None else None
    # With several outputs, name the one that decides: "vision_encoder.output_0".
    where = worst.name if worst is not None and comparison and len(comparison.outputs or ()) > 1 else ""
    found.add("numerics", gates["numerics"].severity, measured is not None and measured <= tolerance, Rule(
        metric="rel_l2", op="≤", threshold=Quantity(value=tolerance, unit=Unit.REL_L2),
        evidence=comparison.label if comparison else "artifact vs reference"),
        measured=None if measured is None else Quantity(value=measured, unit=Unit.REL_L2),
        note=where if measured is not None else (comparison.why_incomparable() if comparison else "not compared"))

    if model.task_kind in HEADLINE:
        _task_gate(found, plan, model, comparison, f"task-{model.task_kind}", gates["task"].severity,
                   embedding_ranking=model.task_kind == "embedding")

    _latency_gate(found, plan, model, gates["latency"].severity)
    _memory_gate(found, plan, model, gates["memory"].severity)

    budget = dict(gates.budgets).get(name)
    if budget is not None:
        if budget.latency_p50_ms is not None:
            # A budget is for the whole model: one call of every method.
            p50 = sum(lat.p50_ms for lat in candidate.latency.values()) if candidate.latency else None
            threads = plan.settings.threads[0]
            found.add("budget-latency", budget.severity, p50 is not None and p50 <= budget.latency_p50_ms, Rule(
                metric="p50", op="≤", threshold=Quantity(value=budget.latency_p50_ms, unit=Unit.MS),
                condition=f"every method summed, at {threads} thread(s)",
                evidence=f"measurements/{name}/threads-{threads}.json"),
                measured=None if p50 is None else Quantity(value=p50, unit=Unit.MS),
                note="" if p50 is not None else "not measured")
        if budget.peak_rss_mb is not None:
            used = candidate.runtime_memory_bytes
            mib = used / 2**20 if used is not None else None
            found.add("budget-memory", budget.severity, mib is not None and mib <= budget.peak_rss_mb, Rule(
                metric="runtime memory", op="≤", threshold=Quantity(value=budget.peak_rss_mb, unit=Unit.MIB),
                evidence=f"measurements/{name}/threads-*.json (peak RSS of load → run minus the started runtime)"),
                measured=None if mib is None else Quantity(value=mib, unit=Unit.MIB),
                note="" if mib is not None else "not measured")
    return found.results


def _quantized_gates(plan: Plan, spec: StackSpec, model: ModelResults, record_path: str) -> list[GateResult]:
    """A quantized variant against the fp32 reference: its own thresholds
    (``gates["quantized"]``), one severity for all of them. Latency and memory
    are judged against the baseline's same variant, where it has one."""
    gates, name, stack = plan.settings.gates, model.name, spec.name
    variant, severity = model.variant, gates["quantized"].severity
    candidate = model.stacks[stack]
    if severity == "off" or candidate.skipped_variant:
        return []  # off, or this stack has no recipe for the variant: nothing to judge
    found = _Gates(stack=stack, model=name)

    problem = candidate.first_problem()
    found.add("quantized-export", severity, problem is None, Rule(
        metric="stages", condition=f"every stage ok (quantize ({variant}) → export → save → load → run)",
        evidence=f"{record_path}/{{export,runtime}}.json"),
        note="all stages ok" if problem is None else problem.explain())

    comparison = model.comparison(Side(stack=stack, kind="artifact"), reference_side(plan))
    min_snr, min_cosine = gates.for_model(name, "min-snr-db"), gates.for_model(name, "min-cosine")
    rule = Rule(metric="SNR", op="≥", threshold=Quantity(value=min_snr, unit=Unit.DB),
                condition=f"and cosine ≥ {min_cosine:g}, every output",
                evidence=comparison.label if comparison else "artifact vs reference")
    outputs = comparison.comparable_outputs if comparison else ()
    if comparison is None or not outputs or len(outputs) != len(comparison.outputs or ()):
        found.add("quantized-numerics", severity, False, rule,
                  note=comparison.why_incomparable() if comparison else "not compared")
    else:
        worst_snr = min(outputs, key=lambda o: o.snr_db if o.snr_db is not None else float("inf"))
        worst_cos = min(outputs, key=lambda o: o.cosine if o.cosine is not None else 1.0)
        snr = worst_snr.snr_db if worst_snr.snr_db is not None else float("inf")
        cosine = worst_cos.cosine if worst_cos.cosine is not None else 1.0
        found.add("quantized-numerics", severity, snr >= min_snr and cosine >= min_cosine, rule,
                  measured=Quantity(value=snr, unit=Unit.DB),
                  note=f"{worst_snr.name}; cosine {cosine:.5f} ({worst_cos.name})")

    if model.task_kind in ("classification", "generation"):
        _task_gate(found, plan, model, comparison, f"quantized-task-{model.task_kind}", severity)
    if candidate.artifact_bytes is not None:  # a variant without an artifact failed quantized-export already
        _size_gate(found, plan, model, record_path, gates["artifact-size"].severity)
    _delegation_gate(found, plan, model, record_path, gates["delegation"].severity)
    baseline_run = model.stacks[plan.baseline.name].stage("run")
    if baseline_run is not None and baseline_run.ok:
        # Against the baseline's own variant, where it made one that runs: what
        # the team could ship quantized today.
        _latency_gate(found, plan, model, gates["latency"].severity)
        _memory_gate(found, plan, model, gates["memory"].severity)
    return found.results


def _task_gate(found: _Gates, plan: Plan, model: ModelResults, comparison: Comparison | None, gate: str,
               severity: str, *, embedding_ranking: bool = False) -> None:
    """The task's headline agreement with the reference; an encoder must also keep its similarity ranking."""
    _, threshold_key = HEADLINE[model.task_kind]
    metric, unit = TASK_METRIC[model.task_kind]
    minimum = plan.settings.gates.for_model(model.name, threshold_key)
    task = comparison.task if comparison else None
    value = task.headline if task else None
    passed = task is not None and value is not None and value >= minimum
    if task is not None and passed and embedding_ranking:
        passed = bool(task.values.get("ranking_preserved"))
    missing = (comparison.task_missing if comparison else None) or "not measured"
    found.add(gate, severity, passed, Rule(
        metric=metric, op="≥", threshold=Quantity(value=minimum, unit=unit),
        condition="and similarity ranking preserved" if embedding_ranking else "",
        evidence=comparison.label if comparison else "artifact vs reference"),
        measured=None if value is None else Quantity(value=value, unit=unit),
        note=_task_note(task) if task else missing)


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


def _size_gate(found: _Gates, plan: Plan, model: ModelResults, record_path: str, severity: str) -> None:
    size = model.stacks[found.stack].artifact_bytes
    limit = plan.settings.gates["artifact-size"].threshold
    found.add("artifact-size", severity, size is not None and size <= limit, Rule(
        metric="size", op="≤", threshold=Quantity(value=limit, unit=Unit.BYTES),
        evidence=f"{record_path}/export.json (save)"),
        measured=None if size is None else Quantity(value=size, unit=Unit.BYTES),
        note="" if size is not None else "no artifact")


def _delegation_gate(found: _Gates, plan: Plan, model: ModelResults, record_path: str, severity: str) -> None:
    """The share of operator nodes inside delegate partitions, the least of any method."""
    minimum = plan.settings.gates["delegation"].threshold
    rule = Rule(metric="delegated share", op="≥", threshold=Quantity(value=minimum, unit=Unit.SHARE),
                condition="of operator nodes, every method", evidence=f"{record_path}/export.json (export)")
    coverage = model.stacks[found.stack].delegation
    if not coverage:
        found.add("delegation", severity, False, rule,
                  note="no delegation record (the export did not finish, or the stack has no delegate)")
        return
    method, worst = min(coverage.items(), key=lambda item: item[1].share)
    where = [method] if method != "forward" else []
    where += [f"not delegated: {worst.portable_summary()}"] if worst.portable_ops else []
    found.add("delegation", severity, worst.share >= minimum, rule,
              measured=Quantity(value=worst.share, unit=Unit.SHARE), note="; ".join(where))


def _latency_gate(found: _Gates, plan: Plan, model: ModelResults, severity: str) -> None:
    """Over every thread count and method: the deciding row's ratio and its interval.

    A method at most ``min-delta-ms`` slower even at the top of its interval
    passes whatever its ratio. Of the rest, the gate fails if one interval lies wholly beyond the threshold,
    is inconclusive if one straddles it, and passes when all are within.
    """
    gates, stack, base = plan.settings.gates, found.stack, plan.baseline.name
    max_ratio, min_delta = gates["latency"].threshold, gates["latency"]["min-delta-ms"]
    rule = Rule(metric="ratio", op="≤", threshold=Quantity(value=max_ratio, unit=Unit.RATIO),
                condition=f"the median's whole {CONFIDENCE:.0%} interval, per thread count and method; "
                          f"methods at most {min_delta:g} ms slower at its top pass",
                evidence=f"measurements/{model.name}/threads-*.json ({plan.settings.rounds} interleaved rounds)")
    candidate, baseline = model.stacks[stack], model.stacks[base]
    judged: list[tuple[str, str, RatioEstimate]] = []  # (outcome, where, estimate)
    missing: dict[str, list[str]] = {}  # what is missing → at which thread counts
    for threads in plan.settings.threads:
        mine, theirs = candidate.measured[threads], baseline.measured[threads]
        if mine.host and theirs.host and mine.host != theirs.host:
            # Shards of a CI matrix, one stack each: two machines' clocks, not a ratio.
            found.add("latency", severity, True, rule, inconclusive=True,
                      note=f"not comparable: {stack} was timed on {mine.host}, {base} on {theirs.host}; run both "
                           "stacks of a shard in one job to gate on latency")
            return
        if not mine.latency or not theirs.latency or set(mine.latency) != set(theirs.latency):
            absent = [(s, m) for s, m in ((stack, mine), (base, theirs)) if not m.latency]
            why = (f"not measured in {absent[0][0]}" + (f" ({absent[0][1].problem})" if absent[0][1].problem else "")
                   if absent else "the stacks measured different methods")
            missing.setdefault(why, []).append(str(threads))
            continue
        for method in mine.latency:
            estimate = model.ratio(stack, threads, method)
            if estimate is None:
                missing.setdefault(f"{method}: no rounds in common", []).append(str(threads))
                continue
            # The most the candidate can be slower by, at the interval's top: within
            # min-delta-ms it passes whatever the ratio (timer and call overhead).
            slower_ms = theirs.latency[method].p50_ms * (estimate.high - 1)
            where = (f"{threads} thread(s){'' if method == 'forward' else f', {method}'}: "
                     f"{mine.latency[method].p50_ms:.3f} ms / {theirs.latency[method].p50_ms:.3f} ms")
            outcome = "passed" if slower_ms <= min_delta else estimate.judge(max_ratio)
            judged.append((outcome, where, estimate))
    if missing or not judged:
        note = "; ".join(f"{why} at {', '.join(counts)} thread(s)" for why, counts in missing.items())
        found.add("latency", severity, False, rule, note=note or "not measured")
        return
    order = {"failed": 0, "inconclusive": 1, "passed": 2}
    # The deciding row: the worst outcome, and within it the highest interval.
    outcome, where, estimate = min(judged, key=lambda j: (order[j[0]], -j[2].high))
    if outcome == "inconclusive":
        where += f"; the interval straddles {max_ratio:.2f}"
    found.add("latency", severity, outcome != "failed", rule, inconclusive=outcome == "inconclusive",
              measured=Quantity(value=estimate.median, unit=Unit.RATIO, low=estimate.low, high=estimate.high),
              note=where)


def _memory_gate(found: _Gates, plan: Plan, model: ModelResults, severity: str) -> None:
    """Runtime memory, candidate over baseline; passes when it needs at most ``min-delta-mb`` more."""
    gates, stack, base = plan.settings.gates, found.stack, plan.baseline.name
    max_ratio, min_delta = gates["memory"].threshold, gates["memory"]["min-delta-mb"]
    rule = Rule(metric="memory ratio", op="≤", threshold=Quantity(value=max_ratio, unit=Unit.RATIO),
                condition=f"or at most {min_delta:g} MiB more",
                evidence=f"measurements/{model.name}/threads-*.json (peak RSS of load → run minus the started runtime)")
    mine, theirs = model.stacks[stack].runtime_memory_bytes, model.stacks[base].runtime_memory_bytes
    if mine is None or theirs is None:
        who = [s for s, v in ((stack, mine), (base, theirs)) if v is None]
        found.add("memory", severity, False, rule, note=f"not measured in {', '.join(who)}")
        return
    ratio = mine / theirs if theirs else float("inf")
    found.add("memory", severity, ratio <= max_ratio or (mine - theirs) / 2**20 <= min_delta, rule,
              measured=Quantity(value=ratio, unit=Unit.RATIO), note=f"{size(mine)} / {size(theirs)}")


def project_gates(plan: Plan, spec: StackSpec, project: ProjectResults) -> list[GateResult]:
    """The team's tests in the candidate against the baseline, and the API scan of its source."""
    settings, stack, base = plan.settings.project, spec.name, plan.baseline.name
    assert settings is not None  # there are project results only with a project table
    found = _Gates(stack=stack, model=PROJECT)
    accepted = f"; {len(settings.allow)} on the allow-list" if settings.allow else ""
    diff = project.diffs.get(stack)
    tests = Rule(metric="newly failing tests", op="=", threshold=Quantity(value=0, unit=Unit.COUNT),
                 condition=f"no test that passes on {base} fails, errors or goes missing on {stack}{accepted}",
                 evidence=f"project/{stack}/junit.xml vs project/{base}/junit.xml")
    if diff is None:
        problem = project.stacks[base].problem or project.stacks[stack].problem or "no outcomes"
        found.add("project-tests", settings.severity, False, tests, note=problem)
    else:
        breaking = diff.breaking
        ran = project.stacks[stack]
        notes = [f"{ran.counts.get('passed', 0)}/{ran.total} passed on {stack}"]
        if breaking:
            named = ", ".join(f"{c.test_id} ({first_line(c.message) if c.candidate != 'absent' else 'did not run'})"
                              for c in breaking[:NAMED_TESTS])
            notes.insert(0, named + (f" and {len(breaking) - NAMED_TESTS} more" if len(breaking) > NAMED_TESTS else ""))
        elif diff.accepted:
            notes.insert(0, f"{len(diff.accepted)} accepted")
        found.add("project-tests", settings.severity, not breaking, tests,
                  measured=Quantity(value=len(breaking), unit=Unit.COUNT), note="; ".join(notes))
    scan = Rule(metric="calls to change", op="=", threshold=Quantity(value=0, unit=Unit.COUNT),
                condition="none that the candidate changes, deprecates or removes (TorchFix and upgrade-gate's rules)",
                evidence="project/scan.json")
    if project.scan is None:
        found.add("api-scan", settings.scan_severity, False, scan, note=project.scan_problem or "not scanned")
    else:
        by_code = Counter(finding.code for finding in project.scan.findings)
        where = f"in {project.scan.files_scanned} files"
        counted = ", ".join(f"{code} ×{n}" for code, n in sorted(by_code.items()))
        found.add("api-scan", settings.scan_severity, not project.scan.findings, scan,
                  measured=Quantity(value=len(project.scan.findings), unit=Unit.COUNT),
                  note=f"{where}: {counted}" if counted else where)
    return found.results


def baseline_findings(plan: Plan, models: list[ModelResults]) -> tuple[BaselineFinding, ...]:
    """Models whose baseline artifact is further from the baseline's eager output
    than the numerics gate lets a candidate be: a bug in today's export."""
    base = plan.baseline.name
    findings = []
    for model in models:
        if model.quantized:  # a quantized artifact departs from its float model by design
            continue
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
