"""One model's section of the report: its export, numerics, task agreement, latency, memory, delegation,
other backends, profile and where a failed export breaks."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from upgrade_gate.config.catalog import FP32
from upgrade_gate.report import _figures
from upgrade_gate.report._verdict_section import gate_table, model_anchor
from upgrade_gate.report.render import (
    Block,
    Bullets,
    Code,
    Figure,
    Heading,
    Item,
    Paragraph,
    Table,
    anchor_id,
    bullets,
    code_span,
)
from upgrade_gate.schema.comparison import HEADLINE, Side
from upgrade_gate.schema.results import ModelResults, Results
from upgrade_gate.schema.verdict import GateStatus
from upgrade_gate.stages import RUNTIME_STAGES
from upgrade_gate.text import first_line, ms, num, plain, short, size, speed_against

NUMERIC_GATES = ("numerics", "quantized-numerics")
PROFILE_TOP = 10


def model_blocks(results: Results, model: ModelResults, out: Path) -> list[Block]:
    """The model's gates, stages, numerics, latency, memory and what explains them; its fp32 section, every variant."""
    names = list(model.stacks)
    blocks: list[Block] = [Heading(3, model.name, anchor=model_anchor(model.name)), Paragraph(model.description)]
    gates = results.gates_of(model.name)
    if gates:
        blocks.append(gate_table(gates, with_model=False))
    for gate in gates:
        if gate.gate in NUMERIC_GATES and gate.status is GateStatus.FAILED:
            blocks.append(Figure(anchor_id(f"error-{gate.stack}-{model.name}-{gate.gate}"),
                                 f"Error of {gate.stack}'s worst output ({gate.gate} failed: {gate.measured_text})",
                                 _figures.drawing("error_histogram", results, out, model, gate)))
    family = results.family(model)
    if not model.quantized and len(family) > 1:
        blocks += variants_blocks(results, family)
    stage_names = list(dict.fromkeys(s.stage for stack in model.stacks.values() for s in stack.stages))
    rows = []
    for stage in stage_names:
        row = [stage]
        for n in names:
            s = model.stacks[n].stage(stage)
            row.append("—" if s is None else (f"ok {s.duration_s:.2f} s" if s.ok else f"**{s.status}**"))
        rows.append(row)
    blocks += [Paragraph("Stages:"), Table(["Stage", *names], rows)]
    reused = [f"{n} {' and '.join(model.stacks[n].reused_phases())}" for n in names if model.stacks[n].reused_phases()]
    if reused:
        blocks.append(Paragraph(f"Reused from the result cache (same key: stack, model code, weights, inputs, tool): "
                                f"{'; '.join(reused)}. `--fresh` runs them again."))
    blocks += numerics_blocks(model)
    blocks += generated_text_blocks(results, model)
    blocks += latency_blocks(results, model)
    blocks += memory_blocks(model)
    blocks += delegation_blocks(model)
    blocks += backends_blocks(model)
    blocks += profile_blocks(model)
    blocks += localization_blocks(model)
    for n in names:
        stack = model.stacks[n]
        for s in stack.stages:
            if s.error:
                # The end of the worker's log: its traceback, or the Python stack it was in when it was
                # stopped (a deadline) or crashed (faulthandler writes it there).
                tail = list(s.error.traceback_tail) or [f"(nothing: see {stack.record_dir}/{_phase_of(s.stage)}.log)"]
                blocks += [Paragraph(f"**{n}: {s.explain()}**"), Code(tail)]
        details = _export_lines(n, stack.export_details)
        if stack.program:
            file, count, methods = stack.program
            details.append(f"{n} multi-method artifact: {file}, {size(count)}, methods {', '.join(methods)}")
        if details:
            blocks.append(bullets(*details))
    return blocks


# What the export stage records per method that other sections show already (delegation, planned memory).
SHOWN_ELSEWHERE = frozenset({"delegate", "delegate_partitions", "delegated_nodes", "portable_nodes", "portable_ops",
                             "by_operator", "planned_memory_bytes", "planned_buffers_bytes"})


def _export_lines(stack: str, details: Mapping[str, object]) -> list[str]:
    """The export stage's facts the other sections do not show, as words (not Python's repr of the record)."""
    lines = []
    methods = details.get("methods")
    for method, facts in (methods.items() if isinstance(methods, Mapping) else ()):
        own = {k: v for k, v in facts.items() if k not in SHOWN_ELSEWHERE} if isinstance(facts, Mapping) else {}
        if own:
            lines.append(f"{stack} export of {method}: {short(plain(own))}")
    rest = {k: v for k, v in details.items() if k != "methods"}
    if rest:
        lines.append(f"{stack} export: {short(plain(rest))}")
    return lines


def _phase_of(stage: str) -> str:
    return "runtime" if stage in RUNTIME_STAGES else "export"


def numerics_blocks(model: ModelResults) -> list[Block]:
    rows = []
    for c in model.comparisons:
        if c.outputs is None:
            rows.append([c.purpose, c.label, "—", *["" for _ in range(7)], c.missing or ""])
            continue
        for o in c.outputs:
            note = ("shape mismatch" if not o.shape_match else "NaN/Inf") if not o.comparable else (
                f"degenerate reference ({o.degenerate_reference})" if o.degenerate_reference else "")
            rows.append([c.purpose, c.label, o.name, num(o.max_abs), num(o.mean_abs), num(o.max_rel), num(o.rel_l2),
                         num(o.snr_db, "{:.1f}"), num(o.cosine, "{:.8f}"), num(o.min_atol), note])
    blocks: list[Block] = [Paragraph("Numerics:"), Table(
        ["Purpose", "Comparison", "Output", "max abs", "mean abs", "max rel", "rel L2", "SNR dB", "cosine", "min atol",
         "note"], rows)]
    # Said once per output, not per row: every comparison of it reads the same part.
    partial = {o.name: o.read_note for c in model.comparisons for o in c.outputs or () if o.read_note}
    if partial:
        blocks.append(Paragraph("Outputs compared in part: " + "; ".join(
            f"{code_span(name)} {note}" for name, note in partial.items()) + "."))
    task_rows = [[c.purpose, c.label, _task_cell(c)] for c in model.comparisons if c.task or c.task_missing]
    if task_rows:
        blocks += [Paragraph(f"Task agreement ({model.task_kind}):"),
                   Table(["Purpose", "Comparison", "Agreement"], task_rows)]
    return blocks


def _task_cell(comparison: object) -> str:
    task = getattr(comparison, "task", None)
    if task is None:
        return getattr(comparison, "task_missing", None) or "—"
    return ", ".join(f"{k} {short(plain(v))}" for k, v in task.values.items())


def generated_text_blocks(results: Results, model: ModelResults) -> list[Block]:
    """What each side answered, prompt by prompt: the reference's eager text, then every artifact's."""
    base = results.baseline.name
    sides = [(f"{base} eager (reference)", model.stacks[base].generated("eager"))]
    sides += [(f"{n} artifact", model.stacks[n].generated("artifact")) for n in model.stacks]
    answers = [(label, found) for label, found in sides if found is not None]
    if not answers:
        return []
    prompts = next((found.prompts for _, found in answers if found.prompts), ())
    items = []
    for i in range(max(len(found.text) for _, found in answers)):
        items.append(Item(f"prompt {i + 1}" + (f": “{prompts[i]}”" if i < len(prompts) else ""), [
            f"{label}: “{' '.join(found.text[i].split()) if i < len(found.text) else '—'}”"
            for label, found in answers]))
    return [Paragraph("Generated text (greedy):"), Bullets(items)]


def variants_blocks(results: Results, family: list[ModelResults]) -> list[Block]:
    """fp32 and every quantized variant, per stack, against the fp32 reference, at the first thread count."""
    threads = results.settings.threads[0]
    reference = Side(stack=results.baseline.name, kind="eager")
    rows = []
    for n in family[0].stacks:
        fp32_p50 = family[0].stacks[n].measured[threads].p50_sum_ms
        for unit in family:
            stack = unit.stacks[n]
            if stack.skipped_variant:
                rows.append([n, unit.variant, f"no {unit.variant} recipe in this stack", *[""] * 7])
                continue
            problem = stack.first_problem()
            artifact = Side(stack=n, kind="artifact")
            comparison = unit.comparison(artifact, reference) or unit.comparison(artifact, Side(stack=n, kind="eager"))
            outputs = comparison.comparable_outputs if comparison else ()
            snr = min((o.snr_db for o in outputs if o.snr_db is not None), default=None)
            cosine = min((o.cosine for o in outputs if o.cosine is not None), default=None)
            task = comparison.task.headline if comparison and comparison.task else None
            p50 = stack.measured[threads].p50_sum_ms
            speed = f" ({speed_against(p50, fp32_p50, FP32)})" if p50 and fp32_p50 and unit.quantized else ""
            coverage = stack.delegation
            rows.append([n, unit.variant, "ok" if problem is None else f"**{problem.explain()}**", stack.recipe or "",
                         num(snr, "{:.1f}"), num(cosine, "{:.5f}"), num(task, "{:.3f}"),
                         f"{p50:.3f} ms{speed}" if p50 else "—", size(stack.artifact_bytes),
                         f"{min(d.share for d in coverage.values()):.1%}" if coverage else "—"])
    key = HEADLINE.get(family[0].task_kind, ("task", ""))[0].replace("_", " ")
    return [Paragraph(f"Variants, each against the fp32 reference ({reference}); latency: p50 of every method summed "
                      f"at {threads} thread(s):"),
            Table(["Stack", "variant", "status", "recipe", "SNR dB (worst output)", "cosine (worst)", key, "latency",
                   "artifact", "delegated"], rows)]


def latency_blocks(results: Results, model: ModelResults) -> list[Block]:
    """Per thread count: every method's distribution in every stack, and the candidate's ratio to the baseline."""
    base = results.baseline.name
    blocks: list[Block] = []
    for threads in results.settings.threads:
        rows = []
        methods = list(dict.fromkeys(m for stack in model.stacks.values() for m in stack.measured[threads].latency))
        for method in methods:
            baseline = model.stacks[base].measured[threads].latency.get(method)
            for n, stack in model.stacks.items():
                measured = stack.measured[threads]
                lat = measured.latency.get(method)
                if lat is None:
                    continue
                estimate = model.ratio(n, threads, method)
                unjudged = estimate is not None and model.busy_at(threads) is not None
                if unjudged:  # made of the few quiet rounds a busy machine left: no ratio, no interval
                    estimate = None
                rate = f"{lat.per_second:.1f} FPS" if measured.image_input else f"{lat.per_second:.1f}/s"
                winner = "" if estimate is None or baseline is None else (
                    n if lat.p50_ms < baseline.p50_ms and estimate.high < 1 else
                    base if lat.p50_ms > baseline.p50_ms and estimate.low > 1 else "tie (within noise)")
                rows.append([method, n, str(lat.runs), ms(lat.min_ms), ms(lat.p50_ms), ms(lat.p90_ms), ms(lat.p99_ms),
                             ms(lat.trimmed_mean_ms), ms(lat.iqr_ms), rate,
                             str(estimate) if estimate else "— (machine busy)" if unjudged else "", winner])
        machine = model.contention.get(threads)
        estimates = [r.estimate for r in model.ratios if r.threads == threads]
        if rows:
            shared = (f"; the latency gate's {machine.intervals} intervals share its coverage, each at "
                      f"{estimates[0].confidence:.2%}" if machine is not None and machine.intervals > 1 and estimates
                      else "")
            # The rounds the ratios are made of: fewer than `rounds` when they stopped early, more when they went on.
            counted = f"{len(estimates[0].per_round)} quiet" if estimates else str(results.settings.rounds)
            blocks += [Paragraph(f"Latency at {threads} thread(s), {counted} rounds, the stacks in "
                                 "turn (ratio: candidate/baseline, the median of the per-round ratios, with its "
                                 f"interval and that interval's coverage{shared}):"),
                       Table(["method", "Stack", "runs", "min", "p50", "p90", "p99", "trimmed mean", "IQR", "rate",
                              "ratio, interval", "faster"], rows)]
        if machine is not None:
            blocks.append(Paragraph(f"The machine during these rounds ({machine.cpu}, {machine.cores} cores; "
                                    f"measurements are cached per CPU model and core count): {machine.summary()}."))
    return blocks


def memory_blocks(model: ModelResults) -> list[Block]:
    rows = []
    for n, stack in model.stacks.items():
        planned = stack.planned_memory_bytes
        for threads, m in stack.measured.items():
            rows.append([n, str(threads), ms(m.load_ms), ms(m.first_run_ms), size(m.runtime_memory_bytes),
                         size(m.peak_rss_bytes), size(m.idle_rss_bytes),
                         " / ".join(size(v) for v in planned.values()) if planned else "— (no plan)",
                         size(stack.export_peak_rss_bytes), size(stack.artifact_bytes)])
    blocks: list[Block] = [
        Paragraph("Cold start (a fresh process: load every method, then call each once) and memory:"),
        Table(["Stack", "threads", "load", "first run", "runtime memory", "peak RSS", "runtime started",
               "planned memory", "export peak RSS", "artifact"], rows)]
    unmeasured = [f"not measured: {n} at {t} thread(s): {m.status}" + (f" — {m.problem}" if m.problem else "")
                  for n, stack in model.stacks.items() for t, m in stack.measured.items() if m.status != "ok"]
    return blocks + ([bullets(*unmeasured)] if unmeasured else [])


def delegation_blocks(model: ModelResults) -> list[Block]:
    """Per candidate method: nodes inside delegate partitions, and the operators left to portable kernels."""
    lines = []
    for n, stack in model.stacks.items():
        for method, d in stack.delegation.items():
            where = "" if method == "forward" else f" {method}:"
            left = f"; not delegated: {d.portable_summary()}" if d.portable_ops else "; every operator delegated"
            lines.append(f"{n}{where} {d.delegate} took {d.delegated_nodes} of {d.delegated_nodes + d.portable_nodes} "
                         f"operator nodes ({d.share:.1%}) in {d.partitions} partition(s){left}")
    if not lines:
        return []
    return [Paragraph("Delegation (ExecuTorch's get_delegation_info; what is not delegated runs on portable kernels):"),
            bullets(*lines)]


def backends_blocks(model: ModelResults) -> list[Block]:
    """Each stack's other backends, export only: which lowered every method, how much they took, why not."""
    rows = []
    for n, stack in model.stacks.items():
        for backend, methods in stack.other_backends.items():
            statuses = [m.status for m in methods.values()]
            lowered = [m for m in methods.values() if m.status == "ok"]
            status = statuses[0] if len(set(statuses)) == 1 else f"{len(lowered)}/{len(methods)} methods ok"
            delegated = sum(m.delegated_nodes for m in lowered)
            total = delegated + sum(m.portable_nodes for m in lowered)
            why = next((m.why for m in methods.values() if m.status != "ok"), "")
            rows.append([n, backend, status, str(sum(m.partitions for m in lowered)) if lowered else "",
                         f"{delegated / total:.1%}" if total else "", size(sum(m.bytes for m in lowered)),
                         f"{sum(m.seconds for m in methods.values()):.1f} s" if lowered else "", short(why)])
    if not rows:
        return []
    return [Paragraph("Other backends, export only (lowered on this machine, not run):"),
            Table(["Stack", "backend", "status", "partitions", "delegated", ".pte", "lowering", "why not"], rows)]


def profile_blocks(model: ModelResults) -> list[Block]:
    """The top operators by time, every stack side by side, per method."""
    profiles = {n: stack.profile for n, stack in model.stacks.items() if stack.profile}
    if not profiles:
        return []
    names = list(profiles)
    blocks: list[Block] = []
    for method in dict.fromkeys(m for p in profiles.values() for m in p):
        columns = [profiles[n].get(method, [])[:PROFILE_TOP] for n in names]
        rows = []
        for rank in range(max(len(c) for c in columns)):
            row = [str(rank + 1)]
            for column in columns:
                op = column[rank] if rank < len(column) else None
                row += ([code_span(op.name), f"{op.total_ms:.3f} ms", f"{op.share:.1%}", str(op.calls)] if op
                        else [""] * 4)
            rows.append(row)
        where = "" if method == "forward" else f" — {method}"
        blocks += [Paragraph(f"Top operators by time{where} (per-operator profile in the runtime phase, averaged over "
                             "its calls):"),
                   Table(["#"] + [f"{n} {h}" for n in names for h in ("operator", "ms per call", "share",
                                                                       "calls per call")], rows)]
    return blocks


# A localization's reproducer by what it runs: what the report calls it, and what its Python needs.
REPRODUCER_OF = {"quantize": ("the recipe on", "torch and executorch only"),
                 "lowering": ("the lowering of", "torch and executorch only"),
                 "export": ("the export of", "torch and the packages the model imports")}


def localization_blocks(model: ModelResults) -> list[Block]:
    blocks: list[Block] = []
    for n, stack in model.stacks.items():
        found = stack.localized
        if found is None:
            continue
        tried = f"{found.attempts} submodules tried alone in {found.seconds:.1f} s"
        if not found.complete:
            tried += f", stopped at the {found.budget_s:g} s budget (localize-budget)"
        what = "the quantization" if found.attempt == "quantize" else "the export"
        if found.attempt == "quantize" and not found.attempts:
            tried = "the modules that hold its weights, by class"
        lines = []
        for culprit in found.culprits:
            op = f", operator {code_span(culprit.operator)}" if culprit.operator else ""
            also = f" (the same in {', '.join(culprit.same_failure_in)})" if culprit.same_failure_in else ""
            where = f" — at {culprit.source}" if culprit.source else ""
            lines.append(f"{code_span(culprit.module)} ({culprit.class_name}){op}: {culprit.error_type}: "
                         f"{first_line(culprit.message)}{also}{where}")
        blocks += [Paragraph(f"**{n}: where {what} of {found.method} breaks** ({tried}):"), bullets(*lines)]
        if found.reproducer is not None:
            ran = "; ".join(f"exit {code}: {said}" for _, code, said in found.reproducer_runs) or "not run"
            what, needs = REPRODUCER_OF[found.reproducer_of]
            blocks.append(Paragraph(f"Reproducer, {what} the first of them alone ({needs}): "
                                    f"{code_span(f'{stack.record_dir}/{found.reproducer}/repro.py')} — {ran}"))
        elif found.reproducer_problem:
            blocks.append(Paragraph(f"No reproducer: {found.reproducer_problem}"))
    return blocks
