"""The remedies a candidate's diagnose phase found, one per failed gate a search answers, each judged by the gates'
own code on the candidate as the team would ship it remedied (``remedied_gates``). The verdict as configured
stands; the report says what the remedies would make of it.
"""

from __future__ import annotations

from dataclasses import replace

from upgrade_gate.config.plan import Plan
from upgrade_gate.judge._gates import Gates
from upgrade_gate.judge._latency_gates import latency_gate
from upgrade_gate.judge._model_gates import output_gates
from upgrade_gate.schema.measured import Measured, remedied
from upgrade_gate.schema.results import ModelResults
from upgrade_gate.schema.stack import StackResults
from upgrade_gate.schema.verdict import GateResult, GateStatus, JudgedArtifact, Remedy, Severity

# The gate each kind of search answers: a float model's numerics (hard failures: a soft one is a condition
# already), a quantized variant's (soft by default: its remedy lifts a condition), the latency gate.
NUMERICS, QUANTIZED, EXPORT, QUANTIZED_EXPORT = "numerics", "quantized-numerics", "export", "quantized-export"
LATENCY = "latency"  # an exact model whose time goes to portable kernels (compat/diagnose/latency_phase.py)
GATE_OF_SEARCH = {"operators": NUMERICS, "keep-float": QUANTIZED, "quantized-lowering": QUANTIZED, "export": EXPORT,
                  "latency": LATENCY, "load": EXPORT, "quantize": QUANTIZED_EXPORT}
# A quantized variant's remedy is judged by the quantized gates' SNR and cosine, whichever gate it answers: its
# numerics, or its export (a variant that did not lower: quantized-lowering, from the lowering's error).
QUANTIZED_GATES = (QUANTIZED, QUANTIZED_EXPORT)
LATENCY_ANSWERED = (GateStatus.FAILED, GateStatus.INCONCLUSIVE, GateStatus.INCOMPLETE)


def remedies(plan: Plan, models: list[ModelResults], gates: list[GateResult]) -> tuple[Remedy, ...]:
    failed = {(g.stack, g.model, g.gate) for g in gates if g.status is GateStatus.FAILED
              and (g.gate in QUANTIZED_GATES or g.severity is Severity.HARD)}
    # A latency gate that failed or could not tell, of either severity: what a latency search answers; one not
    # judged (incomplete) too, its remedy provisional.
    failed |= {(g.stack, g.model, g.gate) for g in gates if g.gate == LATENCY and g.status in LATENCY_ANSWERED}
    unjudged = {(g.stack, g.model): f"the latency gate was not judged: {g.note}" for g in gates
                if g.gate == LATENCY and g.status is GateStatus.INCOMPLETE}
    found = []
    for model in models:
        for stack, own in model.stacks.items():
            gate = GATE_OF_SEARCH.get(own.diagnosis.search, NUMERICS) if own.diagnosis is not None else NUMERICS
            if (gate == QUANTIZED or gate == EXPORT and model.quantized) and \
                    (stack, model.name, QUANTIZED_EXPORT) in failed:
                gate = QUANTIZED_EXPORT  # the variant did not lower, or load: what its remedy answers first
            if (stack, model.name, gate) in failed and own.diagnosis is not None:
                remedy = _judged(plan, model, stack, own, gate)
                if remedy is not None:
                    provisional = unjudged.get((stack, model.name), "") if gate == LATENCY else ""
                    found.append(replace(remedy, provisional=provisional))
    return tuple(found)


def _judged(plan: Plan, model: ModelResults, stack: str, own: StackResults, gate: str) -> Remedy | None:
    assert own.diagnosis is not None
    findings = own.diagnosis.findings
    remedied_methods = [m for m in findings if m.remedy_code is not None]
    if not remedied_methods:
        return None
    gates = plan.settings.gates
    min_snr = gates.for_model(model.name, "min-snr-db") if gate in QUANTIZED_GATES else None
    min_cosine = gates.for_model(model.name, "min-cosine") if gate in QUANTIZED_GATES else None
    # One measure for both gates: an SNR of s dB is a relative L2 of 10^(−s/20).
    threshold = 10 ** (-min_snr / 20) if min_snr is not None else gates.for_model(model.name, "max-rel-l2")
    judged = remedied_gates(plan, model, stack)
    # The numerics gate of the model's kind: what every remedy must pass; a latency search's, the latency gate too.
    answers = {NUMERICS, QUANTIZED, *([LATENCY] if gate == LATENCY else [])}
    notes: list[str] = []
    conditions: list[str] = []
    for result in judged:
        said = f"the {result.gate} gate with the remedy: {result.status.value} ({result.measured_against_rule})"
        if result.gate in answers:
            if result.status is not GateStatus.PASSED:
                notes.append(said)
        # Blocked: the candidate did not export, so nothing shipped was timed or run; with_remedies makes it a
        # condition. Otherwise a gate that does not pass keeps a hard gate's remedy from passing, or is a condition.
        elif result.status not in (GateStatus.PASSED, GateStatus.BLOCKED):
            (notes if result.severity is Severity.HARD else conditions).append(said)
    notes += [f"{m.method}: {m.status}" for m in findings if m.remedy_code is None]
    notes += [f"{m.method}: the remedy does not work as written ({m.remedy_error})"
              for m in remedied_methods if m.remedy_error]
    if gate == EXPORT:  # the artifact as a team would ship it: every method exported with its option
        conditions[:0] = [f"{m.method}: {m.export_option} specialized {len(m.assumed)} data-dependent decision(s) "
                          f"to the example inputs ({'; '.join(m.assumed)}): the program is right only for inputs "
                          "that decide them the same way" for m in remedied_methods if m.assumed]
    comparison = own.diagnosis.remedy_comparison
    outputs = comparison.comparable_outputs if comparison is not None else ()
    cosines = [o.cosine for o in outputs if o.cosine is not None]
    shipped_bytes = [own.method_bytes(m.method) for m in remedied_methods]
    timed = [m for m in remedied_methods if m.latency is not None]
    slowest = max(timed, key=lambda m: m.latency.median if m.latency else 0.0, default=None)
    return Remedy(
        stack=stack, model=model.name, gate=gate, min_snr_db=min_snr, min_cosine=min_cosine,
        cosine=min(cosines, default=None) if min_cosine is not None else None,
        methods=tuple(m.method for m in remedied_methods),
        operators=tuple(dict.fromkeys([*(c.named for m in remedied_methods for c in m.culprits),
                                       *(m.export_option for m in remedied_methods if m.export_option)])),
        passes=not notes,
        rel_l2=max((o.rel_l2 for o in outputs if o.rel_l2 is not None), default=None), threshold=threshold,
        latency_ratio=slowest.latency if slowest else None, threads=slowest.latency_threads if slowest else None,
        gates=tuple(judged),
        bytes=sum(m.remedy_bytes or 0 for m in remedied_methods) if all(m.remedy_bytes for m in remedied_methods)
        else None,
        shipped_bytes=sum(b or 0 for b in shipped_bytes) if all(shipped_bytes) else None,
        code="\n\n".join(dict.fromkeys(m.remedy_code for m in remedied_methods if m.remedy_code)),
        artifacts=tuple(JudgedArtifact(stack=stack, model=model.name, file=m.remedy_file, sha256=m.remedy_sha256,
                                       bytes=m.remedy_bytes or 0, method=m.method)
                        for m in remedied_methods if m.remedy_file and m.remedy_sha256),
        reproducers=tuple(f"{own.diagnosis.record_dir}/{m.reproducer}" for m in findings if m.reproducer),
        note="; ".join(notes), conditions=tuple(conditions))


def remedied_gates(plan: Plan, model: ModelResults, stack: str) -> list[GateResult]:
    """The gates of what the candidate would ship remedied, on the side ``<stack>+remedy``, each by the code that judges
    the stack's: its comparison with the reference (judge/_comparisons.py) and its rounds against the baseline's."""
    own = model.stacks[stack]
    assert own.diagnosis is not None
    side = remedied(stack)
    comparison = own.diagnosis.remedy_comparison
    measured = own.remedied_measured or {threads: NOT_TIMED for threads in own.measured}
    found = Gates(plan=plan, stack=side, root="quantized-export" if model.quantized else "export",
                  model=replace(model, stacks={**model.stacks, side: replace(own, measured=measured)},
                                comparisons=(*model.comparisons, *([comparison] if comparison else []))))
    output_gates(found)
    if not model.quantized or not found.baseline.skipped_variant:  # as the stack's: against the baseline's variant
        latency_gate(found, plan.settings.gates["latency"].severity)
    return found.results


# A candidate whose remedy was not timed: its latency gate is incomplete, never passed on the shipped one's figures.
NOT_TIMED = Measured(status="not measured", problem="the remedied artifacts were not timed in the measure session "
                                                    "(`--remeasure` times them)")
