"""The remedies a candidate's diagnose phase found, judged as the stack is: one per failed hard numerics
gate whose model has one, and one per failed quantized-numerics gate whose variant has layers to leave in
float (judged by that gate's SNR and cosine). The remedied methods' outputs against the reference (judge/gather.py), the
other methods' as they shipped, by the gate's own threshold; the latency by the latency gate's own code on the
candidate timed with its remedy in the measure session's rounds (measure/rounds.py); the size. The verdict as
configured stands; the report says what the remedies would make of it."""

from __future__ import annotations

import math
from dataclasses import replace

from upgrade_gate.config.plan import Plan
from upgrade_gate.judge._gates import Gates
from upgrade_gate.judge._latency_gates import latency_gate
from upgrade_gate.judge.gather import reference_side
from upgrade_gate.judge.numerics import method_of
from upgrade_gate.schema.comparison import Side
from upgrade_gate.schema.measured import Measured, remedied
from upgrade_gate.schema.results import ModelResults
from upgrade_gate.schema.stack import StackResults
from upgrade_gate.schema.verdict import GateResult, GateStatus, Remedy, Severity

# The gate each kind of search answers: a float model's numerics (hard failures: a soft one is a condition
# already), a quantized variant's (soft by default: its remedy lifts a condition).
NUMERICS, QUANTIZED, EXPORT, QUANTIZED_EXPORT = "numerics", "quantized-numerics", "export", "quantized-export"
GATE_OF_SEARCH = {"operators": NUMERICS, "keep-float": QUANTIZED, "quantized-lowering": QUANTIZED, "export": EXPORT}
# A quantized variant's remedy is judged by the quantized gates' SNR and cosine, whichever gate it answers: its
# numerics, or its export (a variant that did not lower: quantized-lowering, from the lowering's error).
QUANTIZED_GATES = (QUANTIZED, QUANTIZED_EXPORT)


def remedies(plan: Plan, models: list[ModelResults], gates: list[GateResult]) -> tuple[Remedy, ...]:
    failed = {(g.stack, g.model, g.gate) for g in gates if g.status is GateStatus.FAILED
              and (g.gate in QUANTIZED_GATES or g.severity is Severity.HARD)}
    found = []
    for model in models:
        for stack, own in model.stacks.items():
            gate = GATE_OF_SEARCH.get(own.diagnosis.search, NUMERICS) if own.diagnosis is not None else NUMERICS
            if gate == QUANTIZED and (stack, model.name, QUANTIZED_EXPORT) in failed:
                gate = QUANTIZED_EXPORT  # the variant did not lower: what its remedy answers first
            if (stack, model.name, gate) in failed and own.diagnosis is not None:
                remedy = _judged(plan, model, stack, own, gate)
                if remedy is not None:
                    found.append(remedy)
    return tuple(found)


def _judged(plan: Plan, model: ModelResults, stack: str, own: StackResults, gate: str) -> Remedy | None:
    assert own.diagnosis is not None
    findings = own.diagnosis.findings
    remedied = [m for m in findings if m.remedy_code is not None]
    if not remedied:
        return None
    gates = plan.settings.gates
    min_snr = gates.for_model(model.name, "min-snr-db") if gate in QUANTIZED_GATES else None
    min_cosine = gates.for_model(model.name, "min-cosine") if gate in QUANTIZED_GATES else None
    # One measure for both gates: an SNR of s dB is a relative L2 of 10^(−s/20).
    threshold = 10 ** (-min_snr / 20) if min_snr is not None else gates.for_model(model.name, "max-rel-l2")
    # Every method as the team would ship it remedied: the remedied ones' outputs, the others' as they were.
    worst: dict[str, float] = {m.method: m.remedy_rel_l2_reference if m.remedy_rel_l2_reference is not None
                               else math.nan for m in remedied if not m.remedy_error}  # a failed one: noted below
    shipped = model.comparison(Side(stack=stack, kind="artifact"), reference_side(plan))
    for output in (shipped.outputs or ()) if shipped else ():
        method = method_of(output.name)
        if method not in {m.method for m in remedied} and output.rel_l2 is not None:
            worst[f"{method} (as shipped)"] = max(worst.get(f"{method} (as shipped)", 0.0), output.rel_l2)
    cosines = {m.method: m.remedy_cosine_reference for m in remedied if m.remedy_cosine_reference is not None}
    for output in (shipped.outputs or ()) if shipped and min_cosine is not None else ():
        method = method_of(output.name)
        if method not in {m.method for m in remedied} and output.cosine is not None:
            cosines[f"{method} (as shipped)"] = min(cosines.get(f"{method} (as shipped)", 1.0), output.cosine)
    over = {method: value for method, value in worst.items() if not value <= threshold}
    unanswered = [m for m in findings if m.remedy_code is None]
    if gate == EXPORT:  # the artifact as a team would ship it: every method exported with its option
        conditions_of_export = [f"{m.method}: {m.export_option} specialized {len(m.assumed)} data-dependent "
                                f"decision(s) to the example inputs ({'; '.join(m.assumed)}): the program is right "
                                "only for inputs that decide them the same way" for m in remedied if m.assumed]
    else:
        conditions_of_export = []
    against = own.diagnosis.remedy_against or "the reference"
    notes = [(f"{method}: SNR {-20 * math.log10(value):.1f} dB against {against}" if min_snr is not None and value > 0
              else f"{method}: rel. L2 {value:.2e} against {against}") if not math.isnan(value)
             else f"{method}: not compared with the reference" for method, value in over.items()]
    notes += [f"{method}: cosine {value:.5f} against {against}" for method, value in cosines.items()
              if min_cosine is not None and not value >= min_cosine]
    notes += [f"{m.method}: {m.status}" for m in unanswered]
    notes += [f"{m.method}: the remedy does not work as written ({m.remedy_error})" for m in remedied if m.remedy_error]
    shipped_bytes = [own.method_bytes(m.method) for m in remedied]
    timed = [m for m in remedied if m.latency is not None]
    slowest = max(timed, key=lambda m: m.latency.median if m.latency else 0.0, default=None)
    conditions: list[str] = conditions_of_export
    severity = plan.settings.gates["latency"].severity
    latency = remedied_latency_gate(plan, model, stack, severity) if severity != "off" else None
    if latency is not None and latency.status not in (GateStatus.PASSED, GateStatus.BLOCKED):
        # Failed, inconclusive or not timed: a condition of a soft gate; a hard gate's keeps the remedy from passing.
        # (Blocked: the candidate did not export, so nothing shipped to time; with_remedies makes that a condition.)
        said = f"the latency gate with the remedy: {latency.status.value} ({latency.measured_against_rule})"
        (notes if severity == "hard" else conditions).append(said)
    return Remedy(
        stack=stack, model=model.name, gate=gate, min_snr_db=min_snr, min_cosine=min_cosine,
        cosine=min(cosines.values(), default=None) if min_cosine is not None else None,
        methods=tuple(m.method for m in remedied),
        operators=tuple(dict.fromkeys([*(c.named for m in remedied for c in m.culprits),
                                       *(m.export_option for m in remedied if m.export_option)])),
        passes=not notes,
        rel_l2=max((v for v in worst.values() if not math.isnan(v)), default=None), threshold=threshold,
        latency_ratio=slowest.latency if slowest else None, threads=slowest.latency_threads if slowest else None,
        latency_gate=latency,
        bytes=sum(m.remedy_bytes or 0 for m in remedied) if all(m.remedy_bytes for m in remedied) else None,
        shipped_bytes=sum(b or 0 for b in shipped_bytes) if all(shipped_bytes) else None,
        code="\n\n".join(dict.fromkeys(m.remedy_code for m in remedied if m.remedy_code)),
        reproducers=tuple(f"{own.diagnosis.record_dir}/{m.reproducer}" for m in findings if m.reproducer),
        note="; ".join(notes), conditions=tuple(conditions))


# A candidate whose remedy was not timed: its latency gate is incomplete, never passed on the shipped one's figures.
NOT_TIMED = Measured(status="not measured", problem="the remedied artifacts were not timed in the measure session "
                                                    "(`--remeasure` times them)")


def remedied_latency_gate(plan: Plan, model: ModelResults, stack: str, severity: str) -> GateResult | None:
    """The latency gate, by its own code (judge/_latency_gates.py), on the candidate with its remedy: the
    remedied side's rounds (measured.remedied) against the baseline's, every thread count and method, the same
    intervals, min-delta-ms, contention check and "inconclusive" as the stack's own latency gate."""
    own = model.stacks[stack]
    side = remedied(stack)
    measured = own.remedied_measured or {threads: NOT_TIMED for threads in own.measured}
    found = Gates(plan=plan, model=replace(model, stacks={**model.stacks, side: replace(own, measured=measured)}),
                  stack=side, root="export")
    latency_gate(found, severity)
    return found.results[0] if found.results else None
