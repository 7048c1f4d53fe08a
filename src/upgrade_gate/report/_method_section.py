"""One method's way out: the operators behind its departure, the reproducer to hand upstream, and the change
that avoids it with what it costs; or, for another search, what it found instead."""

from __future__ import annotations

import math
from dataclasses import dataclass

from upgrade_gate.report._verdict_section import model_anchor
from upgrade_gate.report.render import Block, Bullets, Code, Heading, Item, Paragraph, code_span, mark
from upgrade_gate.schema.diagnosis import Diagnosis, MethodDiagnosis
from upgrade_gate.schema.results import ModelResults
from upgrade_gate.schema.verdict import Unit
from upgrade_gate.text import size

NOT_FOUND = {
    "not pinned": "not pinned to operators",
    "spread": "no remedy: spread over the model",
    "stopped at budget": "stopped at the budget: nothing claimed",
    "does not reproduce": "does not reproduce when lowered again",
    "not searched": "not searched",
}


def method_blocks(model: ModelResults, stack: str, found: Diagnosis, method: MethodDiagnosis,
                  python: str | None, shipped_bytes: int | None) -> list[Block]:
    title = f"{code_span(model.name)} · {code_span(method.method)} in {stack}"
    blocks: list[Block] = [Heading(3, title, anchor=f"way-out-{model_anchor(model.name)}-{method.method}")]
    if found.search in OPTIONS:
        return blocks + _option_blocks(method, OPTIONS[found.search])
    if found.search == "latency":
        return blocks + _folded_blocks(method, shipped_bytes)
    if model.quantized:
        blocks += _attributed(model, stack, method.method, found.search)
    if not method.culprits:
        return blocks + _not_found_blocks(model, found, method, python, shipped_bytes)
    if found.keeps_float:
        skipped = found.stage("remedy")
        why = (skipped.reason or "") if skipped is not None and skipped.status == "skipped" else ""
        return blocks + _kept_float_blocks(found, method, python, shipped_bytes, why)
    blocks += _load_failure_blocks(found, method) if found.search == "load" else _culprit_blocks(method)
    if method.reproducer:
        blocks.append(_reproducer(found, method, python))
    if method.remedy_error:
        blocks += [Paragraph(f"The change that should avoid it {mark('FAILED')} does not work as written: "
                             f"{method.remedy_error}."), Code((method.remedy_code or "").splitlines())]
    elif method.remedy_code is not None:
        verdict = mark("passed") + " passes" if method.remedy_passes else mark("FAILED") + " still fails"
        measured = (f"rel. L2 {rel_l2_text(method.remedy_rel_l2)}" if method.remedy_rel_l2 is not None
                    else "not measured")
        kind = f" ({method.remedy_kind})" if method.remedy_kind else ""
        blocks += [Paragraph(f"The change that avoids it{kind}, checked: the whole method lowered with these lines "
                             f"gives {measured} against eager — {verdict}; {_cost(method, shipped_bytes)}."),
                   Code(method.remedy_code.splitlines())]
    if len(method.remedies_tried) > 1 or method.remedies_not_tried:
        blocks += _tried_blocks(method, shipped_bytes)
    return blocks


def _culprit_blocks(method: MethodDiagnosis) -> list[Block]:
    """The operators (or fusions) behind a departure, and how many lowerings found them."""
    combined = " together" if len(method.culprits) > 1 else ""
    what = "fusion" if any(c.fused_with for c in method.culprits) else "operator"
    searched = (f" of {code_span(method.block)}, the first of the method's {method.blocks} blocks, lowered as a "
                "program of its own (lowered alone, it departs past its share of the method's threshold; a lowering "
                "of the whole method costs many times more)"
                if method.block else "")
    return [Paragraph(f"The {what}{'s' if combined else ''} behind it{combined}, found in "
                      f"{method.lowerings} lowerings{searched}:"), Bullets(_culprit_items(method))]


def _load_failure_blocks(found: Diagnosis, method: MethodDiagnosis) -> list[Block]:
    """A program that lowers and fails when the runtime loads (or runs) it: the runtime's own words, and the calls of
    the operator they name, each with how its inputs' quantization departs from what the backend takes."""
    items = [Item(f"**{code_span(culprit.operator)}** ({culprit.backend}): {call.where()}",
                  [code_span(departs) for departs in call.inputs])
             for culprit in method.culprits for call in culprit.calls]
    return [Paragraph(f"{mark('FAILED')} **It lowers and does not {found.failed_at}**: {method.reason}. The node "
                      "the runtime named, matched to the calls of the program that make it:"), Bullets(items)]


def _not_found_blocks(model: ModelResults, found: Diagnosis, method: MethodDiagnosis, python: str | None,
                      shipped_bytes: int | None) -> list[Block]:
    """A search that pinned no operator: why, the whole method as its reproducer, another method's lines tried."""
    tries = "quantizations" if found.keeps_float else "lowerings"
    why = NOT_FOUND.get(method.status, method.status)
    blocks: list[Block] = [Paragraph(f"{mark('incomplete')} {why}: {method.reason or 'no reason recorded'} "
                                     f"({method.lowerings} {tries} tried; [details](#{model_anchor(model.name)}))")]
    if found.keeps_float:
        blocks += _quantized_reproducer(found, method, python)
    elif method.reproducer:  # not pinned: the smallest program found to fail is the whole method
        folder = f"{found.record_dir}/{method.reproducer}"
        run = f"{python or 'python'} {folder}/repro.py"
        blocks.append(Paragraph(
            f"Reproducer, to hand upstream: {code_span(folder + '/')} (the whole method and its real inputs, the "
            f"smallest program found to fail; the stack's own packages only). Run from the report folder, "
            f"{code_span(run)} exits 1 as lowered (no remedy was found)."))
    if method.remedy_found_in:  # the program-wide lines another method's search found, tried here as written
        blocks += _carried_blocks(method, shipped_bytes)
    return blocks


def _culprit_items(method: MethodDiagnosis) -> list[Item]:
    """Each operator (or fused pair) behind the departure: what keeping it out takes off, and where it is called."""
    failed_to_lower = method.rel_l2 is not None and math.isinf(method.rel_l2)
    items = []
    for culprit in method.culprits:
        alone = (f"; alone on the real tensors of its first call, rel. L2 {rel_l2_text(culprit.rel_l2_alone)}"
                 if culprit.rel_l2_alone is not None else "")
        if culprit.fused_with:  # no one operator fails alone: the pair the delegate fuses does
            other = (f" (rel. L2 {rel_l2_text(culprit.fused_with_alone)} alone)"
                     if culprit.fused_with_alone is not None else "")
            alone += (f"; with {code_span(culprit.fused_with)}{other}, the two alone as the delegate fuses them, "
                      f"rel. L2 {rel_l2_text(culprit.fused_rel_l2)}")
        calls = [call.where() + (f" (keeping this call out alone takes {call.share:.1%} off)"
                                 if call.share is not None and len(culprit.calls) > 1 else "")
                 for call in culprit.calls]
        span = ("does not lower" if failed_to_lower else f"rel. L2 {rel_l2_text(method.rel_l2)}") + \
            f" → {'rel. L2 ' if failed_to_lower else ''}{rel_l2_text(culprit.rel_l2_without)}"
        kept = code_span(culprit.operator) if culprit.fused_with else "it"
        items.append(Item(f"**{code_span(culprit.named)}** ({culprit.backend}): keeping {kept} out takes "
                          f"{culprit.share:.1%} of the error off ({span}){alone}", calls))
    return items


def _reproducer(found: Diagnosis, method: MethodDiagnosis, python: str | None) -> Paragraph:
    """The pinned reproducer: what it holds, the issue text beside it, and how it runs."""
    folder = f"{found.record_dir}/{method.reproducer}"
    run = f"{python or 'python'} {folder}/repro.py"
    what = {"operator": "the operator alone on the real tensors that reached it",
            "fusion": "the two operators alone, as the delegate fuses them, on the real tensors that reached them",
            "block": f"{code_span(method.block) if method.block else 'a block of the method'} as a program of "
                     "its own, on the real tensors that reached it",
            }.get(method.reproducer_scope, f"the whole method and its real inputs ({method.reproducer_note})")
    issue = f", with {code_span(method.issue)}, the issue text to file (versions, CPU, what it printed here)" \
        if method.issue else ""
    return Paragraph(
        f"Reproducer, to hand upstream: {code_span(folder + '/')} ({what}; the stack's own packages only, no "
        f"upgrade-gate){issue}. Run from the report folder, {code_span(run)} exits 1 as lowered, "
        f"{_with_remedy(method)}." + _ran_here(method))


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
    measured = f"rel. L2 {rel_l2_text(method.remedy_rel_l2)}" if method.remedy_rel_l2 is not None else "not measured"
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
    measured = f"rel. L2 {rel_l2_text(method.remedy_rel_l2)}" if method.remedy_rel_l2 is not None else "not measured"
    return [Paragraph(f"The change found for {code_span(method.remedy_found_in)} ({method.remedy_kind}) acts on the "
                      f"whole program; tried on this method as written, checked: the whole method lowered with the "
                      f"same lines gives {measured} against eager — {verdict}; {_cost(method, shipped_bytes)}.")]


def _quantized_reproducer(found: Diagnosis, method: MethodDiagnosis, python: str | None) -> list[Block]:
    """A kept-float search's reproducer, for the team rather than upstream (rounding is the recipe's choice): the
    float program quantized by the export script's lines, measured by the gate; or why there is none."""
    if not method.reproducer:
        return [Paragraph(f"No reproducer: {method.reproducer_note}.")] if method.reproducer_note else []
    folder = f"{found.record_dir}/{method.reproducer}"
    run = f"{python or 'python'} {folder}/repro.py"
    with_remedy = ("0 with `--with-remedy` (the layers above left in float)" if method.status == "found" else
                   f"and `--with-remedy` leaves in float what the search last held there, which does not make a "
                   f"remedy ({method.status})")
    return [Paragraph(
        f"Reproducer, to hand on: {code_span(folder + '/')} (the float program as the recipe captures it, its real "
        "inputs and the float model's outputs on them, quantized by the export script's own lines; the stack's own "
        f"packages only, no upgrade-gate). Run from the report folder, {code_span(run)} exits 1 while the variant is "
        f"below its gate, {with_remedy}." + _ran_here(method))]


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
        items.append(Item(f"{outcome} {tried.remedy}: rel. L2 {rel_l2_text(tried.rel_l2)} against eager{latency}"
                          f"{bytes_}{chosen}"))
    items += [Item(f"not tried: {remedy} ({reason})") for remedy, reason in method.remedies_not_tried]
    options = len(method.remedies_tried) + len(method.remedies_not_tried)
    return [Paragraph(f"Remedies tried ({len(method.remedies_tried)} of {options}, expected cheapest first; each "
                      "lowered, saved, loaded and run as the artifact is; the one printed is, of those that pass, the "
                      "least latency against the shipped artifact):"),
            Bullets(items)]


def _kept_float_blocks(found: Diagnosis, method: MethodDiagnosis, python: str | None, shipped_bytes: int | None,
                       no_remedy: str) -> list[Block]:
    """A quantized variant's layers to leave in float, and the lines that do, checked (``no_remedy``: why
    none was lowered)."""
    units = (f"; the {method.layers} layers it quantizes ranked as {method.units} parent modules, what the budget "
             "allowed" if method.units < method.layers else "")
    after = method.culprits[0].rel_l2_without
    items = [Item(f"**{code_span(unit.operator)}**: quantized alone, SNR {snr_text(unit.rel_l2_alone)}; "
                  f"{unit.share:.1%} of the quantization noise the layers add") for unit in method.culprits]
    blocks: list[Block] = [
        Paragraph(f"Left in float, {len(items)} of the {method.layers} layers the recipe quantizes "
                  f"{'bring' if len(items) > 1 else 'brings'} the variant within its gate, quantized in eager mode: "
                  f"SNR {snr_text(method.rel_l2)} → {snr_text(after)} "
                  f"against the float model (found in {method.lowerings} quantizations{units}):"),
        Bullets(items)]
    blocks += _quantized_reproducer(found, method, python)
    if method.remedy_error:
        return blocks + [Paragraph(f"The change that should leave them in float {mark('FAILED')} does not work as "
                                   f"written: {method.remedy_error}."), Code((method.remedy_code or "").splitlines())]
    if method.remedy_code is None and no_remedy:
        blocks.append(Paragraph(f"No remedy lowered: {no_remedy}."))
    if method.remedy_code is not None:
        verdict = mark("passed") + " passes" if method.remedy_passes else mark("FAILED") + " still fails"
        cosine = f", cosine {method.remedy_cosine:.5f}" if method.remedy_cosine is not None else ""
        blocks += [Paragraph(f"The change, checked: the method quantized with these lines, lowered, saved, loaded and "
                             f"run as the artifact is gives SNR {snr_text(method.remedy_rel_l2)}{cosine} against the "
                             f"float model — {verdict}; {_cost(method, shipped_bytes)}."),
                   Code(method.remedy_code.splitlines())]
    return blocks


@dataclass(frozen=True)
class Options:
    """How a search that tries a step's options in order says them (a failed export's, a failed quantization's)."""

    step: str  # "export"
    options: str  # "option of the export API"
    verb: str  # "exports"
    checked: str  # how the remedy's lines made the program
    against: str  # what its outputs are measured against, and by what


OPTIONS = {
    "export": Options("export", "option of the export API", "exports",
                      "exported with this line, lowered", "against eager on the example inputs"),
    "quantize": Options("quantize", "capture option", "quantizes",
                        "captured with these lines, quantized by the recipe, lowered",
                        "against the float model, as the quantized gates measure it"),
}


def _option_blocks(method: MethodDiagnosis, said: Options) -> list[Block]:
    """A method whose step fails as configured: each option tried, and the one that makes a program that lowers."""
    tried = [Item(f"{mark('FAILED')} {attempt}") for attempt in method.export_tries]
    if method.export_option is None:
        return [Paragraph(f"{mark('incomplete')} No {said.options} {said.verb} it:"), Bullets(tried)]
    blocks: list[Block] = [Paragraph(f"It does not {said.step} as configured; `{method.export_option}` {said.verb} "
                                     f"it (options tried in order: {len(method.export_tries) + 1}):"),
                           Bullets([*tried, Item(f"{mark('passed')} {method.export_option}: {said.verb}, lowers, "
                                                 "runs")])]
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
        measured = (f"SNR {snr_text(method.remedy_rel_l2)}" if said.step == "quantize"
                    else f"rel. L2 {rel_l2_text(method.remedy_rel_l2)}")
        untimed = method.latency_note or "no artifact shipped"
        blocks += [Paragraph(f"The change, checked: the method {said.checked}, saved, loaded and run as an artifact "
                             f"is gives {measured} {said.against} — {verdict}; not timed ({untimed})."),
                   Code(method.remedy_code.splitlines())]
    return blocks


def snr_text(rel_l2: float | None) -> str:
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


def rel_l2_text(value: float | None) -> str:
    """As the numerics gate writes it."""
    return Unit.REL_L2.show(value) if value is not None else "?"
