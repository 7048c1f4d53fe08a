"""The report's "Way out": for each artifact that departs from its own eager model, the operators behind
it, a reproducer to hand upstream, and the change that avoids it, checked on the same inputs
(the diagnose phase: compat/diagnose/diagnose_phase.py, its records read by upgrade_gate.schema.diagnosis.Diagnosis)."""

from __future__ import annotations

from upgrade_gate.report._method_section import method_blocks, rel_l2_text, snr_text
from upgrade_gate.report._verdict_section import model_anchor
from upgrade_gate.report.render import Block, Heading, Paragraph, bullets, code_span, mark
from upgrade_gate.schema.diagnosis import Diagnosis
from upgrade_gate.schema.measured import NOT_RUN
from upgrade_gate.schema.results import ModelResults, Results
from upgrade_gate.schema.stack import PORTABLE_SHARE, SlowdownSplit
from upgrade_gate.schema.verdict import GateResult, GateStatus, Remedy, Severity, VerdictRecord

INTRO = ("Where an artifact departs from its own stack's eager model beyond the numerics threshold, upgrade-gate "
         "lowers the model again with parts of it kept out of the delegate, each lowering run on the same inputs, "
         "until the operators behind the difference are found (`diagnose-budget` seconds per model). Each finding "
         "comes with a reproducer that needs torch and executorch only, and the change that avoids it, checked by "
         "lowering the whole method with it. Where a candidate's quantized variant is below its quantized-numerics "
         "gate, the recipe is run again with layers left in float, ranked by the noise each adds, until the "
         "variant meets the gate; the lines that leave them so are checked the same way. Where a candidate's model "
         "does not export, each method is exported again with the export API's other options, in order. Where it "
         "lowers and the runtime refuses to load it, the node the runtime's own words name is matched to the calls "
         "that make it, and the remedies those words point at are checked the same way. Where a "
         "candidate's latency gate fails or cannot tell, its entry says where the candidate's time goes, from both "
         "stacks' per-operator profiles.")


def way_out_blocks(results: Results) -> list[Block]:
    """The section, where any stack's artifact was diagnosed or would have been had the search been on, and
    where a candidate's latency gate failed or could not tell (where its time goes)."""
    by_name = {model.name: model for model in results.models}
    # A latency gate not judged (the machine busy) keeps a search's entry, provisional: what was computed is shown.
    searched_latency = {(m.name, s) for m in results.models for s, own in m.stacks.items()
                        if own.diagnosis is not None and own.diagnosis.search == "latency"}
    slow = {(gate.model, gate.stack): gate for gate in results.verdict.gates
            if gate.gate == "latency" and gate.stack != results.verdict.baseline and gate.model in by_name
            and (gate.status in (GateStatus.FAILED, GateStatus.INCONCLUSIVE)
                 or gate.status is GateStatus.INCOMPLETE and (gate.model, gate.stack) in searched_latency)}
    # A latency search is said where its gate failed or could not tell, with where the time goes; where the gate
    # passed, what it found is not needed.
    entries: list[tuple[tuple[int, int], str, str, Diagnosis | GateResult]] = [
        (decides_first(results.verdict, model.name, stack), model.name, stack, own.diagnosis)
        for model in results.models for stack, own in model.stacks.items() if own.diagnosis is not None
        and (own.diagnosis.search != "latency" or (model.name, stack) in slow)]
    searched = {(name, stack) for _, name, stack, _ in entries}
    entries += [(decides_first(results.verdict, model, stack), model, stack, gate)
                for (model, stack), gate in slow.items() if (model, stack) not in searched]
    entries.sort(key=lambda entry: entry[0])  # stable: the suite's order among equals, a model's search first
    departed = [model for model in results.models if _departs(results, model)]
    if not entries and not departed:
        return []
    blocks: list[Block] = [Heading(2, "Way out", anchor="way-out"), Paragraph(INTRO)]
    if not results.settings.diagnose_budget_s and departed:
        blocks.append(Paragraph("The search is turned off (`diagnose-budget = 0`); these artifacts depart from their "
                                f"own eager models: {', '.join(code_span(m.name) for m in departed)}."))
    for _, name, stack, found in entries:
        model = by_name[name]
        if isinstance(found, GateResult):
            blocks += latency_blocks(model, found, results.verdict.baseline, searched=False)
            continue
        python = results.stacks[stack].installed
        if found.search == "latency":
            blocks += latency_blocks(model, slow[(name, stack)], results.verdict.baseline, searched=True)
        stopped = found.first_problem() or next((s for s in found.stages if s.status == "skipped"), None)
        if not found.methods and stopped is not None:  # the search did not start: say why, once
            blocks.append(Paragraph(f"{code_span(model.name)} in {stack}: no search — {stopped.explain()}"))
        for method in found.findings:
            blocks += method_blocks(model, stack, found, method, python.executable if python else None,
                                     model.stacks[stack].method_bytes(method.method))
        remedy = next((r for r in results.verdict.remedies if (r.model, r.stack) == (model.name, stack)), None)
        if remedy is not None:
            blocks.append(_judged(remedy))
    return blocks


# What a team would try for a portable kernel the delegate left a share of the time to (issue 39, item 6): by a
# part of the operator's name. Said, not tried: no latency remedy is lowered and timed yet.
LATENCY_ADVICE = (
    ("batch_norm", "fold the batch norm into the convolution or linear that precedes it, before export "
                   "(`torch.nn.utils.fusion.fuse_conv_bn_eval`, `fuse_linear_bn_eval`): XNNPACK then runs one "
                   "operator; a batch norm with nothing to fold into stays a portable kernel"),
    ("native_layer_norm", "a layer norm XNNPACK does not take in this release: its portable kernel runs it"),
    ("gelu", "GELU written as its formula (`0.5*x*(1+tanh(...))`) stays in the delegate"),
)


def latency_blocks(model: ModelResults, gate: GateResult, baseline: str, *, searched: bool) -> list[Block]:
    """A candidate's latency gate that failed or could not tell: where its time goes, method by method, from its
    per-operator profile (its share in portable kernels, and what a team would try for each), the baseline's top
    operators beside it; ``searched``: a latency search follows with its remedy."""
    stack = gate.stack
    failed, unjudged = gate.status is GateStatus.FAILED, gate.status is GateStatus.INCOMPLETE
    outcome = ("fails" if failed else "was not judged, so this entry is **provisional**" if unjudged
               else "cannot tell (its interval straddles the threshold)")
    blocks: list[Block] = [
        Heading(3, f"{code_span(model.name)} · latency in {stack}" + (" (provisional)" if unjudged else ""),
                anchor=f"way-out-{model_anchor(model.name)}-latency"),
        Paragraph(f"{mark('FAILED' if failed else 'incomplete')} The latency gate {outcome}: "
                  f"{gate.measured_against_rule}.")]
    blocks += latency_reproducer_blocks(model, stack)
    own, theirs = model.stacks[stack].profile, model.stacks[baseline].profile if baseline in model.stacks else {}
    if not own:
        return blocks + [Paragraph(f"No per-operator profile of {stack} (`profile = false`, or its profile stage did "
                                   "not run): nothing says where its time goes.")]
    undelegated = model.stacks[stack].delegation
    # A profile the result cache gave back was taken by an earlier run, on that run's machine load: said so beside
    # this run's latency figure (issue 63).
    earlier = (" (profiled by an earlier run, its runtime phase reused from the result cache: `--fresh` profiles "
               "again)" if "runtime" in model.stacks[stack].reused_phases() else "")
    for method, operators in own.items():
        portable = [op for op in operators if op.portable]
        where = "" if method == "forward" else f" ({code_span(method)})"
        said = (f"{stack}'s profile{where}{earlier}: {sum(op.share for op in portable):.1%} of its time in "
                "ExecuTorch's portable kernels, outside the delegate")
        items = [f"{code_span(op.name)}: {op.share:.1%}, {op.total_ms:.3f} ms over {op.calls} call(s) per call"
                 + (f" — {advice}" if (advice := _advice(op.name)) else "") for op in portable[:LATENCY_TOP]]
        left = undelegated.get(method)
        if left is not None and left.portable_ops:
            items.append(f"left out of the delegate at export: {left.portable_summary()}")
        top = theirs.get(method, [])[:3]
        if top:
            items.append(f"{baseline}'s most time: " + ", ".join(f"{code_span(op.name)} {op.share:.1%}" for op in top))
        blocks += [Paragraph(said + ":"), bullets(*items)] if items else [Paragraph(said + ".")]
        threshold = gate.threshold.value if gate.threshold is not None else None
        split = model.slowdown_split(stack, method) if threshold is not None else None
        if split is not None and threshold is not None and split.ratio > threshold:  # within it: no gap to account for
            blocks.append(Paragraph(_where_the_gap_is(split, threshold)))
    if not searched:
        blocks.append(Paragraph("No remedy was lowered and timed for it: a latency search runs where a portable batch "
                                f"norm takes at least {PORTABLE_SHARE:.0%} of a method's profiled time; the profiles "
                                "side by side are in the model's section."))
    return blocks


LATENCY_TOP = 5  # portable kernels named per method


def _where_the_gap_is(split: SlowdownSplit, threshold: float) -> str:
    """Whether the portable kernels can account for the slowdown: were they free, the ratio that would be left."""
    bound = (f"Were its portable kernels free, it would still take ×{split.without_portable:.3f} the baseline's time "
             f"(×{split.ratio:.3f} now, less their {split.portable_share:.1%})")
    if not split.in_delegate(threshold):
        return bound + f": within ×{threshold:g}, so they can account for the slowdown."
    calls = ", ".join(f"{code_span(op.name)} {op.share:.1%} over {op.calls} call(s)" for op in split.delegates)
    return (bound + f", over ×{threshold:g}: most of the slowdown is inside the delegate ({calls}). Its own "
            "operators are not in this runtime's profile (ExecuTorch's pip wheel has no event tracer), so none of them "
            "is named.")


def latency_reproducer_blocks(model: ModelResults, stack: str) -> list[Block]:
    """The measure session's reproducer of the slowdown (measure/latency_reproducer.py), and what its run said."""
    found = model.latency_reproducer
    if found is None or found.stack != stack:
        return []
    where = f"{code_span(found.method)} at {found.threads} thread(s), ×{found.found_ratio:.3f} in the rounds"
    if not found.script:
        return [Paragraph(f"No reproducer of the slowdown ({where}): {found.reason}.")]
    ran = f"exit {found.exit_code}, {found.answer}" if found.exit_code is not None else found.answer
    said = found.said.removeprefix(NOT_RUN)
    return [Paragraph(f"Reproducer ({where}): {code_span(found.script)} times both stacks' artifacts of the method in "
                      "alternating rounds, each in its own stack's Python (`python3 repro.py --baseline-python PATH "
                      f"--candidate-python PATH`; the report's stacks by default): exit 1 while the candidate takes "
                      f"more than ×{found.threshold:g} the baseline's time, 0 when it does not. Run here: {ran}"
                      + (f" — {code_span(said)}." if found.exit_code is not None and said else
                         f": {said}." if said else "."))]


def _advice(operator: str) -> str:
    return next((advice for part, advice in LATENCY_ADVICE if part in operator), "")


def decides_first(verdict: VerdictRecord, model: str, stack: str) -> tuple[int, int]:
    """Entries in the order they weigh on the verdict: a candidate's failed hard gate, a failed soft one, the rest of
    the candidates', the baseline's own findings; within each, one whose remedy passes (what the headline counts)."""
    if stack == verdict.baseline:
        return 3, 0
    failed = {g.severity for g in verdict.of(stack) if g.model == model and g.status is GateStatus.FAILED}
    weight = 0 if Severity.HARD in failed else 1 if failed else 2
    remedied = any(r.passes for r in verdict.remedies if (r.model, r.stack) == (model, stack))
    return weight, 0 if remedied else 1


def _judged(remedy: Remedy) -> Paragraph:
    """The remedy judged as the stack is: the gate's comparison and threshold, its cost against what ships."""
    if remedy.gate == "latency":
        return _judged_latency(remedy)
    outcome = (f"{mark('passed')} the {remedy.gate} gate passes" if remedy.passes
               else f"{mark('FAILED')} the {remedy.gate} gate still fails ({remedy.note})")
    if remedy.min_snr_db is not None:
        cosine = f", cosine {remedy.cosine:.5f} ≥ {remedy.min_cosine:g}" if remedy.cosine is not None else ""
        worst = (f"SNR {snr_text(remedy.rel_l2)} ≥ {remedy.min_snr_db:g} dB{cosine}" if remedy.passes
                 else f"threshold SNR ≥ {remedy.min_snr_db:g} dB, cosine ≥ {remedy.min_cosine:g}")
    else:
        worst = f"rel. L2 {rel_l2_text(remedy.rel_l2)} ≤ {rel_l2_text(remedy.threshold)}" if remedy.passes else \
            f"threshold {rel_l2_text(remedy.threshold)}"
    conditions = "".join(f" A condition: {condition}." for condition in remedy.conditions)
    # The other gates it was judged by, said here when they pass; otherwise the outcome's note or a condition does.
    timed = "".join(
        f" {mark('passed')} The {g.gate} gate passes with the remedy"
        + (", timed in the measure session's rounds against the baseline's" if g.gate == "latency" else "")
        + f": {g.measured_against_rule}." for g in remedy.gates
        if g.status is GateStatus.PASSED and g.gate not in ("numerics", "quantized-numerics"))
    return Paragraph(f"Judged as the stack is, {code_span(remedy.model)} with the remedy ({', '.join(remedy.methods)} "
                     f"remedied, its other methods as shipped): {outcome} ({worst}, against the reference)."
                     + timed + conditions)


def _departs(results: Results, model: ModelResults) -> bool:
    """A candidate's float artifact further from its own eager model than the numerics threshold."""
    if model.quantized:
        return False
    threshold = results.settings.gates.for_model(model.name, "max-rel-l2")
    return any(o.rel_l2 is not None and o.rel_l2 > threshold for c in model.comparisons
               if c.purpose == "candidate export fidelity" for o in c.outputs or ())


# How a gate's status reads after "the latency gate …", with a mark of its own.
STATUS_WORDS = {GateStatus.PASSED: ("passed", "passes"), GateStatus.FAILED: ("FAILED", "still fails"),
                GateStatus.INCONCLUSIVE: ("incomplete", "cannot tell"), GateStatus.INCOMPLETE: ("incomplete", "was not "
                                                                                                   "judged")}


def _judged_latency(remedy: Remedy) -> Paragraph:
    """A latency remedy judged by the latency gate, its status and threshold its own (issue 63: it read "FAILED … still
    fails" for an incomplete gate, quoting the numerics threshold), against the baseline and against what ships."""
    gate = remedy.latency_gate
    marked, verb = STATUS_WORDS.get(gate.status, ("incomplete", gate.status.value)) if gate else ("incomplete",
                                                                                                  "was not timed")
    against = f": {gate.measured_against_rule}" if gate else ""
    shipped = (f"; against the shipped artifact, ×{remedy.latency_ratio.median:.3g} (timed in turns in the diagnose "
               "phase)" if remedy.latency_ratio else "")
    within = "within" if remedy.rel_l2 is not None and remedy.rel_l2 <= remedy.threshold else "beyond"
    numerics = (f" Its outputs are {within} the numerics threshold (rel. L2 {rel_l2_text(remedy.rel_l2)}, threshold "
                f"{rel_l2_text(remedy.threshold)}, against the reference).")
    provisional = f" Provisional: {remedy.provisional}." if remedy.provisional else ""
    return Paragraph(f"Judged as the stack is, {code_span(remedy.model)} with the remedy ({', '.join(remedy.methods)} "
                     f"remedied): {mark(marked)} the latency gate {verb} with the remedy, against the baseline"
                     f"{against}{shipped}." + numerics
                     + "".join(f" A condition: {condition}." for condition in remedy.conditions) + provisional)
