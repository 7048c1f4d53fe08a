"""What is not a gate: the baseline's own findings (what ships today is already off) and export-memory warnings."""

from __future__ import annotations

from upgrade_gate.config.plan import Plan
from upgrade_gate.judge._comparisons import reference_side
from upgrade_gate.schema.comparison import HEADLINE, Side
from upgrade_gate.schema.results import ModelResults
from upgrade_gate.schema.verdict import BaselineFinding

# An export whose peak resident memory reaches this share of the memory limit is one model size away from being
# killed (seed 000: OOM at 5-6 GB, a 0-byte .pte).
EXPORT_MEMORY_WARNING = 0.8


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
            findings.append(BaselineFinding(model=model.name, failure=problem.explain(), stage=problem.stage))
            continue
        unmeasured = [f"measurement at {t} thread(s) {m.status}" + (f": {m.problem}" if m.problem else "")
                      for t, m in stack.measured.items() if m.status not in ("ok", "not run")]
        if unmeasured:
            findings.append(BaselineFinding(model=model.name, failure="; ".join(unmeasured), stage="measure"))
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
        return [] if problem.unfinished else [BaselineFinding(model=model.name, failure=problem.explain(),
                                                              stage=problem.stage)]
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
