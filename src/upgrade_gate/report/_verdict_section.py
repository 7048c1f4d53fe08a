"""The report's top: each candidate's verdict, the gates that did not pass, the latency table and where it
was measured."""

from __future__ import annotations

from upgrade_gate.invocation import command
from upgrade_gate.report.render import Block, Heading, Paragraph, Table, anchor_id, bullets
from upgrade_gate.schema.measured import RatioEstimate, Target
from upgrade_gate.schema.results import ModelResults, Results
from upgrade_gate.schema.verdict import GateResult, GateStatus, Severity, VerdictRecord

WHERE_MEASURED = "where-measured"  # the page's anchor of the machine the figures are of
VERDICT_STYLE = {"GO": "go", "GO-WITH-CONDITIONS": "conditions", "NO-GO": "nogo", "INCOMPLETE": "incomplete"}
# How each outcome is listed under a candidate's verdict, after its failures.
LISTED = ((GateStatus.INCOMPLETE, "incomplete"), (GateStatus.INCONCLUSIVE, "inconclusive"),
          (GateStatus.NOT_COMPARABLE, "not comparable"))


def model_anchor(model: str) -> str:
    return "model-" + anchor_id(model)


def failures_line(gates: tuple[GateResult, ...]) -> str:
    """What decides first: each failed hard gate by name; the soft ones, which only set conditions, as a
    count pointing at the table (a run with many of them buried the one hard failure among them)."""
    failed = [g for g in gates if g.status is GateStatus.FAILED]
    hard = [f"{g.gate} ({g.model})" for g in failed if g.severity is Severity.HARD]
    soft = sum(1 for g in failed if g.severity is not Severity.HARD)
    parts = [f"hard: {', '.join(hard)}"] if hard else []
    if soft:
        parts.append(f"{soft} soft gate{'s' if soft > 1 else ''} failed ([listed below](#failing-gates))")
    return "; ".join(parts)


def verdict_blocks(verdict: VerdictRecord, *, link_models: bool = False,
                   measured_on: Target | None = None, devices: list[Target] | None = None) -> list[Block]:
    """The verdict, each candidate's with the gates that did not pass, and those gates' table; on an x86-64 host
    (``measured_on``), a short note that a phone runs other kernels, naming the ``devices`` that gave rounds."""
    blocks: list[Block] = [Heading(2, f"Verdict: **{verdict.verdict}**", anchor="verdict",
                                   style=f"verdict {VERDICT_STYLE.get(verdict.verdict.value, '')}")]
    lines = []
    for name, value in verdict.candidates.items():
        own = verdict.of(name)
        summary = failures_line(own) or (
            "every gate passed" if all(g.status is GateStatus.PASSED for g in own) else "no gate failed")
        for status, label in LISTED:
            listed = [g for g in own if g.status is status and not g.not_reached]
            if listed:
                summary += f"; {label}: " + ", ".join(f"{g.gate} ({g.model})" for g in listed)
        # --fail-fast: what the run did not reach is a count (the reason is said once, under the verdict).
        unreached = sum(1 for g in own if g.not_reached)
        if unreached:
            summary += f"; {unreached} gate{'s' if unreached > 1 else ''} not reached (--fail-fast)"
        # A blocked gate is its root failure's consequence, counted once with it: a count, not a list.
        blocked = sum(1 for g in own if g.status is GateStatus.BLOCKED)
        if blocked:
            summary += (f"; {blocked} gate{'s' if blocked > 1 else ''} blocked by a failure above "
                        "([listed below](#failing-gates))")
        remedied = verdict.with_remedies.get(name)
        if remedied is not None:  # what decides first: the verdict as configured, then what the remedies make of it
            value_text = (f"**{value}** as configured; **{remedied.verdict}** with {remedied.counted} "
                          "([Way out](#way-out))")
        else:
            value_text = f"**{value}**"
        also = f", and on {', '.join(d.name for d in devices)}" if devices else ", not a phone"
        host = (f"; latency measured on an {measured_on.architecture} host{also} ([where](#{WHERE_MEASURED}))"
                if measured_on is not None and measured_on.x86 else "")
        lines.append(f"**{name}** vs baseline **{verdict.baseline}**: {value_text} — {summary}{host}")
    blocks.append(bullets(*lines))
    if verdict.incomplete:
        blocks += [Heading(3, "Incomplete: the evidence was not all gathered", anchor="incomplete"),
                   Paragraph("Not the candidate's failings: the run was stopped, a session did not run, a file is "
                             "damaged or the machine ran out of room. What is missing, and what to do:"),
                   bullets(*verdict.incomplete)]
    blocks.append(Heading(3, "Gates that did not pass", anchor="failing-gates"))
    problems = verdict.not_passed
    if not problems:
        return blocks + [Paragraph(f"None: all {len(verdict.gates)} gates passed.")]
    blocks.append(gate_table(problems, link_models=link_models))
    shown = {g.status for g in problems}
    for status, meaning in OUTCOME_MEANINGS:
        if status in shown:
            blocks.append(Paragraph(meaning))
    return blocks


OUTCOME_MEANINGS = (
    (GateStatus.INCONCLUSIVE, "An *inconclusive* gate's interval straddles its threshold: the noise is larger than the "
                              "difference; more `rounds` or a quieter machine can decide it."),
    (GateStatus.NOT_COMPARABLE, "A *not comparable* gate has nothing to compare with: the baseline failed to give "
                                "it (see its baseline findings). Neither passed nor failed."),
    (GateStatus.BLOCKED, "A *blocked* gate needed evidence its model's root gate failed to give; the root gate is the "
                         "one failure counted."),
)


def gate_table(gates: tuple[GateResult, ...] | list[GateResult], *, link_models: bool = False,
               folded: str | None = None, with_model: bool = True) -> Table:
    """One row per gate; ``with_model=False`` in a model's own section."""
    rows = [[g.status.label, str(g.severity), g.stack,
             *([f"[{g.model}](#{model_anchor(g.model)})" if link_models else g.model] if with_model else []),
             g.gate, g.measured_text, g.threshold_text, g.evidence] for g in gates]
    header = ["status", "severity", "stack", *(["model"] if with_model else []), "gate", "measured", "threshold",
              "evidence"]
    return Table(header, rows, folded=folded, status_column=0)


def latency_table(results: Results) -> list[Block]:
    """Every model's methods by stack and thread count: p50 per stack, each candidate's ratio with its interval; a
    column per target the report read rounds from (issue 41), with the candidate's ratio there."""
    base = results.baseline.name
    candidates = [n for n in results.stacks if n != base]
    threads = results.settings.threads
    targets = [target.name for target in results.device_targets]
    header = ["model · method"]
    for count in threads:
        header += [f"{n} p50, {count}t" for n in results.stacks] + [f"{n}/{base}, {count}t" for n in candidates]
        header += [f"{n}/{base} on {target}, {count}t" for target in targets for n in candidates]
    rows = []
    for model in results.models:
        methods = list(dict.fromkeys(method for stack in model.stacks.values() for count in threads
                                     if count in stack.measured for method in stack.measured[count].latency))
        for method in methods:
            row = [f"[{model.name}](#{model_anchor(model.name)}) · {method}"]
            for count in threads:
                for n in results.stacks:
                    measured = model.stacks[n].measured.get(count)
                    lat = measured.latency.get(method) if measured else None
                    row.append(f"{lat.p50_ms:.3f} ms" if lat else "—")
                for n in candidates:
                    ratio = model.ratio(n, count, method)
                    row.append("machine busy" if model.busy_at(count) is not None
                               else _ratio_cell(ratio) if ratio else "—")
                row += [_device_cell(model, n, target, count, method) for target in targets for n in candidates]
            rows.append(row)
    if not rows:
        return []
    return [Heading(3, "Latency", anchor="latency"),
            Paragraph("The ratio is the median of the rounds' candidate/baseline ratios, with its interval (the "
                      "coverage each interval holds is in the model's section; the latency gate's intervals hold "
                      "95% together). Below 1 the candidate is faster.", style="meta"),
            Table(header, rows)]


def _device_cell(model: ModelResults, stack: str, target: str, threads: int, method: str) -> str:
    """A candidate's ratio for one method on a target, or that it was not judged there (the gate's note says why)."""
    row = next((d for d in model.device_latency if (d.stack, d.target.name, d.threads) == (stack, target, threads)
                and d.method in (method, "every method")), None)
    if row is None:
        return "—"
    return "not judged" if row.estimate is None else _ratio_cell(row.estimate)


def _ratio_cell(ratio: RatioEstimate) -> str:
    return f"{ratio.median:.3f} [{ratio.low:.3f}, {ratio.high:.3f}]"


def where_measured_blocks(results: Results) -> list[Block]:
    """The machine every latency, cold-start and memory figure is of, and what that says of a phone."""
    target = results.measured_on
    if target is None:
        return []
    said = (f"Every latency, cold-start and memory figure in this report was measured on **{target.name}**, the "
            f"machine that ran the tool: {target.cpu}, {target.architecture or 'architecture unknown'}"
            f"{f', {target.cores} cores' if target.cores else ''}; ISA extensions the kernels dispatch on: "
            f"{', '.join(target.isa) or 'not read'}.")
    if target.x86:
        said += (" XNNPACK and the portable kernels pick their code by these: a phone runs their Arm kernels (NEON, "
                 "dot-product, i8mm) and the two stacks can rank differently there (ExecuTorch issue #4005: "
                 "MobileNetV3-Small at ~30 ms on ExecuTorch against ~8 ms on PyTorch Mobile, Galaxy S20). Read the "
                 "latency ratios as this host's, a proxy for the device, not a measurement of it.")
    blocks: list[Block] = [Heading(3, "Where it measured", anchor=WHERE_MEASURED), Paragraph(said)]
    measured = {target.name for target in results.measured_targets}
    for device in results.device_targets:
        if device.name not in measured:  # refused, unreachable: its rows say why, and nothing was measured there
            why = next((d.missing for m in results.models for d in m.device_latency
                        if d.target.name == device.name and d.missing), "no rounds")
            blocks.append(Paragraph(f"Nothing was measured on **{device.name}**: {why}."))
            continue
        over_ssh = any(d.ended for m in results.models for d in m.device_latency if d.target.name == device.name)
        how = ("Its rounds were timed from here over ssh (`[tool.upgrade-gate.targets]`) on the bundle's artifacts "
               "(`nox -s bundle`) as this machine's are: the stacks in turn, the stop rule, and the contention check "
               "on the target's own CPU accounting (a disturbed round is repeated and left out). The "
               "`device-latency` and `device-memory` gates judge them by the latency and memory gates' rules"
               if over_ssh else
               "Its rounds ran the bundle's artifacts (`nox -s bundle`), the stacks in turn as here, and the "
               "`device-latency` gate judges them by the latency gate's rule; run-on-device.sh has no contention "
               "check, so run it with nothing else running")
        blocks.append(Paragraph(
            f"Latency on **{device.name}** (`{command('device-results')}`, docs/device.md): {device.cpu}, "
            f"{device.architecture or 'architecture unknown'}{f', {device.cores} cores' if device.cores else ''}; ISA "
            f"extensions: {', '.join(device.isa) or 'not read'}. {how}."))
    return blocks
