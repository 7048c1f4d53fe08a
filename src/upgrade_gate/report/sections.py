"""Writes the report folder's files from the results: report.md and report.html for
people (the same blocks, rendered twice), results.json and verdict.json for tools,
junit.xml and the GitHub Actions step summary for CI; compat.md and compat.json
for `nox -s compat`.

Everything here reads the results schema (upgrade_gate.schema.results); what each block
says is decided once, in the functions below, for both renderings. Longer than
most modules on purpose: every section of the report is in this one place.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from upgrade_gate import __version__
from upgrade_gate._atomic import write_json_atomic, write_text_atomic
from upgrade_gate.judge.agreement import HEADLINE
from upgrade_gate.measure.stats import CONFIDENCE
from upgrade_gate.report import junit
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
    to_html,
    to_markdown,
)
from upgrade_gate.report.render import mark as status_mark
from upgrade_gate.run.packages import NOT_INSTALLED, Differences
from upgrade_gate.run.stages import RUNTIME_STAGES
from upgrade_gate.schema.comparison import Side
from upgrade_gate.schema.project import Finding, ProjectResults
from upgrade_gate.schema.results import ExtraRequirement, ModelResults, Results, StackInfo
from upgrade_gate.schema.verdict import GateResult, GateStatus, VerdictRecord
from upgrade_gate.text import first_line, ms, num, plain, seconds, short, size

VERDICT_STYLE = {"GO": "go", "GO-WITH-CONDITIONS": "conditions", "NO-GO": "nogo", "INCOMPLETE": "incomplete"}
# How each outcome is listed under a candidate's verdict, after its failures.
LISTED = ((GateStatus.INCOMPLETE, "incomplete"), (GateStatus.INCONCLUSIVE, "inconclusive"),
          (GateStatus.NOT_COMPARABLE, "not comparable"), (GateStatus.BLOCKED, "blocked"))
NUMERIC_GATES = ("numerics", "quantized-numerics")
PROFILE_TOP = 10
FOLD_PACKAGES = 12  # a longer list of differing packages is folded on the page
REPORT_FILES = ("results.json", "verdict.json", "report.md", "report.html", "junit.xml")


def write_reports(results: Results, out: Path, *, step_summary: bool = True) -> list[Path]:
    """Write every report file; each replaces its old version whole. ``step_summary``: append the
    verdict to a GitHub Actions step's summary (the release explorer writes one of its own)."""
    paths = [out / name for name in REPORT_FILES]
    write_json_atomic(paths[0], results.to_dict())
    write_json_atomic(paths[1], results.verdict.to_dict())
    blocks = report_blocks(results, out)
    write_text_atomic(paths[2], to_markdown(blocks))
    write_text_atomic(paths[3], to_html(blocks, f"upgrade-gate: {results.verdict.verdict} "
                                                f"({' → '.join(results.stacks)})"))
    junit.write_junit(paths[4], results.verdict)
    if step_summary:
        junit.append_step_summary(results.verdict, out)
    return paths


def write_compat_report(verdict: VerdictRecord, project: ProjectResults, stacks: list[str], out: Path) -> list[Path]:
    """`nox -s compat`: the project's gates and evidence alone, in compat.md and compat.json."""
    paths = [out / "compat.md", out / "compat.json"]
    write_json_atomic(paths[1], {**verdict.to_dict(), "project": project.to_dict()})
    blocks: list[Block] = [Heading(1, f"upgrade-gate compat: {' → '.join(stacks)}")]
    blocks += verdict_blocks(verdict)
    blocks += [Paragraph(f"Generated {verdict.generated_at} by upgrade-gate {__version__} (`nox -s compat`: the "
                         "project alone; `nox -s compare` judges it with the models)", style="meta")]
    blocks += [gate_table(verdict.gates)]
    blocks += project_blocks(project, verdict.baseline, list(verdict.candidates))
    write_text_atomic(paths[0], to_markdown(blocks))
    return paths


def report_blocks(results: Results, out: Path) -> list[Block]:
    names = list(results.stacks)
    verdict = results.verdict
    blocks: list[Block] = [Heading(1, f"upgrade-gate: {' → '.join(names)}")]
    blocks += verdict_blocks(verdict, link_models=True)
    warnings = (*verdict.warnings, *verdict.gate_warnings)
    if warnings:
        blocks += [Paragraph("Warnings:", style="warning"), bullets(*warnings)]
    if verdict.baseline_findings:
        blocks += [Paragraph(f"The baseline's own artifacts depart from its eager models (what "
                             f"{verdict.baseline} ships today, whatever the verdict):"),
                   bullets(*(f"{finding} — [details](#{model_anchor(finding.model)})"
                             for finding in verdict.baseline_findings))]
    settings = results.settings
    blocks.append(Paragraph(
        f"Generated {verdict.generated_at} by upgrade-gate {results.tool_version} · models: "
        f"{', '.join(m.name for m in results.models)} · threads {', '.join(map(str, settings.threads))} · per stack, "
        f"method and thread count: {settings.warmup} warm-up runs, then {settings.rounds} quiet rounds, the order "
        f"alternating, of at least {settings.iterations} timed runs or {settings.time_budget_s:g} s in all · files: "
        "report.md, report.html, results.json, verdict.json, junit.xml", style="meta"))
    blocks += [Heading(2, "Plots", anchor="plots", page_only=True), *plot_figures(results)]

    blocks += [Heading(2, "Decision matrix", anchor="decision-matrix")]
    header = [n if n == info.role else f"{n} ({info.role})" for n, info in results.stacks.items()]
    blocks.append(Table(["Factor", *header], matrix_rows(results)))
    blocks += [Heading(2, "Requirements", anchor="requirements"),
               gate_table(verdict.gates, link_models=True, folded=f"All {len(verdict.gates)} gates")]
    if results.project:
        blocks += project_blocks(results.project, verdict.baseline, list(verdict.candidates))
    blocks += [Heading(2, "Models", anchor="models")]
    for model in results.models:
        blocks += model_blocks(results, model, out)
    blocks += [Heading(2, "Stacks", anchor="stacks")]
    for info in results.stacks.values():
        blocks += stack_blocks(info)
    blocks += package_blocks(results.package_differences, [n for n, info in results.stacks.items() if info.packages],
                             "Packages whose versions differ between the stacks' venvs (the spec's pins, the extra "
                             "requirements and everything they pulled in)")
    blocks += [Heading(2, "Reading this report", anchor="reading"), READING_NOTES]
    return blocks


READING_NOTES = bullets(
    "*reference* is the baseline stack's eager output: what the team validates today. The numerics gate "
    "compares each candidate's artifact with it; the other comparisons locate where a difference comes from "
    "(the torch upgrade itself, or the export).",
    "rel_l2 = ‖actual − reference‖₂ / ‖reference‖₂; SNR = 20·log10(‖reference‖/‖error‖) dB; min atol is the "
    "smallest absolute tolerance at which every element matches.",
    "Latency ratio = candidate / baseline: the median over the rounds of each round's ratio of medians, the "
    "stacks measured in turn (A B, B A, …); the interval is the distribution-free one for a median (two of the "
    f"rounds' ratios, chosen so that it holds the true median with at least {CONFIDENCE:.0%} probability), and its "
    "coverage is written with it. A round the rest of the machine disturbed is repeated or left out. The latency "
    "gate fails only when the whole interval is above its threshold. Runtime memory = peak RSS of a fresh process "
    "that loads and runs the model minus the same process with only the runtime started.",
    "Every file named under *Evidence* is relative to this folder; `results.json` holds every record, "
    "`verdict.json` every gate.",
)


def model_anchor(model: str) -> str:
    return "model-" + anchor_id(model)


# -- the verdict and the gates -------------------------------------------------------


def verdict_blocks(verdict: VerdictRecord, *, link_models: bool = False) -> list[Block]:
    """The verdict, each candidate's with the gates that did not pass, and those gates' table."""
    blocks: list[Block] = [Heading(2, f"Verdict: **{verdict.verdict}**", anchor="verdict",
                                   style=f"verdict {VERDICT_STYLE.get(verdict.verdict.value, '')}")]
    lines = []
    for name, value in verdict.candidates.items():
        own = verdict.of(name)
        failed = [g for g in own if g.status is GateStatus.FAILED]
        summary = ", ".join(f"{g.gate} ({g.model}, {g.severity})" for g in failed) or (
            "every gate passed" if all(g.status is GateStatus.PASSED for g in own) else "no gate failed")
        for status, label in LISTED:
            listed = [g for g in own if g.status is status]
            if listed:
                summary += f"; {label}: " + ", ".join(
                    f"{g.gate} ({g.model}{f', by {g.blocked_by}' if g.blocked_by else ''})" for g in listed)
        lines.append(f"**{name}** vs baseline **{verdict.baseline}**: **{value}** — {summary}")
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


def matrix_rows(results: Results) -> list[list[str]]:
    names = list(results.stacks)
    gates = results.verdict.gates
    candidates = results.verdict.candidates

    def mark(stack: str, gate: str) -> str:
        relevant = [g for g in gates if g.stack == stack and g.gate == gate]
        if not relevant:
            return ""
        failed = [g for g in relevant if g.status is GateStatus.FAILED]
        if failed:
            return " " + status_mark("FAILED" if any(g.severity.value == "hard" for g in failed) else "condition")
        return " " + status_mark("incomplete" if any(g.status is GateStatus.INCOMPLETE for g in relevant) else "passed")

    fp32 = [m for m in results.models if not m.quantized]
    quantized = [m for m in results.models if m.quantized]
    base = results.baseline.name
    rows = [["Installed", *[_installed(results.stacks[n]) for n in names]]]
    rows.append(["Export → load → run (fp32)", *[
        f"{sum(m.stacks[n].all_ok for m in fp32)}/{len(fp32)} models" + mark(n, "export") for n in names]])
    numerics = []
    for n in names:
        if n == base:
            own = _worst(fp32, Side(stack=n, kind="artifact"), Side(stack=n, kind="eager"))
            numerics.append(f"artifact vs own eager: {own}")
        else:
            worst = _worst(fp32, Side(stack=n, kind="artifact"), Side(stack=base, kind="eager"))
            numerics.append(f"artifact vs reference: {worst}" + mark(n, "numerics"))
    rows.append(["Numerics (worst rel L2)", *numerics])
    if quantized:
        rows.append(["Quantized variants: quantized and ran; worst SNR vs the fp32 reference", *[
            _quantized_summary(results, quantized, n) + mark(n, "quantized-export") + mark(n, "quantized-numerics")
            for n in names]])
    rows.append(["Delegated operator nodes (least, per method)",
                 *[_least_delegated(results.models, n) + mark(n, "delegation") for n in names]])
    rows.append(["Other backends, export only (models lowered)", *[_backends_summary(fp32, n) for n in names]])
    for threads in results.settings.threads:
        rows.append([f"Latency p50 at {threads} thread(s) (methods joined by /; candidate/baseline ratio, "
                     f"interval of at least {CONFIDENCE:.0%} coverage)", *[
            ", ".join(f"{m.name} {_p50s(m, n, threads)}{_ratio_note(m, n, threads)}" for m in results.models)
            + mark(n, "latency") for n in names]])
    task_gates = sorted({g.gate for g in gates if g.gate.startswith("task-")})
    if task_gates:
        rows.append(["Task agreement (vs reference)", *[
            "" if n == base else "; ".join(f"{g.model}: {g.measured_text}" for g in gates
                                           if g.stack == n and g.gate in task_gates)
            + "".join(mark(n, t) for t in task_gates) for n in names]])
    rows.append(["Artifact size (largest)", *[
        size(max((m.stacks[n].artifact_bytes or 0 for m in results.models), default=0)) + mark(n, "artifact-size")
        for n in names]])
    rows.append(["Cold start at first use: load + first run (per model)", *[
        ", ".join(f"{m.name} {_cold(m, n)}" for m in results.models) for n in names]])
    rows.append(["Runtime memory: loaded and running (largest)", *[
        size(max((m.stacks[n].runtime_memory_bytes or 0 for m in results.models), default=0))
        + mark(n, "memory") + mark(n, "budget-memory") for n in names]])
    rows.append(["Planned memory of the artifact's methods (largest)", *[
        size(max((sum((m.stacks[n].planned_memory_bytes or {}).values()) for m in results.models), default=0))
        for n in names]])
    rows.append(["Export peak RSS (largest)", *[
        size(max((m.stacks[n].export_peak_rss_bytes or 0 for m in results.models), default=0)) for n in names]])
    if results.project:
        rows.append(["Project compatibility: the team's tests; calls to migrate", *[
            _project_cell(results.project, n, n == base) + mark(n, "project-tests") + mark(n, "api-scan")
            for n in names]])
    rows.append(["Verdict", *["baseline" if n == base else f"**{candidates[n]}**" for n in names]])
    return rows


def _installed(info: StackInfo) -> str:
    if info.installed is None:
        return "not built"
    keep = [f"{k} {v}" for k, v in info.installed.distributions.items() if k in ("torch", "executorch") and v]
    return ", ".join(keep) or f"torch {info.installed.torch_version}"


def _worst(models: list[ModelResults], actual: Side, reference: Side) -> str:
    values = []
    for model in models:
        comparison = model.comparison(actual, reference)
        value = comparison.worst_rel_l2 if comparison else None
        if value is None:
            return f"n/a ({model.name})"
        values.append(value)
    return num(max(values)) if values else "n/a"


def _quantized_summary(results: Results, quantized: list[ModelResults], stack: str) -> str:
    reference = Side(stack=results.baseline.name, kind="eager")
    ran = [m for m in quantized if m.stacks[stack].all_ok]
    offered = [m for m in quantized if not m.stacks[stack].skipped_variant]
    worst: tuple[float, str] | None = None
    for m in ran:
        artifact = Side(stack=stack, kind="artifact")
        comparison = m.comparison(artifact, reference) or m.comparison(artifact, Side(stack=stack, kind="eager"))
        for o in (comparison.outputs or ()) if comparison else ():
            if o.snr_db is not None and (worst is None or o.snr_db < worst[0]):
                worst = (o.snr_db, m.name)
    shown = f"{len(ran)}/{len(offered)}"
    return shown + (f"; worst {num(worst[0], '{:.1f}')} dB ({worst[1]})" if worst else "")


def _least_delegated(models: tuple[ModelResults, ...], stack: str) -> str:
    shares = [(d.share, m.name) for m in models for d in m.stacks[stack].delegation.values()]
    if not shares:
        return "— (no delegate)"
    share, model = min(shares)
    return f"{share:.1%} ({model})"


def _backends_summary(models: list[ModelResults], stack: str) -> str:
    """Per backend, how many fp32 models lowered in every method; unavailable ones named once."""
    lowered: dict[str, list[int]] = {}
    unavailable: set[str] = set()
    for model in models:
        for backend, methods in model.stacks[stack].other_backends.items():
            statuses = {m.status for m in methods.values()}
            if statuses == {"unavailable"}:
                unavailable.add(backend)
                continue
            counts = lowered.setdefault(backend, [0, 0])
            counts[0] += statuses == {"ok"}
            counts[1] += 1
    parts = [f"{backend} {ok}/{tried}" for backend, (ok, tried) in lowered.items()]
    if unavailable:
        parts.append(f"unavailable here: {', '.join(sorted(unavailable))}")
    return "; ".join(parts) or "—"


def _p50s(model: ModelResults, stack: str, threads: int) -> str:
    latency = model.stacks[stack].measured[threads].latency
    return " / ".join(f"{lat.p50_ms:.3f}" for lat in latency.values()) + " ms" if latency else "—"


def _ratio_note(model: ModelResults, stack: str, threads: int) -> str:
    if model.busy_at(threads) is not None:
        return " (no ratio: machine busy)" if model.ratios_of(stack, threads) else ""  # a round or two: no judgement
    estimates = model.ratios_of(stack, threads)
    return f" ({' / '.join(str(e) for e in estimates)})" if estimates else ""


def _cold(model: ModelResults, stack: str) -> str:
    measured = next(iter(model.stacks[stack].measured.values()), None)
    if measured is None or measured.load_ms is None or measured.first_run_ms is None:
        return "—"
    return f"{measured.load_ms:.0f} + {measured.first_run_ms:.0f} ms"


def _project_cell(project: ProjectResults, stack: str, is_baseline: bool) -> str:
    tests = project.stacks.get(stack)
    if tests is None or tests.problem:
        return f"not tested: {short(tests.problem if tests else 'no run')}"
    ran = f"{tests.counts.get('passed', 0)}/{tests.total} tests passed"
    if is_baseline:
        return ran
    diff = project.diffs.get(stack)
    newly = diff.newly_failing if diff else ()
    accepted = sum(1 for c in newly if c.allowed)
    calls = f"{len(project.scan.findings)} calls to migrate" if project.scan else "not scanned"
    return (f"{ran}; {len(newly) - accepted} newly failing" + (f" (+{accepted} accepted)" if accepted else "")
            + f", {len(diff.newly_passing) if diff else 0} newly passing; {calls}")


# -- the project -------------------------------------------------------------------


def project_blocks(project: ProjectResults, base: str, candidates: list[str]) -> list[Block]:
    """The team's tests per stack, what changed per test, and the scan's findings."""
    blocks: list[Block] = [
        Heading(2, "Project compatibility", anchor=model_anchor("project")),
        Paragraph(f"The team's project at `{project.root}`: `uv pip install {' '.join(project.install)}` into each "
                  f"stack, then `{' '.join(project.test)}`.")]
    rows = []
    for stack, tests in project.stacks.items():
        run = tests.run
        warned = tests.warning_total
        rows.append([stack, run.status if run else "did not run",
                     *[str(tests.counts.get(k, 0)) for k in ("passed", "failed", "error", "skipped")],
                     "not counted" if warned is None else str(warned),
                     seconds(run.duration_s) if run and run.duration_s else "—", tests.problem or tests.junit])
    blocks.append(Table(["Stack", "Run", "passed", "failed", "errors", "skipped", "warnings", "time", "Outcomes"],
                        rows))
    uncounted = [f"{stack}: {tests.warnings_problem}" for stack, tests in project.stacks.items()
                 if tests.warnings_problem and not tests.problem]
    if uncounted:
        blocks += [Paragraph("Warnings not counted:"), bullets(*uncounted)]
    for stack in candidates:
        diff = project.diffs.get(stack)
        blocks.append(Heading(3, f"Tests: {stack} against {base}"))
        if diff is None:
            blocks.append(Paragraph("Not compared: one of the runs has no outcomes (above)."))
            continue
        groups = diff.groups()
        if not any(changes for _, _, changes in groups):
            blocks.append(Paragraph("Every test has the same outcome in both stacks."))
        for _, title, changes in groups:
            if not changes:
                continue
            blocks.append(Paragraph(f"{title.format(base=base, stack=stack)}: {len(changes)}"))
            blocks.append(Table(["Test", base, stack, "Message", "Allow-list"], [
                [f"`{c.test_id}`", c.baseline, c.candidate, first_line(c.message), c.allowed or ""]
                for c in changes]))
        for change in diff.newly_failing:
            if change.message:
                blocks += [Paragraph(f"`{change.test_id}` on {stack}:"), Code(change.message.splitlines())]
        if diff.unused_allow:
            blocks.append(Paragraph("Allow-list entries that name no test of either run (a typo, or a test that is "
                                    "gone): " + ", ".join(f"`{t}`" for t in diff.unused_allow)))
        blocks += new_warning_blocks(project, base, stack)
        blocks += package_blocks(project.package_changes(stack), [base, stack],
                                 "Packages whose versions differ between the two test venvs (a test that changed may "
                                 "owe it to one of these rather than to torch)")
    return blocks + scan_blocks(project)


def new_warning_blocks(project: ProjectResults, base: str, stack: str) -> list[Block]:
    """The kinds of warning (category and message) the candidate's tests raise and the baseline's do not."""
    if stack not in project.new_warnings:
        return [Paragraph("Warnings not compared: they were not counted in both runs (above).")]
    found = project.new_warnings[stack]
    if not found:
        return [Paragraph(f"No warning is new on {stack}.")]
    return [Paragraph(f"Warnings new on {stack} (not raised by the tests on {base}): {len(found)}"),
            Table(["Category", "Message", "Raised at", "Count", "Tests"], [
                [w.category, short(w.message), f"`{w.location}`", str(w.count), _tests_cell(w.tests)]
                for w in found])]


def _tests_cell(tests: tuple[str, ...], shown: int = 3) -> str:
    listed = ", ".join(f"`{t}`" for t in tests[:shown])
    return listed + (f" and {len(tests) - shown} more" if len(tests) > shown else "")


def scan_blocks(project: ProjectResults) -> list[Block]:
    blocks: list[Block] = [Heading(3, "API scan")]
    scan = project.scan
    if scan is None:
        return blocks + [Paragraph(f"Not scanned: {project.scan_problem}")]
    blocks.append(Paragraph(
        f"{len(scan.findings)} calls to change in {scan.files_scanned} files (TorchFix {scan.torchfix} and "
        f"upgrade-gate's {scan.rules} rules for the move to the candidate, compat/migration_rules.toml):"))
    if scan.findings:
        # Each rule's explanation once, as a legend; a finding cites its rule and says only what is its own
        # (issue 26: the same 60 words 12 times over). What every finding of a rule shares goes in the legend.
        by_code: dict[str, list[Finding]] = {}
        for f in scan.findings:
            by_code.setdefault(f.code, []).append(f)
        shared = {code: (_same(f.summary for f in found), _same(f.why for f in found),
                         _same(f.replacement for f in found)) for code, found in by_code.items()}
        legend = []
        for code, (summary, why, replacement) in sorted(shared.items()):
            said = " — ".join(w for w in (summary, why) if w) or "(no explanation)"
            if replacement:
                said += ("" if said.endswith((".", "!", "?")) else ".") + f" Instead: {replacement}"
            legend.append(f"**{code}** ({len(by_code[code])}): {said}")
        blocks += [Paragraph("The rules found, each explained once:"), bullets(*legend)]
        rows = []
        for f in scan.findings:
            summary, why, replacement = shared[f.code]
            own = [part for part, common in ((f.summary, summary), (f.why, why)) if part and common is None]
            rows.append([f"{f.file}:{f.line}", f.code, f"`{short(f.call)}`", " — ".join(own),
                         f"`{short(f.replacement)}`" if f.replacement and replacement is None else ""])
        blocks.append(Table(["Where", "Rule", "Call", "What (where the rule's legend does not say it)",
                             "Replacement (where it is this call's own)"], rows))
    if scan.errors:
        blocks += [Paragraph("Files the scan could not parse:"), bullets(*(f"{file}: {e}" for file, e in scan.errors))]
    return blocks


def _same(values: Iterable[str]) -> str | None:
    """The one value every finding of a rule has, or None when they differ."""
    found = set(values)
    return found.pop() if len(found) == 1 else None


# -- one model -----------------------------------------------------------------------


def model_blocks(results: Results, model: ModelResults, out: Path) -> list[Block]:
    """The model's gates, stages, numerics, latency, memory and what explains them;
    its fp32 section also shows every variant side by side."""
    names = list(model.stacks)
    blocks: list[Block] = [Heading(3, model.name, anchor=model_anchor(model.name)), Paragraph(model.description)]
    gates = results.gates_of(model.name)
    if gates:
        blocks.append(gate_table(gates, with_model=False))
    for gate in gates:
        if gate.gate in NUMERIC_GATES and gate.status is GateStatus.FAILED:
            blocks.append(Figure(anchor_id(f"error-{gate.stack}-{model.name}-{gate.gate}"),
                                 f"Error of {gate.stack}'s worst output ({gate.gate} failed: {gate.measured_text})",
                                 _draw("error_histogram", results, out, model, gate)))
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
            f"`{name}` {note}" for name, note in partial.items()) + "."))
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
    """fp32 and every quantized variant, per stack: numerics against the fp32
    reference, latency at the first thread count, size, delegation."""
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
            speed = f" ({fp32_p50 / p50:.2f}× fp32)" if p50 and fp32_p50 and unit.quantized else ""
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
        if rows:
            blocks += [Paragraph(f"Latency at {threads} thread(s), {results.settings.rounds} rounds, the stacks in "
                                 "turn (ratio: candidate/baseline, the median of the per-round ratios, with its "
                                 "interval and that interval's coverage):"),
                       Table(["method", "Stack", "runs", "min", "p50", "p90", "p99", "trimmed mean", "IQR", "rate",
                              "ratio, interval", "faster"], rows)]
        machine = model.contention.get(threads)
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
                row += [f"`{op.name}`", f"{op.total_ms:.3f} ms", f"{op.share:.1%}", str(op.calls)] if op else [""] * 4
            rows.append(row)
        where = "" if method == "forward" else f" — {method}"
        blocks += [Paragraph(f"Top operators by time{where} (per-operator profile in the runtime phase, averaged over "
                             "its calls):"),
                   Table(["#"] + [f"{n} {h}" for n in names for h in ("operator", "ms per call", "share",
                                                                       "calls per call")], rows)]
    return blocks


def localization_blocks(model: ModelResults) -> list[Block]:
    blocks: list[Block] = []
    for n, stack in model.stacks.items():
        found = stack.localized
        if found is None:
            continue
        tried = f"{found.attempts} submodule exports in {found.seconds:.1f} s"
        if not found.complete:
            tried += f", stopped at the {found.budget_s:g} s budget (localize-budget)"
        lines = []
        for culprit in found.culprits:
            op = f", operator `{culprit.operator}`" if culprit.operator else ""
            also = f" (the same in {', '.join(culprit.same_failure_in)})" if culprit.same_failure_in else ""
            where = f" — at {culprit.source}" if culprit.source else ""
            lines.append(f"`{culprit.module}` ({culprit.class_name}){op}: {culprit.error_type}: "
                         f"{first_line(culprit.message)}{also}{where}")
        blocks += [Paragraph(f"**{n}: where the export of {found.method} breaks** ({tried}):"), bullets(*lines)]
    return blocks


def stack_blocks(info: StackInfo) -> list[Block]:
    blocks: list[Block] = [Heading(3, f"{info.name} ({info.role}) — {info.description}")]
    lines = [f"spec: `envs/{info.file}`; requirements: `{'`, `'.join(info.requirements)}`",
             f"exporter: {info.exporter}", f"runtime: {info.runtime}"]
    if info.installed:
        installed = info.installed
        versions = ", ".join(f"{k} {v}" for k, v in installed.distributions.items())
        lines += [f"installed: {versions}; torch.__version__ {installed.torch_version}",
                  f"Python {installed.python} on {installed.platform}; CPU {installed.cpu} "
                  f"({installed.cpu_count} cores)"]
    else:
        lines.append("installed versions unknown: the stack was not built for this report")
    if info.extra_requirements:
        lines.append("extra requirements ([tool.upgrade-gate.extra-requirements]): " + ", ".join(
            f"`{extra.requirement}` ({_extra_version(info, extra)})" for extra in info.extra_requirements))
    return blocks + [bullets(*lines)]


def _extra_version(info: StackInfo, extra: ExtraRequirement) -> str:
    version = info.version_of(extra)
    if version is not None:
        return f"{extra.distribution} {version}"
    if extra.distribution is None:
        return "version unknown: not a requirement upgrade-gate can name"
    return f"{extra.distribution} not installed" if info.packages else "version unknown: not recorded"


def package_blocks(differences: Differences, stacks: list[str], title: str) -> list[Block]:
    """A table of the packages whose versions differ, one column per stack; nothing when none do."""
    if not differences:
        return []
    return [Paragraph(f"{title}: {len(differences)}"),
            Table(["Package", *stacks], [[name, *(versions.get(stack) or NOT_INSTALLED for stack in stacks)]
                                         for name, versions in differences.items()],
                  folded=f"{len(differences)} packages" if len(differences) > FOLD_PACKAGES else None)]


# -- figures (the page only) -----------------------------------------------------------


def plot_figures(results: Results) -> list[Block]:
    latency = [g.threshold.value for g in results.verdict.gates if g.gate == "latency" and g.threshold]
    threshold = max(latency) if latency else None
    return [
        Figure("plot-latency", "Latency: median per call of every method, per model and stack",
               _draw("latency", results)),
        Figure("plot-latency-ratio",
               f"Latency ratio candidate / baseline with its interval (at least {CONFIDENCE:.0%} coverage)"
               + (f" (the gate fails when the whole interval is above {threshold:g})" if threshold else ""),
               _draw("ratios", results)),
        Figure("plot-numerics", "Numerics: SNR and relative L2 error of each candidate artifact against the reference",
               _draw("numerics", results)),
        Figure("plot-stages", "Export success: every stage of every model in every stack", _draw("stages", results)),
        Figure("plot-size-memory", "Artifact size and runtime memory", _draw("size_memory", results)),
    ]


def _draw(name: str, *args: object) -> Callable[[], str | None]:
    """A figure's maker; matplotlib is imported when the page is drawn, not before."""
    def draw() -> str | None:
        from upgrade_gate.report import plots

        figure: str | None = getattr(plots, name)(*args)
        return figure
    return draw
