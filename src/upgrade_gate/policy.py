"""Gates and the verdict: thresholds applied to evidence.

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
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from enum import Enum

from upgrade_gate import layout
from upgrade_gate.compare import ModelEvidence, Side, reference_side
from upgrade_gate.config import Gate, Plan
from upgrade_gate.project import ProjectEvidence
from upgrade_gate.specs import StackSpec
from upgrade_gate.stats import CONFIDENCE, RatioEstimate
from upgrade_gate.tasks import HEADLINE, TaskAgreement


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
    passed: bool  # an inconclusive gate has not failed
    threshold: str
    measured: str
    evidence: str  # the record or comparison the measurement comes from
    inconclusive: bool = False

    @property
    def status(self) -> str:
        if self.inconclusive:
            return "inconclusive"
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


def evaluate(plan: Plan, evidence: list[ModelEvidence], project: ProjectEvidence | None = None
             ) -> tuple[list[GateResult], dict[str, Verdict], Verdict]:
    """Every gate for every candidate and model (and the project); verdict per candidate and overall."""
    results: list[GateResult] = []
    for spec in plan.candidates:
        for model in evidence:
            results += _gates_for(plan, spec, model)
        if project is not None:
            results += project_gates(plan, spec, project)
    per_stack = {spec.name: decide([r for r in results if r.stack == spec.name]) for spec in plan.candidates}
    overall = max(per_stack.values(), key=lambda v: v.rank)
    return results, per_stack, overall


def _gates_for(plan: Plan, spec: StackSpec, model: ModelEvidence) -> list[GateResult]:
    gates = plan.settings.gates
    out = plan.settings.out_dir
    name, stack = model.model.name, spec.name
    candidate = model.stacks[stack]
    record_path = layout.model_dir(out, stack, name).relative_to(out).as_posix()
    results = []

    def add(gate_name: str, gate: Gate | str, passed: bool, threshold: str, measured: str, evidence: str,
            inconclusive: bool = False) -> None:
        severity = gate if isinstance(gate, str) else gate.severity
        if severity != "off":
            results.append(GateResult(gate=gate_name, stack=stack, model=name, severity=severity, passed=passed,
                                      threshold=threshold, measured=measured, evidence=evidence,
                                      inconclusive=inconclusive))

    # Same numbers in: both stacks loaded byte-identical weights and inputs.
    hashes = model.fixture_hashes
    same = hashes[stack] is not None and hashes[stack] == hashes[plan.baseline.name]
    add("same-inputs", "hard", same, "weights and inputs sha256 equal to the baseline's",
        "equal" if same else "differ or not loaded",
        f"weights {(hashes[stack] or {}).get('weights_sha256', '?')[:12]}, "
        f"inputs {(hashes[stack] or {}).get('inputs_sha256', '?')[:12]}")

    if model.model.quantized:
        return results + _quantized_gates(plan, spec, model, record_path)

    problem = candidate.record.first_problem()
    add("export", gates.export, problem is None, "every stage ok (build → export → save → load → run)",
        "all stages ok" if problem is None else problem.explain(), f"{record_path}/{{export,runtime}}.json")
    add("delegation", gates.delegation, *_delegation_gate(plan, model, stack, record_path))

    size = candidate.artifact_bytes
    limit = gates.artifact_size.threshold or 0
    add("artifact-size", gates.artifact_size, size is not None and size <= limit, f"≤ {_bytes(limit)}",
        _bytes(size) if size is not None else "no artifact", f"{record_path}/export.json (save)")

    comparison = model.comparison(Side(stack=stack, kind="artifact"), reference_side(plan))
    worst = comparison.worst_output if comparison else None
    tolerance = gates.for_model(name, "max-rel-l2")
    passed = worst is not None and worst.rel_l2 is not None and worst.rel_l2 <= tolerance
    # With several outputs, name the one that decides: "vision_encoder.output_0".
    where = f" ({worst.name})" if worst is not None and comparison and len(comparison.outputs or ()) > 1 else ""
    add("numerics", gates.numerics, passed, f"rel_l2 ≤ {tolerance:.1e}",
        f"rel_l2 = {worst.rel_l2:.2e}{where}" if worst is not None else _why_incomparable(comparison),
        comparison.label if comparison else "artifact vs reference")

    if model.task_kind in HEADLINE:
        key, threshold_key = HEADLINE[model.task_kind]
        minimum = gates.for_model(name, threshold_key)
        task = comparison.task if comparison else None
        value = task.headline if task else None
        passed = value is not None and value >= minimum
        # An encoder must also keep which sentences are closest to which.
        if passed and model.task_kind == "embedding":
            passed = bool(task.values.get("ranking_preserved"))  # type: ignore[union-attr]
        add(f"task-{model.task_kind}", gates.task.severity, passed, f"{key} ≥ {minimum:g}"
            + (" and similarity ranking preserved" if model.task_kind == "embedding" else ""),
            _task_measured(task) if task else (comparison.task_missing if comparison else None) or "not measured",
            comparison.label if comparison else "artifact vs reference")

    add("latency", gates.latency, *_latency_gate(plan, model, stack))
    add("memory", gates.memory, *_memory_gate(plan, model, stack))

    budget = dict(gates.budgets).get(name)
    if budget is not None:
        if budget.latency_p50_ms is not None:
            # A budget is for the whole model: one call of every method.
            p50 = sum(lat.p50_ms for lat in candidate.latency.values()) if candidate.latency else None
            threads = plan.settings.threads[0]
            add("budget-latency", budget.severity, p50 is not None and p50 <= budget.latency_p50_ms,
                f"p50 ≤ {budget.latency_p50_ms:g} ms at {threads} thread(s)",
                f"{p50:.3f} ms" if p50 is not None else "not measured",
                f"measurements/{name}/threads-{threads}.json")
        if budget.peak_rss_mb is not None:
            used = candidate.runtime_memory_bytes
            mb = used / 2**20 if used is not None else None
            add("budget-memory", budget.severity, mb is not None and mb <= budget.peak_rss_mb,
                f"runtime memory ≤ {budget.peak_rss_mb:g} MiB", f"{mb:.1f} MiB" if mb is not None else "not measured",
                f"measurements/{name}/threads-*.json (peak RSS of load → run minus the started runtime)")
    return results


def _quantized_gates(plan: Plan, spec: StackSpec, model: ModelEvidence, record_path: str) -> list[GateResult]:
    """A quantized variant against the fp32 reference: its own thresholds
    (``gates.quantized``), one severity for all of them. Latency and memory
    are judged against the baseline's same variant, where it has one."""
    gates, name, stack = plan.settings.gates, model.model.name, spec.name
    variant, severity = model.model.variant, gates.quantized.severity
    candidate = model.stacks[stack]
    quantize = candidate.record.stage("quantize")
    if severity == "off" or (quantize is not None and quantize.status == "skipped"):
        return []  # off, or this stack has no recipe for the variant: nothing to judge
    results = []

    def add(gate_name: str, passed: bool, threshold: str, measured: str, evidence: str,
            inconclusive: bool = False, gate_severity: str = severity) -> None:
        if gate_severity != "off":
            results.append(GateResult(gate=gate_name, stack=stack, model=name, severity=gate_severity, passed=passed,
                                      threshold=threshold, measured=measured, evidence=evidence,
                                      inconclusive=inconclusive))

    problem = candidate.record.first_problem()
    add("quantized-export", problem is None, f"every stage ok (quantize ({variant}) → export → save → load → run)",
        "all stages ok" if problem is None else problem.explain(), f"{record_path}/{{export,runtime}}.json")

    comparison = model.comparison(Side(stack=stack, kind="artifact"), reference_side(plan))
    min_snr, min_cosine = gates.for_model(name, "min-snr-db"), gates.for_model(name, "min-cosine")
    outputs = [o for o in (comparison.outputs or ()) if o.comparable] if comparison else []
    if comparison is None or not outputs or len(outputs) != len(comparison.outputs or ()):
        add("quantized-numerics", False, f"SNR ≥ {min_snr:g} dB and cosine ≥ {min_cosine:g}, every output",
            _why_incomparable(comparison), comparison.label if comparison else "artifact vs reference")
    else:
        worst_snr = min(outputs, key=lambda o: o.snr_db if o.snr_db is not None else float("inf"))
        worst_cos = min(outputs, key=lambda o: o.cosine if o.cosine is not None else 1.0)
        snr, cosine = worst_snr.snr_db, worst_cos.cosine
        passed = (snr is None or snr >= min_snr) and (cosine is None or cosine >= min_cosine)
        add("quantized-numerics", passed, f"SNR ≥ {min_snr:g} dB and cosine ≥ {min_cosine:g}, every output",
            f"SNR {'∞' if snr is None or snr == float('inf') else f'{snr:.1f}'} dB ({worst_snr.name}), "
            f"cosine {cosine if cosine is not None else 1.0:.5f} ({worst_cos.name})", comparison.label)

    if model.task_kind in ("classification", "generation"):
        key, threshold_key = HEADLINE[model.task_kind]
        minimum = gates.for_model(name, threshold_key)
        task = comparison.task if comparison else None
        value = task.headline if task else None
        add(f"quantized-task-{model.task_kind}", value is not None and value >= minimum, f"{key} ≥ {minimum:g}",
            _task_measured(task) if task else (comparison.task_missing if comparison else None) or "not measured",
            comparison.label if comparison else "artifact vs reference")

    size = candidate.artifact_bytes
    limit = gates.artifact_size.threshold or 0
    if size is not None:  # a variant without an artifact failed quantized-export already
        add("artifact-size", size <= limit, f"≤ {_bytes(limit)}", _bytes(size), f"{record_path}/export.json (save)",
            gate_severity=gates.artifact_size.severity)
    add("delegation", *_delegation_gate(plan, model, stack, record_path), gate_severity=gates.delegation.severity)
    baseline_run = model.stacks[plan.baseline.name].record.stage("run")
    if baseline_run is not None and baseline_run.ok:
        # Against the baseline's own variant, where it made one that runs: what
        # the team could ship quantized today.
        add("latency", *_latency_gate(plan, model, stack), gate_severity=gates.latency.severity)
        add("memory", *_memory_gate(plan, model, stack), gate_severity=gates.memory.severity)
    return results


PROJECT = "project"  # the model column of the project's gates
# Newly failing tests named in the gate's one line; the report lists them all.
NAMED_TESTS = 3


def project_gates(plan: Plan, spec: StackSpec, project: ProjectEvidence) -> list[GateResult]:
    """The team's tests in the candidate against the baseline, and the API scan of its source."""
    settings, stack, base = project.settings, spec.name, plan.baseline.name
    results = []
    if settings.severity != "off":
        accepted = f"; {len(settings.allow)} on the allow-list" if settings.allow else ""
        threshold = f"no test that passes on {base} fails, errors or goes missing on {stack}{accepted}"
        evidence = f"project/{stack}/junit.xml vs project/{base}/junit.xml"
        diff = project.diffs.get(stack)
        if diff is None:
            problem = project.stacks[base].problem or project.stacks[stack].problem or "no outcomes"
            passed, measured = False, problem
        else:
            breaking = diff.breaking
            passed = not breaking
            tests = project.stacks[stack].tests
            ran = f"{sum(t.outcome == 'passed' for t in tests.values())}/{len(tests)} passed on {stack}"
            if breaking:
                named = ", ".join(f"{c.test_id} ({first_line(c.candidate.message) if c.candidate else 'did not run'})"
                                  for c in breaking[:NAMED_TESTS])
                more = f" and {len(breaking) - NAMED_TESTS} more" if len(breaking) > NAMED_TESTS else ""
                measured = f"{len(breaking)} newly failing: {named}{more}; {ran}"
            else:
                measured = f"none newly failing{f' but {len(diff.accepted)} accepted' if diff.accepted else ''}; {ran}"
        results.append(GateResult(gate="project-tests", stack=stack, model=PROJECT, severity=settings.severity,
                                  passed=passed, threshold=threshold, measured=measured, evidence=evidence))
    if settings.scan_severity != "off":
        threshold = "no call that the candidate changes, deprecates or removes (TorchFix and upgrade-gate's rules)"
        if project.scan is None:
            passed, measured = False, project.scan_problem or "not scanned"
        else:
            findings = project.scan.get("findings", [])
            by_code = Counter(finding["code"] for finding in findings)
            passed = not findings
            where = f" in {project.scan.get('files_scanned', 0)} files"
            measured = (f"{len(findings)} calls to change{where}: "
                        + ", ".join(f"{code} ×{n}" for code, n in sorted(by_code.items()))) if findings \
                else f"no findings{where}"
        results.append(GateResult(gate="api-scan", stack=stack, model=PROJECT, severity=settings.scan_severity,
                                  passed=passed, threshold=threshold, measured=measured, evidence="project/scan.json"))
    return results


def first_line(text: str) -> str:
    """The first non-blank line, cut to 160 characters."""
    line = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return line if len(line) <= 160 else line[:159] + "…"


def _delegation_gate(plan: Plan, model: ModelEvidence, stack: str, record_path: str) -> tuple[bool, str, str, str]:
    """The share of operator nodes inside delegate partitions, the least of any method."""
    minimum = plan.settings.gates.delegation.threshold or 0
    threshold = f"delegated share of operator nodes ≥ {minimum:.0%}, every method"
    coverage = model.stacks[stack].delegation
    if not coverage:
        return False, threshold, "no delegation record (the export did not finish, or the stack has no delegate)", \
            f"{record_path}/export.json"
    method, worst = min(coverage.items(), key=lambda item: item[1].share)
    where = "" if method == "forward" else f" ({method})"
    fallen = f"; not delegated: {worst.portable_summary()}" if worst.portable_ops else ""
    return worst.share >= minimum, threshold, f"{worst.share:.1%}{where}{fallen}", f"{record_path}/export.json (export)"


def _latency_gate(plan: Plan, model: ModelEvidence, stack: str) -> tuple[bool, str, str, str, bool]:
    """passed, threshold, measured, evidence, inconclusive — over every thread count and method.

    A method at most ``min-delta-ms`` slower even at the top of its interval
    passes whatever its ratio. Of the rest, the gate fails if one interval lies wholly beyond the threshold,
    is inconclusive if one straddles it, and passes when all are within.
    """
    gates = plan.settings.gates
    max_ratio, min_delta = gates.latency.threshold or 0, gates.latency_min_delta_ms
    threshold = (f"median ratio's {CONFIDENCE:.0%} interval ≤ {max_ratio:.2f}, per thread count "
                 f"and method; methods at most {min_delta:g} ms slower at its top pass")
    candidate, baseline = model.stacks[stack], model.stacks[plan.baseline.name]
    evidence = f"measurements/{model.model.name}/threads-*.json ({plan.settings.rounds} interleaved rounds)"
    judged: list[tuple[str, str, RatioEstimate]] = []  # (outcome, where, estimate)
    missing: dict[str, list[str]] = {}  # what is missing → at which thread counts
    for threads in plan.settings.threads:
        mine, theirs = candidate.measured[threads], baseline.measured[threads]
        if mine.host and theirs.host and mine.host != theirs.host:
            # Shards of a CI matrix, one stack each: two machines' clocks, not a ratio.
            return True, threshold, (f"not comparable: {stack} was timed on {mine.host}, {plan.baseline.name} on "
                                     f"{theirs.host}; run both stacks of a shard in one job to gate on latency"), \
                evidence, True
        if not mine.latency or not theirs.latency or set(mine.latency) != set(theirs.latency):
            absent = [(s, m) for s, m in ((stack, mine), (plan.baseline.name, theirs)) if not m.latency]
            why = (f"not measured in {absent[0][0]}" + (f" ({absent[0][1].problem})" if absent[0][1].problem else "")
                   if absent else "the stacks measured different methods")
            missing.setdefault(why, []).append(str(threads))
            continue
        for method in mine.latency:
            estimate = model.ratios.get((stack, threads, method))
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
    if missing:
        return False, threshold, "; ".join(f"{why} at {', '.join(counts)} thread(s)" for why, counts in missing.items()), \
            evidence, False
    if not judged:
        return False, threshold, "not measured", evidence, False
    order = {"failed": 0, "inconclusive": 1, "passed": 2}
    # The deciding row: the worst outcome, and within it the highest interval.
    outcome, where, estimate = min(judged, key=lambda j: (order[j[0]], -j[2].high))
    measured = f"ratio {estimate} ({where})"
    if outcome == "inconclusive":
        measured += f": the interval straddles {max_ratio:.2f}"
    return outcome != "failed", threshold, measured, evidence, outcome == "inconclusive"


def _memory_gate(plan: Plan, model: ModelEvidence, stack: str) -> tuple[bool, str, str, str]:
    """Runtime memory, candidate over baseline; passes when it needs at most ``min-delta-mb`` more."""
    gates = plan.settings.gates
    max_ratio, min_delta = gates.memory.threshold or 0, gates.memory_min_delta_mb
    threshold = f"runtime memory ratio ≤ {max_ratio:.2f}, or at most {min_delta:g} MiB more"
    evidence = f"measurements/{model.model.name}/threads-*.json (peak RSS of load → run minus the started runtime)"
    mine = model.stacks[stack].runtime_memory_bytes
    theirs = model.stacks[plan.baseline.name].runtime_memory_bytes
    if mine is None or theirs is None:
        who = [s for s, v in ((stack, mine), (plan.baseline.name, theirs)) if v is None]
        return False, threshold, f"not measured in {', '.join(who)}", evidence
    ratio = mine / theirs if theirs else float("inf")
    passed = ratio <= max_ratio or (mine - theirs) / 2**20 <= min_delta
    return passed, threshold, f"{ratio:.2f} ({mine / 2**20:.1f} MiB / {theirs / 2**20:.1f} MiB)", evidence


def _task_measured(task: TaskAgreement) -> str:
    v = task.values
    if task.kind == "classification":
        return f"top-1 agreement {v['top1_agreement']:.3f}, top-5 overlap {v['top5_overlap']:.3f} over {v['items']} inputs"
    if task.kind == "embedding":
        return (f"min cosine {v['min_cosine']:.6f}, ranking {'preserved' if v['ranking_preserved'] else 'CHANGED'} "
                f"(pair-order agreement {v['pair_order_agreement']:.3f})")
    snr = v["logits_snr_db"]
    return (f"token agreement {v['token_agreement']:.3f}, {v['identical_prompts']}/{v['prompts']} prompts identical, "
            f"first divergence {v['first_divergence']}, logits SNR {'∞' if snr == float('inf') else f'{snr:.1f}'} dB, "
            f"top-5 overlap {v['top5_overlap']:.3f}")


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
