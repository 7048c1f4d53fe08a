"""The report's "Way out": for each artifact that departs from its own eager model, the operators behind
it, a reproducer to hand upstream, and the change that avoids it, checked on the same inputs
(the diagnose phase: compat/diagnose_phase.py, its records read by upgrade_gate.schema.diagnosis.Diagnosis)."""

from __future__ import annotations

import math

from upgrade_gate.report._verdict_section import model_anchor
from upgrade_gate.report.render import Block, Bullets, Code, Heading, Item, Paragraph, code_span, mark
from upgrade_gate.schema.diagnosis import Diagnosis, MethodDiagnosis
from upgrade_gate.schema.results import ModelResults, Results
from upgrade_gate.schema.stack import PORTABLE_SHARE
from upgrade_gate.schema.verdict import GateResult, GateStatus, Remedy, Severity, Unit, VerdictRecord
from upgrade_gate.text import size

INTRO = ("Where an artifact departs from its own stack's eager model beyond the numerics threshold, upgrade-gate "
         "lowers the model again with parts of it kept out of the delegate, each lowering run on the same inputs, "
         "until the operators behind the difference are found (`diagnose-budget` seconds per model). Each finding "
         "comes with a reproducer that needs torch and executorch only, and the change that avoids it, checked by "
         "lowering the whole method with it. Where a candidate's quantized variant is below its quantized-numerics "
         "gate, the recipe is run again with layers left in float, ranked by the noise each adds, until the "
         "variant meets the gate; the lines that leave them so are checked the same way. Where a candidate's model "
         "does not export, each method is exported again with the export API's other options, in order. Where a "
         "candidate's latency gate fails or cannot tell, its entry says where the candidate's time goes, from both "
         "stacks' per-operator profiles.")
NOT_FOUND = {
    "not pinned": "not pinned to operators",
    "spread": "no remedy: spread over the model",
    "stopped at budget": "stopped at the budget: nothing claimed",
    "does not reproduce": "does not reproduce when lowered again",
    "not searched": "not searched",
}


def way_out_blocks(results: Results) -> list[Block]:
    """The section, where any stack's artifact was diagnosed or would have been had the search been on, and
    where a candidate's latency gate failed or could not tell (where its time goes)."""
    by_name = {model.name: model for model in results.models}
    slow = {(gate.model, gate.stack): gate for gate in results.verdict.gates
            if gate.gate == "latency" and gate.stack != results.verdict.baseline and gate.model in by_name
            and gate.status in (GateStatus.FAILED, GateStatus.INCONCLUSIVE)}
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
            blocks += _method_blocks(model, stack, found, method, python.executable if python else None,
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
    """A candidate's latency gate that failed or could not tell: where the candidate's time goes, method by method,
    from its per-operator profile (the runtime phase's profile stage) — its share in ExecuTorch's portable
    kernels, outside the delegate, each with its calls and what the export left undelegated — and what a team
    would try for each; the baseline's top operators beside it. The gate's interval is the measure session's;
    each stack's profile is its own tool's (perf samples, the Lite Interpreter's profiler), to say where the time
    goes, not how much (``searched``: a latency search follows with its remedy)."""
    stack = gate.stack
    failed = gate.status is GateStatus.FAILED
    outcome = "fails" if failed else "cannot tell (its interval straddles the threshold)"
    blocks: list[Block] = [
        Heading(3, f"{code_span(model.name)} · latency in {stack}",
                anchor=f"way-out-{model_anchor(model.name)}-latency"),
        Paragraph(f"{mark('FAILED' if failed else 'incomplete')} The latency gate {outcome}: "
                  f"{gate.measured_against_rule}.")]
    own, theirs = model.stacks[stack].profile, model.stacks[baseline].profile if baseline in model.stacks else {}
    if not own:
        return blocks + [Paragraph(f"No per-operator profile of {stack} (`profile = false`, or its profile stage did "
                                   "not run): nothing says where its time goes.")]
    undelegated = model.stacks[stack].delegation
    for method, operators in own.items():
        portable = [op for op in operators if op.portable]
        where = "" if method == "forward" else f" ({code_span(method)})"
        said = (f"{stack}'s profile{where}: {sum(op.share for op in portable):.1%} of its time in ExecuTorch's "
                "portable kernels, outside the delegate")
        items = [f"{code_span(op.name)}: {op.share:.1%}, {op.total_ms:.3f} ms over {op.calls} call(s) per call"
                 + (f" — {advice}" if (advice := _advice(op.name)) else "") for op in portable[:LATENCY_TOP]]
        left = undelegated.get(method)
        if left is not None and left.portable_ops:
            items.append(f"left out of the delegate at export: {left.portable_summary()}")
        top = theirs.get(method, [])[:3]
        if top:
            items.append(f"{baseline}'s most time: " + ", ".join(f"{code_span(op.name)} {op.share:.1%}" for op in top))
        blocks += [Paragraph(said + (":" if items else ".")), bullets_of(items)] if items else [Paragraph(said + ".")]
    if not searched:
        blocks.append(Paragraph("No remedy was lowered and timed for it: a latency search runs where a portable batch "
                                f"norm takes at least {PORTABLE_SHARE:.0%} of a method's profiled time; the profiles "
                                "side by side are in the model's section."))
    return blocks


LATENCY_TOP = 5  # portable kernels named per method


def _advice(operator: str) -> str:
    return next((advice for part, advice in LATENCY_ADVICE if part in operator), "")


def bullets_of(items: list[str]) -> Block:
    return Bullets([Item(text) for text in items])


def decides_first(verdict: VerdictRecord, model: str, stack: str) -> tuple[int, int]:
    """Entries in the order they weigh on the verdict: a candidate's failed hard gate, then a failed soft one,
    then the rest of the candidates', then the baseline's own findings; within each, one whose remedy passes
    (what the headline counts) first. ``sorted`` keeps the suite's order among equals."""
    if stack == verdict.baseline:
        return 3, 0
    failed = {g.severity for g in verdict.of(stack) if g.model == model and g.status is GateStatus.FAILED}
    weight = 0 if Severity.HARD in failed else 1 if failed else 2
    remedied = any(r.passes for r in verdict.remedies if (r.model, r.stack) == (model, stack))
    return weight, 0 if remedied else 1


def _judged(remedy: Remedy) -> Paragraph:
    """The remedy judged as the stack is: the gate's comparison and threshold, its cost against what ships."""
    outcome = (f"{mark('passed')} the {remedy.gate} gate passes" if remedy.passes
               else f"{mark('FAILED')} the {remedy.gate} gate still fails ({remedy.note})")
    if remedy.min_snr_db is not None:
        cosine = f", cosine {remedy.cosine:.5f} ≥ {remedy.min_cosine:g}" if remedy.cosine is not None else ""
        worst = (f"SNR {_snr(remedy.rel_l2)} ≥ {remedy.min_snr_db:g} dB{cosine}" if remedy.passes
                 else f"threshold SNR ≥ {remedy.min_snr_db:g} dB, cosine ≥ {remedy.min_cosine:g}")
    else:
        worst = f"rel. L2 {_rel_l2(remedy.rel_l2)} ≤ {_rel_l2(remedy.threshold)}" if remedy.passes else \
            f"threshold {_rel_l2(remedy.threshold)}"
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


def _method_blocks(model: ModelResults, stack: str, found: Diagnosis, method: MethodDiagnosis,
                   python: str | None, shipped_bytes: int | None) -> list[Block]:
    title = f"{code_span(model.name)} · {code_span(method.method)} in {stack}"
    blocks: list[Block] = [Heading(3, title, anchor=f"way-out-{model_anchor(model.name)}-{method.method}")]
    if found.search == "export":
        return blocks + _export_blocks(method)
    if found.search == "latency":
        return blocks + _folded_blocks(method, shipped_bytes)
    if model.quantized:
        blocks += _attributed(model, stack, method.method, found.search)
    tries = "quantizations" if found.keeps_float else "lowerings"
    if not method.culprits:
        why = NOT_FOUND.get(method.status, method.status)
        blocks.append(Paragraph(f"{mark('incomplete')} {why}: {method.reason or 'no reason recorded'} "
                                f"({method.lowerings} {tries} tried; [details](#{model_anchor(model.name)}))"))
        if method.reproducer:  # not pinned: the smallest program found to fail is the whole method
            folder = f"{found.record_dir}/{method.reproducer}"
            run = f"{python or 'python'} {folder}/repro.py"
            blocks.append(Paragraph(
                f"Reproducer, to hand upstream: {code_span(folder + '/')} (the whole method and its real inputs, the "
                f"smallest program found to fail; the stack's own packages only). Run from the report folder, "
                f"{code_span(run)} exits 1 as lowered (no remedy was found)."))
        if method.remedy_found_in:  # the program-wide lines another method's search found, tried here as written
            blocks += _carried_blocks(method, shipped_bytes)
        return blocks
    if found.keeps_float:
        skipped = found.stage("remedy")
        why = (skipped.reason or "") if skipped is not None and skipped.status == "skipped" else ""
        return blocks + _kept_float_blocks(method, shipped_bytes, why)
    failed_to_lower = method.rel_l2 is not None and math.isinf(method.rel_l2)
    combined = " together" if len(method.culprits) > 1 else ""
    items = []
    for culprit in method.culprits:
        alone = (f"; alone on the real tensors of its first call, rel. L2 {_rel_l2(culprit.rel_l2_alone)}"
                 if culprit.rel_l2_alone is not None else "")
        if culprit.fused_with:  # no one operator fails alone: the pair the delegate fuses does
            other = (f" (rel. L2 {_rel_l2(culprit.fused_with_alone)} alone)" if culprit.fused_with_alone is not None
                     else "")
            alone += (f"; with {code_span(culprit.fused_with)}{other}, the two alone as the delegate fuses them, "
                      f"rel. L2 {_rel_l2(culprit.fused_rel_l2)}")
        calls = [call.where() + (f" (keeping this call out alone takes {call.share:.1%} off)"
                                 if call.share is not None and len(culprit.calls) > 1 else "")
                 for call in culprit.calls]
        span = ("does not lower" if failed_to_lower else f"rel. L2 {_rel_l2(method.rel_l2)}") + \
            f" → {'rel. L2 ' if failed_to_lower else ''}{_rel_l2(culprit.rel_l2_without)}"
        kept = code_span(culprit.operator) if culprit.fused_with else "it"
        items.append(Item(f"**{code_span(culprit.named)}** ({culprit.backend}): keeping {kept} out takes "
                          f"{culprit.share:.1%} of the error off ({span}){alone}", calls))
    what = "fusion" if any(c.fused_with for c in method.culprits) else "operator"
    searched = (f" of {code_span(method.block)}, the first of the method's {method.blocks} blocks, lowered as a "
                "program of its own (lowered alone, it departs past its share of the method's threshold; a lowering "
                "of the whole method costs many times more)"
                if method.block else "")
    blocks += [Paragraph(f"The {what}{'s' if combined else ''} behind it{combined}, found in "
                         f"{method.lowerings} lowerings{searched}:"), Bullets(items)]
    if method.reproducer:
        folder = f"{found.record_dir}/{method.reproducer}"
        run = f"{python or 'python'} {folder}/repro.py"
        what = {"operator": "the operator alone on the real tensors that reached it",
                "fusion": "the two operators alone, as the delegate fuses them, on the real tensors that reached them",
                "block": f"{code_span(method.block) if method.block else 'a block of the method'} as a program of "
                         "its own, on the real tensors that reached it",
                }.get(method.reproducer_scope, f"the whole method and its real inputs ({method.reproducer_note})")
        issue = f", with {code_span(method.issue)}, the issue text to file (versions, CPU, what it printed here)" \
            if method.issue else ""
        blocks.append(Paragraph(
            f"Reproducer, to hand upstream: {code_span(folder + '/')} ({what}; the stack's own packages only, no "
            f"upgrade-gate){issue}. Run from the report folder, {code_span(run)} exits 1 as lowered, "
            f"{_with_remedy(method)}."
            + _ran_here(method)))
    if method.remedy_error:
        blocks += [Paragraph(f"The change that should avoid it {mark('FAILED')} does not work as written: "
                             f"{method.remedy_error}."), Code((method.remedy_code or "").splitlines())]
    elif method.remedy_code is not None:
        verdict = mark("passed") + " passes" if method.remedy_passes else mark("FAILED") + " still fails"
        measured = f"rel. L2 {_rel_l2(method.remedy_rel_l2)}" if method.remedy_rel_l2 is not None else "not measured"
        kind = f" ({method.remedy_kind})" if method.remedy_kind else ""
        blocks += [Paragraph(f"The change that avoids it{kind}, checked: the whole method lowered with these lines "
                             f"gives {measured} against eager — {verdict}; {_cost(method, shipped_bytes)}."),
                   Code(method.remedy_code.splitlines())]
    if len(method.remedies_tried) > 1 or method.remedies_not_tried:
        blocks += _tried_blocks(method, shipped_bytes)
    return blocks


def _attributed(model: ModelResults, stack: str, method: str, search: str) -> list[Block]:
    """A quantized variant's lowering weighed against its quantization (judge/attribution.py), said first: which
    of the two the search went after, and the figures that decided it."""
    export = model.stacks[stack].stage("export")
    if search == "quantized-lowering" and export is not None and not export.ok:
        return [Paragraph(f"{mark('FAILED')} **The quantized program does not lower**: {export.explain()}. The "
                          "operators behind it were searched on the quantized program, each kind kept out of the "
                          "delegate until it lowers and runs.")]
    found = model.attribution(stack, method)
    if found is None:
        return []
    if search == "quantized-lowering":
        return [Paragraph(f"{mark('FAILED')} **The lowering, not the quantization, departs**: {found.said()} (the "
                          f"lowering may add up to ×{found.factor:g} the quantization's error; docs/report.md). "
                          "The operators behind the lowering were searched first, on the quantized program.")]
    return [Paragraph(f"The quantization, not the lowering, departs: {found.said()}.")]


def _folded_blocks(method: MethodDiagnosis, shipped_bytes: int | None) -> list[Block]:
    """A latency search's finding: the batch norms the portable kernel runs that fold into the layer before them,
    and the lines that fold them before export, checked against eager (the latency gate judges it below)."""
    if not method.culprits:
        return [Paragraph(f"{mark('incomplete')} {NOT_FOUND.get(method.status, method.status)}: "
                          f"{method.reason or 'no reason recorded'}.")]
    culprit = method.culprits[0]
    modules = [call.module or "?" for call in culprit.calls]
    shown = ", ".join(code_span(m) for m in modules[:4]) + (f", … ({len(modules) - 4} more)"
                                                            if len(modules) > 4 else "")
    where = next((call.source for call in culprit.calls if call.source), "")
    blocks: list[Block] = [Paragraph(
        f"**{code_span(culprit.operator)}** ({culprit.backend}, {culprit.share:.1%} of the profiled time in portable "
        f"kernels): {len(modules)} batch norm(s) after a linear or a convolution, which folding would hand to the "
        f"delegate — {shown}" + (f"; at {where}" if where else "") + ".")]
    if method.remedy_error:
        return blocks + [Paragraph(f"The lines that fold them {mark('FAILED')} do not work as written: "
                                   f"{method.remedy_error}.")]
    verdict = mark("passed") + " passes" if method.remedy_passes else mark("FAILED") + " still fails"
    measured = f"rel. L2 {_rel_l2(method.remedy_rel_l2)}" if method.remedy_rel_l2 is not None else "not measured"
    return blocks + [
        Paragraph(f"The change that avoids it ({method.remedy_kind}), checked: the model exported and lowered with "
                  f"these lines gives {measured} against eager — {verdict}; {_cost(method, shipped_bytes)}."),
        Code((method.remedy_code or "").splitlines())]


def _carried_blocks(method: MethodDiagnosis, shipped_bytes: int | None) -> list[Block]:
    """A method the search did not answer, lowered with the remedy another method's search found (the lines act on
    the whole program): its own check, said as such."""
    if method.remedy_error:
        return [Paragraph(f"The change found for {code_span(method.remedy_found_in)} ({method.remedy_kind}), tried on "
                          f"this method as written, {mark('FAILED')} does not work here: {method.remedy_error}.")]
    verdict = mark("passed") + " passes" if method.remedy_passes else mark("FAILED") + " still fails"
    measured = f"rel. L2 {_rel_l2(method.remedy_rel_l2)}" if method.remedy_rel_l2 is not None else "not measured"
    return [Paragraph(f"The change found for {code_span(method.remedy_found_in)} ({method.remedy_kind}) acts on the "
                      f"whole program; tried on this method as written, checked: the whole method lowered with the "
                      f"same lines gives {measured} against eager — {verdict}; {_cost(method, shipped_bytes)}.")]


def _with_remedy(method: MethodDiagnosis) -> str:
    """What the reproducer's ``--with-remedy`` does, said only as far as the remedy was judged."""
    ran = dict((args, code) for args, code, _ in method.reproducer_runs).get("--with-remedy")
    if method.remedy_passes and method.reproducer_scope == "block" and ran == 1:
        return ("and 1 with `--with-remedy` too: the remedy below brings the whole method within its threshold, "
                "not the block within its share of it")
    if method.remedy_passes:
        return "0 with `--with-remedy`"
    if method.remedy_code is None or method.remedy_error:
        return "and `--with-remedy` lowers it with the remedy below, which was not checked to work"
    return "and 1 with `--with-remedy` too: the remedy below does not bring it within the threshold"


def _ran_here(method: MethodDiagnosis) -> str:
    """What the reproducer did when the phase ran it where it wrote it, as a check of what the line above says."""
    if not method.reproducer_runs:
        return ""
    said = "; ".join(f"`{('repro.py ' + args).strip()}` exit {code}{RUN_MEANS.get(args, '')}"
                     for args, code, _ in method.reproducer_runs)
    return f" Run here as written: {said}."


# What a reproducer's run with these arguments checks, where the arguments do not say it.
RUN_MEANS = {"--from-source": " (the method rebuilt from `program.py`, as a torch that cannot load `program.pt2` does)"}


def _tried_blocks(method: MethodDiagnosis, shipped_bytes: int | None) -> list[Block]:
    """Every remedy tried for the method, each lowered, saved, loaded and run as the artifact is: the one
    printed above is, of those that pass against eager, the one that costs least latency."""
    items = []
    for tried in method.remedies_tried:
        chosen = " — printed above" if tried.remedy == method.remedy_kind else ""
        if tried.error:
            items.append(Item(f"{mark('FAILED')} {tried.remedy}: {tried.error}{chosen}"))
            continue
        outcome = mark("passed") if tried.passes else mark("FAILED")
        r = tried.latency
        latency = (f", latency ×{r.median:.3f} [{r.low:.3f}, {r.high:.3f}]" if r is not None
                   else ", not timed" if not tried.passes else ", latency not measured")
        bytes_ = (f", size ×{tried.bytes / shipped_bytes:.3f}" if tried.bytes is not None and shipped_bytes else "")
        items.append(Item(f"{outcome} {tried.remedy}: rel. L2 {_rel_l2(tried.rel_l2)} against eager{latency}"
                          f"{bytes_}{chosen}"))
    items += [Item(f"not tried: {remedy} ({reason})") for remedy, reason in method.remedies_not_tried]
    options = len(method.remedies_tried) + len(method.remedies_not_tried)
    return [Paragraph(f"Remedies tried ({len(method.remedies_tried)} of {options}, expected cheapest first; each "
                      "lowered, saved, loaded and run as the artifact is; the one printed is, of those that pass, the "
                      "least latency against the shipped artifact):"),
            Bullets(items)]


def _kept_float_blocks(method: MethodDiagnosis, shipped_bytes: int | None, no_remedy: str) -> list[Block]:
    """A quantized variant's layers to leave in float, and the lines that do, checked (``no_remedy``: why
    none was lowered)."""
    units = (f"; the {method.layers} layers it quantizes ranked as {method.units} parent modules, what the budget "
             "allowed" if method.units < method.layers else "")
    after = method.culprits[0].rel_l2_without
    items = [Item(f"**{code_span(unit.operator)}**: quantized alone, SNR {_snr(unit.rel_l2_alone)}; "
                  f"{unit.share:.1%} of the quantization noise the layers add") for unit in method.culprits]
    blocks: list[Block] = [
        Paragraph(f"Left in float, {len(items)} of the {method.layers} layers the recipe quantizes "
                  f"{'bring' if len(items) > 1 else 'brings'} the variant within its gate, quantized in eager mode: "
                  f"SNR {_snr(method.rel_l2)} → {_snr(after)} "
                  f"against the float model (found in {method.lowerings} quantizations{units}):"),
        Bullets(items)]
    if method.remedy_error:
        return blocks + [Paragraph(f"The change that should leave them in float {mark('FAILED')} does not work as "
                                   f"written: {method.remedy_error}."), Code((method.remedy_code or "").splitlines())]
    if method.remedy_code is None and no_remedy:
        blocks.append(Paragraph(f"No remedy lowered: {no_remedy}."))
    if method.remedy_code is not None:
        verdict = mark("passed") + " passes" if method.remedy_passes else mark("FAILED") + " still fails"
        cosine = f", cosine {method.remedy_cosine:.5f}" if method.remedy_cosine is not None else ""
        blocks += [Paragraph(f"The change, checked: the method quantized with these lines, lowered, saved, loaded and "
                             f"run as the artifact is gives SNR {_snr(method.remedy_rel_l2)}{cosine} against the float "
                             f"model — {verdict}; {_cost(method, shipped_bytes)}."),
                   Code(method.remedy_code.splitlines())]
    return blocks


def _export_blocks(method: MethodDiagnosis) -> list[Block]:
    """A method that does not export as configured: each option of the export API tried, and the one that does."""
    tried = [Item(f"{mark('FAILED')} {attempt}") for attempt in method.export_tries]
    if method.export_option is None:
        return [Paragraph(f"{mark('incomplete')} No option of the export API exports it:"), Bullets(tried)]
    blocks: list[Block] = [Paragraph(f"It does not export as configured; `{method.export_option}` exports it "
                                     f"(options tried in order: {len(method.export_tries) + 1}):"),
                           Bullets([*tried, Item(f"{mark('passed')} {method.export_option}: exports, lowers, runs")])]
    if method.assumed:
        blocks.append(Paragraph(f"{mark('FAILED')} It specialized {len(method.assumed)} data-dependent decision(s) to "
                                "the example inputs, so the program is right only for inputs that decide them the "
                                "same way (rewrite the branch with `torch.cond`, or assert it with `torch._check`, "
                                "to export it whole):"))
        blocks.append(Bullets([Item(a) for a in method.assumed]))
    if method.remedy_error:
        return blocks + [Paragraph(f"The program it makes {mark('FAILED')} does not run as an artifact: "
                                   f"{method.remedy_error}."), Code((method.remedy_code or "").splitlines())]
    if method.remedy_code is not None:
        verdict = mark("passed") + " passes" if method.remedy_passes else mark("FAILED") + " still fails"
        untimed = method.latency_note or "no artifact shipped"
        blocks += [Paragraph(f"The change, checked: the method exported with this line, lowered, saved, loaded and run "
                             f"as an artifact is gives rel. L2 {_rel_l2(method.remedy_rel_l2)} against eager on the "
                             f"example inputs — {verdict}; not timed ({untimed})."),
                   Code(method.remedy_code.splitlines())]
    return blocks


def _snr(rel_l2: float | None) -> str:
    """A relative L2 error as the quantized gate writes it: SNR = −20·log10(rel. L2)."""
    if rel_l2 is None:
        return "?"
    return "∞ dB" if rel_l2 <= 0 else f"{-20 * math.log10(rel_l2):.1f} dB"


def _cost(method: MethodDiagnosis, shipped_bytes: int | None) -> str:
    """The remedied artifact against the shipped one: latency (calls of both in turns, one process) and size."""
    parts = []
    if method.latency is not None:
        r = method.latency
        threads = f", {method.latency_threads} thread(s)" if method.latency_threads else ""
        parts.append(f"latency ×{r.median:.3f} [{r.low:.3f}, {r.high:.3f}] ({r.level:.0%} interval over "
                     f"{len(r.per_round)} rounds of calls of both in turns{threads})")
    elif method.latency_note:
        parts.append(f"latency not measured ({method.latency_note})")
    if method.remedy_bytes is not None:
        ratio = f" (×{method.remedy_bytes / shipped_bytes:.3f})" if shipped_bytes else ""
        parts.append(f"size {size(method.remedy_bytes)}{ratio}")
    return "against the shipped artifact: " + ", ".join(parts) if parts else "its cost was not measured"


def _rel_l2(value: float | None) -> str:
    """As the numerics gate writes it."""
    return Unit.REL_L2.show(value) if value is not None else "?"
