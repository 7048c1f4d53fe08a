"""A model's gates for one candidate: same inputs, export, delegation, size, numerics and task agreement,
and a quantized variant's; latency and memory are judged in judge/latency_gates.py."""

from __future__ import annotations

from upgrade_gate import layout
from upgrade_gate.config.plan import Plan
from upgrade_gate.config.specs import StackSpec
from upgrade_gate.judge._comparisons import reference_side
from upgrade_gate.judge._gates import Gates, Missing, Rule
from upgrade_gate.judge._latency_gates import (
    budget_gates,
    device_budget_gates,
    device_latency_gate,
    device_memory_gate,
    latency_gate,
    memory_gate,
)
from upgrade_gate.schema.comparison import HEADLINE, Comparison, Side, TaskAgreement
from upgrade_gate.schema.results import ModelResults
from upgrade_gate.schema.verdict import GateResult, GateStatus, Quantity, Unit

# What each task's gate is called in its line, and the unit of its headline value.
TASK_METRIC = {"classification": ("top-1 agreement", Unit.AGREEMENT), "embedding": ("min cosine", Unit.COSINE),
               "generation": ("token agreement", Unit.AGREEMENT)}


def model_gates(plan: Plan, spec: StackSpec, model: ModelResults) -> list[GateResult]:
    gates = plan.settings.gates
    out = plan.settings.out_dir
    name, stack = model.name, spec.name
    record_path = layout.model_dir(out, stack, name).relative_to(out).as_posix()
    found = Gates(plan=plan, model=model, stack=stack, root="quantized-export" if model.quantized else "export")
    if model.quantized and (gates["quantized"].severity == "off" or found.candidate.skipped_variant):
        return []  # off, or this stack has no recipe for the variant: nothing to judge
    _same_inputs_gate(found)
    if model.quantized:
        _quantized_gates(found, record_path)
        return found.results

    _root_gate(found, gates["export"].severity, "every stage ok (build → export → save → load → run)", record_path)
    _delegation_gate(found, record_path, gates["delegation"].severity)
    _size_gate(found, record_path, gates["artifact-size"].severity)
    output_gates(found)
    latency_gate(found, gates["latency"].severity)
    device_latency_gate(found, gates["latency"].severity)
    memory_gate(found, gates["memory"].severity)
    device_memory_gate(found, gates["memory"].severity)
    budget = dict(gates.budgets).get(name)
    if budget is not None:
        budget_gates(found, budget.latency_p50_ms, budget.peak_rss_mb, budget.severity)
        device_budget_gates(found, budget.latency_p50_ms, budget.peak_rss_mb, budget.severity)
    return found.results


def _same_inputs_gate(found: Gates) -> None:
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


def _root_gate(found: Gates, severity: str, condition: str, record_path: str) -> None:
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


def _quantized_gates(found: Gates, record_path: str) -> None:
    """A quantized variant against the fp32 reference: its own thresholds
    (``gates["quantized"]``), one severity for all of them. Latency and memory
    are judged against the baseline's same variant, where it has a recipe for it."""
    gates, model = found.plan.settings.gates, found.model
    severity = gates["quantized"].severity
    _root_gate(found, severity, f"every stage ok (quantize ({model.variant}) → export → save → load → run)",
               record_path)
    output_gates(found)
    _size_gate(found, record_path, gates["artifact-size"].severity)
    _delegation_gate(found, record_path, gates["delegation"].severity)
    if not found.baseline.skipped_variant:
        # Against the baseline's own variant: what the team could ship quantized today.
        latency_gate(found, gates["latency"].severity)
        device_latency_gate(found, gates["latency"].severity)
        memory_gate(found, gates["memory"].severity)
        device_memory_gate(found, gates["memory"].severity)


def output_gates(found: Gates) -> None:
    """What the artifact computes, against the reference: its numerics and its task's agreement, a quantized variant's
    by its own thresholds; a stack's and a remedy's alike."""
    gates, model = found.plan.settings.gates, found.model
    if model.quantized:
        severity = gates["quantized"].severity
        comparison = quantized_numerics_gate(found, severity)
        if model.task_kind in ("classification", "generation"):
            task_gate(found, comparison, f"quantized-task-{model.task_kind}", severity)
        return
    comparison = numerics_gate(found, gates["numerics"].severity)
    if model.task_kind in HEADLINE:
        task_gate(found, comparison, f"task-{model.task_kind}", gates["task"].severity,
                  embedding_ranking=model.task_kind == "embedding")


def quantized_numerics_gate(found: Gates, severity: str) -> Comparison | None:
    """A quantized variant's artifact against the reference: the worst output's SNR and cosine."""
    gates, model = found.plan.settings.gates, found.model
    comparison = _reference_comparison(found)
    min_snr, min_cosine = gates.for_model(model.name, "min-snr-db"), gates.for_model(model.name, "min-cosine")
    rule = Rule(metric="SNR", op="≥", threshold=Quantity(value=min_snr, unit=Unit.DB),
                condition=f"and cosine ≥ {min_cosine:g}, every output",
                evidence=comparison.label if comparison else "artifact vs reference")
    why = _comparison_missing(found, comparison)
    if why is not None:
        found.missing("quantized-numerics", severity, rule, why)
        return comparison
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
    return comparison


def _reference_comparison(found: Gates) -> Comparison | None:
    """The candidate's artifact against the reference, or against its own eager model where the baseline gives none."""
    actual = Side(stack=found.stack, kind="artifact")
    comparison = found.model.comparison(actual, reference_side(found.plan))
    if comparison is not None and reference_side(found.plan) in comparison.absent and \
            found.baseline_missing().status is GateStatus.NOT_COMPARABLE:
        return found.model.comparison(actual, Side(stack=found.stack, kind="eager")) or comparison
    return comparison


def _comparison_missing(found: Gates, comparison: Comparison | None) -> Missing | None:
    """Why a comparison has nothing to judge, charged to whoever caused it; None when it does."""
    if comparison is None:
        return found.candidate_missing()
    if comparison.damaged:
        return Missing(status=GateStatus.INCOMPLETE, note=comparison.damaged)
    if comparison.absent:  # the candidate's own failure first: it is charged to whoever failed
        stacks = {side.stack for side in comparison.absent}
        return found.candidate_missing() if found.stack in stacks else found.baseline_missing()
    if comparison.reference_not_finite:
        # NaN or Inf in the reference is the model's or its inputs', not the candidate's, and nothing passes on it:
        # incomplete (exit 3), not exit 2, which stops a command before it runs; found once both stacks ran, the
        # other models' evidence stands and the report shows which output.
        return Missing(status=GateStatus.INCOMPLETE, note=comparison.reference_not_finite)
    outputs = comparison.comparable_outputs
    if not outputs or len(outputs) != len(comparison.outputs or ()):
        return Missing(status=GateStatus.FAILED, note=comparison.why_incomparable())
    return None


def _against(comparison: Comparison, found: Gates) -> str:
    """Where the comparison is not the reference's: the baseline could not give one."""
    if comparison.reference == reference_side(found.plan):
        return ""
    return f"against its own eager model: {found.baseline_missing().note}"


def numerics_gate(found: Gates, severity: str) -> Comparison | None:
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
    """Reference outputs too flat for the comparison to say much (comparison.DEGENERATE_OUTPUT): said
    beside the gate's outcome, which stands — a dead model's outputs are still its outputs."""
    return tuple(f"reference output {output.name} is degenerate ({why}): the comparison with it says little"
                 for output in comparison.comparable_outputs if (why := output.degenerate_reference))


def task_gate(found: Gates, comparison: Comparison | None, gate: str, severity: str, *,
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


def _size_gate(found: Gates, record_path: str, severity: str) -> None:
    size_bytes = found.candidate.artifact_bytes
    limit = found.plan.settings.gates["artifact-size"].threshold
    rule = Rule(metric="size", op="≤", threshold=Quantity(value=limit, unit=Unit.BYTES),
                evidence=f"{record_path}/export.json (save)")
    if size_bytes is None:
        found.missing("artifact-size", severity, rule, found.candidate_missing())
    else:
        found.add("artifact-size", severity, size_bytes <= limit, rule,
                  measured=Quantity(value=size_bytes, unit=Unit.BYTES))


def _delegation_gate(found: Gates, record_path: str, severity: str) -> None:
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
