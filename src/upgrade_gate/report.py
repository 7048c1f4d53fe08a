"""Writes the report: report.md and report.html for people, results.json, verdict.json and
junit.xml for tools (and the GitHub Actions step summary when there is one)."""

from __future__ import annotations

import datetime
import math
from pathlib import Path
from typing import Any

from upgrade_gate import __version__, junit
from upgrade_gate.atomic import to_json, write_json_atomic, write_text_atomic
from upgrade_gate.compare import Comparison, Measured, ModelEvidence, Side, reference_side
from upgrade_gate.config import Plan
from upgrade_gate.policy import GateResult, Verdict, first_line
from upgrade_gate.project import DIFF_GROUPS, ProjectEvidence
from upgrade_gate.records import load_stack_info
from upgrade_gate.stats import LatencySummary
from upgrade_gate.tasks import HEADLINE

SCHEMA_VERSION = "1.0"
MARK = {"passed": "✅ PASS", "FAILED": "❌ FAIL", "inconclusive": "❔ INCONCLUSIVE"}
# An export whose peak resident memory reaches this share of the memory limit
# is one model size away from being killed (seed 000: OOM at 5-6 GB, a 0-byte .pte).
EXPORT_MEMORY_WARNING = 0.8


def write_reports(
    plan: Plan,
    evidence: list[ModelEvidence],
    gates: list[GateResult],
    per_stack: dict[str, Verdict],
    overall: Verdict,
    project: ProjectEvidence | None = None,
) -> list[Path]:
    """Write every report file; each replaces its old version whole."""
    out = plan.settings.out_dir
    stacks = {spec.name: load_stack_info(out, spec.name) for spec in plan.stacks}
    generated = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    findings = baseline_findings(plan, evidence)
    warnings = export_memory_warnings(plan, evidence)
    verdict = {
        **_verdict_record(plan, gates, per_stack, overall, generated),
        # Not gates: the baseline is what ships today; these say where it is already off.
        "baseline_findings": findings,
        "warnings": warnings,
    }
    results = {
        "schema_version": SCHEMA_VERSION,
        "tool_version": __version__,
        "generated_at": generated,
        "config": str(plan.settings.config_path),
        "settings": {
            "threads": list(plan.settings.threads),
            "export_jobs": plan.settings.export_jobs,
            "warmup": plan.settings.warmup,
            "iterations": plan.settings.iterations,
            "time_budget_s": plan.settings.time_budget_s,
            "rounds": plan.settings.rounds,
            "memory_limit_bytes": plan.settings.memory_limit_bytes,
            "gates": plan.settings.gates.to_dict(),
        },
        "stacks": stacks,
        "models": [_model_results(plan, m) for m in evidence],
        "project": project.to_dict(out) if project else None,
        "verdict": verdict,
    }
    paths = [out / "results.json", out / "verdict.json", out / "report.md", out / "report.html", out / "junit.xml"]
    write_json_atomic(paths[0], results)
    write_json_atomic(paths[1], verdict)
    write_text_atomic(paths[2], render_markdown(plan, evidence, gates, per_stack, overall, findings,
                                                warnings, stacks, generated, to_json(results["project"])))
    # The page and the CI files are drawn from the JSON above, as a merge of shards would be.
    from upgrade_gate import html_report  # matplotlib: imported by the report session only

    html_report.write_html(paths[3], to_json(results), out)
    junit.write_junit(paths[4], to_json(verdict))
    junit.append_step_summary(to_json(verdict), out)
    return paths


def _model_results(plan: Plan, model: ModelEvidence) -> dict[str, Any]:
    out = plan.settings.out_dir
    stacks = {}
    for name, ev in model.stacks.items():
        record = ev.record
        stacks[name] = {
            "record_dir": record.directory.relative_to(out).as_posix(),
            "stages": [
                {
                    "stage": s.stage,
                    "status": s.status,
                    "duration_s": s.duration_s,
                    "reason": s.reason,
                    "error": None if s.error is None else {
                        "type": s.error.type, "message": s.error.message, "traceback_tail": list(s.error.traceback_tail)
                    },
                    "details": s.details,
                }
                for s in record.stages
            ],
            "artifact": record.artifact,
            # Raw samples stay in measurements/<model>/threads-<n>.json; summaries here.
            "measured": {str(threads): _measured_results(m) for threads, m in ev.measured.items()},
            "planned_memory_bytes": ev.planned_memory_bytes,
            "runtime_memory_bytes": ev.runtime_memory_bytes,
            "export_peak_rss_bytes": record.peak_rss_bytes("export"),
            "runtime_phase_peak_rss_bytes": record.peak_rss_bytes("runtime"),
            "cache": {phase: {"key": c.get("key"), "reused_from": c.get("reused_from")}
                      for phase, c in record.cache.items()},
        }
    return {
        "model": model.model.name,
        "factory": model.model.factory,
        "description": model.model.description,
        "source": model.model.source,
        "task": model.task_kind,
        "fixtures": model.fixture_hashes,
        "stacks": stacks,
        "comparisons": [c.to_dict() for c in model.comparisons],
        "latency_ratios": [
            {"stack": stack, "threads": threads, "method": method, **estimate.to_dict()}
            for (stack, threads, method), estimate in model.ratios.items()
        ],
    }


def _measured_results(m: Measured) -> dict[str, Any]:
    return {
        "status": m.status,
        "problem": m.problem,
        "latency": {method: lat.to_dict() for method, lat in m.latency.items()},
        "rounds": {method: len(r) for method, r in m.rounds.items()},
        "cold_start": {"load_ms": m.load_ms, "first_run_ms": m.first_run_ms},
        "memory": {"runtime_bytes": m.runtime_memory_bytes, "peak_rss_bytes": m.peak_rss_bytes,
                   "idle_rss_bytes": m.idle_rss_bytes},
    }


def export_memory_warnings(plan: Plan, evidence: list[ModelEvidence]) -> list[str]:
    """Exports that came close to the memory limit: the next bigger model will not export here."""
    limit = plan.settings.memory_limit_bytes
    warnings = []
    for model in evidence:
        for name, ev in model.stacks.items():
            peak = ev.record.peak_rss_bytes("export")
            if peak is not None and peak >= EXPORT_MEMORY_WARNING * limit:
                warnings.append(f"{model.model.name} in {name}: the export peaked at {peak / 2**30:.2f} GiB resident, "
                                f"{peak / limit:.0%} of the memory limit ({limit / 2**30:.2f} GiB, memory-limit)")
    return warnings


# -- Markdown -------------------------------------------------------------------


def render_markdown(
    plan: Plan,
    evidence: list[ModelEvidence],
    gates: list[GateResult],
    per_stack: dict[str, Verdict],
    overall: Verdict,
    findings: list[dict[str, Any]],
    warnings: list[str],
    stacks: dict[str, Any],
    generated: str,
    project: dict[str, Any] | None = None,
) -> str:
    names = [s.name for s in plan.stacks]
    lines = [f"# upgrade-gate: {' → '.join(names)}", ""]
    lines += _verdict_lines(plan, gates, per_stack, overall)
    if warnings:
        lines += ["", "Warnings:", ""] + [f"- {w}" for w in warnings]
    if findings:
        lines += ["", f"The baseline's own artifacts depart from its eager models (what {plan.baseline.name} "
                  "ships today, whatever the verdict):", ""]
        lines += [f"- {_finding_line(finding)}" for finding in findings]
    settings = plan.settings
    lines += ["", f"Generated {generated} by upgrade-gate {__version__} · models: "
              f"{', '.join(m.model.name for m in evidence)} · threads {', '.join(map(str, settings.threads))} · "
              f"per stack, method and thread count: {settings.warmup} warm-up runs, then {settings.rounds} interleaved "
              f"rounds of at least {settings.iterations} timed runs or {settings.time_budget_s:g} s in all", ""]

    lines += ["## Decision matrix", ""]
    header = [n if n == plan.stack(n).role else f"{n} ({plan.stack(n).role})" for n in names]
    lines += _table(["Factor", *header], _matrix_rows(plan, evidence, gates, stacks, per_stack, project))

    lines += ["", "## Requirements", ""]
    lines += _table(
        ["Requirement", "Stack", "Model", "Severity", "Status", "Measured", "Threshold", "Evidence"],
        [[g.gate, g.stack, g.model, g.severity, MARK[g.status], g.measured, g.threshold, g.evidence] for g in gates],
    )
    if project:
        lines += [""] + project_section(project, plan.baseline.name, [s.name for s in plan.candidates])

    lines += ["", "## Models", ""]
    for model in evidence:
        lines += _model_section(plan, model, [m for m in evidence if m.model.base == model.model.base])

    lines += ["## Stacks", ""]
    for name in names:
        lines += _stack_section(name, stacks.get(name))
    lines += READING_NOTES
    return "\n".join(lines)


READING_NOTES = [
    "## Reading this report",
    "",
    "- *reference* is the baseline stack's eager output: what the team validates today. The numerics gate",
    "  compares each candidate's artifact with it; the other comparisons locate where a difference comes from",
    "  (the torch upgrade itself, or the export).",
    "- rel_l2 = ‖actual − reference‖₂ / ‖reference‖₂; SNR = 20·log10(‖reference‖/‖error‖) dB; min atol is the",
    "  smallest absolute tolerance at which every element matches.",
    "- Latency ratio = candidate / baseline: the median over the rounds of each round's ratio of medians, the",
    "  stacks measured in turn; the interval is a 95% bootstrap interval of that median. The latency gate fails",
    "  only when the whole interval is above its threshold. Runtime memory = peak RSS of a fresh process that",
    "  loads and runs the model minus the same process with only the runtime started.",
    "- Every file named under *Evidence* is relative to this folder; `results.json` holds every record,",
    "  `verdict.json` every gate.",
    "",
]


def _verdict_lines(plan: Plan, gates: list[GateResult], per_stack: dict[str, Verdict], overall: Verdict) -> list[str]:
    """The verdict, per candidate the gates that did not pass, and the failing and inconclusive gates' lines."""
    lines = [f"## Verdict: **{overall.value}**", ""]
    for name, verdict in per_stack.items():
        failed = [g for g in gates if g.stack == name and not g.passed]
        summary = ", ".join(f"{g.gate} ({g.model}, {g.severity})" for g in failed) or "every gate passed"
        undecided = [g for g in gates if g.stack == name and g.inconclusive]
        if undecided:
            summary += "; inconclusive: " + ", ".join(f"{g.gate} ({g.model})" for g in undecided)
        lines.append(f"- **{name}** vs baseline **{plan.baseline.name}**: **{verdict.value}** — {summary}")
    failing = [g for g in gates if not g.passed]
    if failing:
        lines += ["", "Failing gates:", "", "```"]
        lines += [_gate_line(g) for g in failing]
        lines += ["```"]
    undecided = [g for g in gates if g.inconclusive]
    if undecided:
        lines += ["", "Inconclusive (the ratio's interval straddles the threshold: the noise is larger than the "
                  "difference; more `rounds` or a quieter machine can decide them):", "", "```"]
        lines += [_gate_line(g) for g in undecided]
        lines += ["```"]
    return lines


def baseline_findings(plan: Plan, evidence: list[ModelEvidence]) -> list[dict[str, Any]]:
    """Models whose baseline artifact is further from the baseline's eager output
    than the numerics gate lets a candidate be: a bug in today's export."""
    base = plan.baseline.name
    findings = []
    for model in evidence:
        if model.model.quantized:  # a quantized artifact departs from its float model by design
            continue
        comparison = model.comparison(Side(stack=base, kind="artifact"), Side(stack=base, kind="eager"))
        worst = comparison.worst_output if comparison else None
        tolerance = plan.settings.gates.for_model(model.model.name, "max-rel-l2")
        if worst is None or worst.rel_l2 is None or worst.rel_l2 <= tolerance:
            continue
        finding: dict[str, Any] = {"model": model.model.name, "output": worst.name, "rel_l2": worst.rel_l2,
                                   "max_rel_l2": tolerance}
        if comparison and comparison.task and comparison.task.headline is not None:
            key, _ = HEADLINE[comparison.task.kind]
            finding[key] = comparison.task.headline
        findings.append(finding)
    return findings


def _finding_line(finding: dict[str, Any]) -> str:
    text = (f"**{finding['model']}**: rel_l2 = {finding['rel_l2']:.2e} ({finding['output']}), "
            f"over the {finding['max_rel_l2']:.1e} gate")
    task = [(key, value) for key, value in finding.items() if key in {k for k, _ in HEADLINE.values()}]
    return text + "".join(f"; {key.replace('_', ' ')} {value:.3f}" for key, value in task)


def _gate_line(g: GateResult) -> str:
    return f"{g.status:6} | {g.severity} | {g.gate} | {g.stack} | {g.model} | {g.measured} (threshold {g.threshold})"


def gate_lines(gates: list[GateResult]) -> list[str]:
    """Aligned, greppable lines for the console."""
    return [_gate_line(g) for g in gates]


def _matrix_rows(
    plan: Plan, evidence: list[ModelEvidence], gates: list[GateResult], stacks: dict[str, Any],
    per_stack: dict[str, Verdict], project: dict[str, Any] | None = None,
) -> list[list[str]]:
    names = [s.name for s in plan.stacks]

    def gate_mark(stack: str, gate: str) -> str:
        relevant = [g for g in gates if g.stack == stack and g.gate == gate]
        if not relevant:
            return ""
        return " ✅" if all(g.passed for g in relevant) else (" ❌" if any(g.severity == "hard" for g in relevant if not g.passed) else " ⚠️")

    fp32 = [m for m in evidence if not m.model.quantized]
    quantized = [m for m in evidence if m.model.quantized]
    rows = [["Installed", *[_installed(stacks.get(n)) for n in names]]]
    rows.append(["Export → load → run (fp32)", *[
        f"{sum(m.stacks[n].record.all_ok for m in fp32)}/{len(fp32)} models" + gate_mark(n, "export") for n in names
    ]])
    numerics = []
    for n in names:
        if plan.stack(n).is_baseline:
            worst = _worst(fp32, Side(stack=n, kind="artifact"), Side(stack=n, kind="eager"))
            numerics.append(f"artifact vs own eager: {worst}")
        else:
            worst = _worst(fp32, Side(stack=n, kind="artifact"), Side(stack=plan.baseline.name, kind="eager"))
            numerics.append(f"artifact vs reference: {worst}" + gate_mark(n, "numerics"))
    rows.append(["Numerics (worst rel L2)", *numerics])
    if quantized:
        rows.append(["Quantized variants: quantized and ran; worst SNR vs the fp32 reference", *[
            _quantized_summary(plan, quantized, n) + gate_mark(n, "quantized-export") + gate_mark(n, "quantized-numerics")
            for n in names
        ]])
    rows.append(["Delegated operator nodes (least, per method)", *[_least_delegated(evidence, n)
                                                                 + gate_mark(n, "delegation") for n in names]])
    rows.append(["Other backends, export only (models lowered)", *[_backends_summary(fp32, n) for n in names]])
    for threads in plan.settings.threads:
        rows.append([f"Latency p50 at {threads} thread(s) (methods joined by /; candidate/baseline ratio, 95% interval)", *[
            ", ".join(f"{m.model.name} {_p50s(m.stacks[n].measured[threads].latency)}{_ratio_note(m, n, threads)}"
                      for m in evidence) + gate_mark(n, "latency")
            for n in names
        ]])
    task_gates = sorted({g.gate for g in gates if g.gate.startswith("task-")})
    if task_gates:
        rows.append(["Task agreement (vs reference)", *[
            "" if plan.stack(n).is_baseline else "; ".join(
                f"{g.model}: {g.measured.split(',')[0]}" for g in gates if g.stack == n and g.gate in task_gates
            ) + "".join(gate_mark(n, t) for t in task_gates)
            for n in names
        ]])
    rows.append(["Artifact size (largest)", *[
        _size(max((m.stacks[n].artifact_bytes or 0 for m in evidence), default=0) or None) + gate_mark(n, "artifact-size")
        for n in names
    ]])
    rows.append(["Cold start at first use: load + first run (per model)", *[
        ", ".join(f"{m.model.name} {_cold(next(iter(m.stacks[n].measured.values()), None))}" for m in evidence)
        for n in names
    ]])
    rows.append(["Runtime memory: loaded and running (largest)", *[
        _size(max((m.stacks[n].runtime_memory_bytes or 0 for m in evidence), default=0) or None)
        + gate_mark(n, "memory") + gate_mark(n, "budget-memory")
        for n in names
    ]])
    rows.append(["Planned memory of the artifact's methods (largest)", *[
        _size(max((sum((m.stacks[n].planned_memory_bytes or {}).values()) for m in evidence), default=0) or None)
        for n in names
    ]])
    rows.append(["Export peak RSS (largest)", *[
        _size(max((m.stacks[n].record.peak_rss_bytes("export") or 0 for m in evidence), default=0) or None) for n in names
    ]])
    if project:
        rows.append(["Project compatibility: the team's tests; calls to migrate", *[
            _project_cell(project, n, plan.stack(n).is_baseline) + gate_mark(n, "project-tests") + gate_mark(n, "api-scan")
            for n in names
        ]])
    rows.append(["Verdict", *["baseline" if plan.stack(n).is_baseline else f"**{per_stack[n].value}**" for n in names]])
    return rows


def _project_cell(project: dict[str, Any], stack: str, is_baseline: bool) -> str:
    tests = project["stacks"].get(stack) or {}
    if tests.get("problem"):
        return f"not tested: {_short(tests['problem'])}"
    count = tests.get("counts") or {}
    ran = f"{count.get('passed', 0)}/{sum(count.values())} tests passed"
    if is_baseline:
        return ran
    diff = project["diffs"].get(stack) or {}
    newly = diff.get("newly_failing", [])
    accepted = sum(1 for c in newly if c.get("allowed"))
    scan = project.get("scan")
    calls = f"{len(scan['findings'])} calls to migrate" if scan else "not scanned"
    return (f"{ran}; {len(newly) - accepted} newly failing" + (f" (+{accepted} accepted)" if accepted else "")
            + f", {len(diff.get('newly_passing', []))} newly passing; {calls}")


def project_section(project: dict[str, Any], base: str, candidates: list[str]) -> list[str]:
    """The team's tests per stack, what changed per test, and the scan's findings (from results.json's "project")."""
    lines = ["## Project compatibility", "",
             f"The team's project at `{project['root']}`: `uv pip install {' '.join(project['install'])}` into each "
             f"stack, then `{' '.join(project['test'])}`.", ""]
    rows = []
    for stack, tests in project["stacks"].items():
        run = tests.get("run") or {}
        count = tests.get("counts") or {}
        rows.append([stack, run.get("status", "did not run"), *[str(count.get(k, 0)) for k in
                                                                ("passed", "failed", "error", "skipped")],
                     f"{run['duration_s']:.1f} s" if run.get("duration_s") else "—",
                     tests["problem"] or tests["junit"]])
    lines += _table(["Stack", "Run", "passed", "failed", "errors", "skipped", "time", "Outcomes"], rows) + [""]
    for stack in candidates:
        diff = project["diffs"].get(stack)
        lines += [f"### Tests: {stack} against {base}", ""]
        if diff is None:
            lines += ["Not compared: one of the runs has no outcomes (above).", ""]
            continue
        if not any(diff[group] for group, _ in DIFF_GROUPS):
            lines += ["Every test has the same outcome in both stacks.", ""]
        for group, title in DIFF_GROUPS:
            changes = diff[group]
            if not changes:
                continue
            lines += [f"{title.format(base=base, stack=stack)}: {len(changes)}", ""]
            lines += _table(["Test", base, stack, "Message", "Allow-list"], [
                [f"`{c['test']}`", c["baseline"], c["candidate"], _short(first_line(c["message"])),
                 c["allowed"] or ""] for c in changes]) + [""]
        for change in diff["newly_failing"]:
            if change["message"]:
                lines += [f"`{change['test']}` on {stack}:", "", "```", change["message"], "```", ""]
        if diff["unused_allow"]:
            lines += ["Allow-list entries that name no test of either run (a typo, or a test that is gone): "
                      + ", ".join(f"`{t}`" for t in diff["unused_allow"]), ""]
    lines += _scan_lines(project)
    return lines


def _scan_lines(project: dict[str, Any]) -> list[str]:
    scan = project.get("scan")
    lines = ["### API scan", ""]
    if scan is None:
        return lines + [f"Not scanned: {project.get('scan_problem')}", ""]
    scanner = scan.get("scanner", {})
    findings = scan["findings"]
    lines += [f"{len(findings)} calls to change in {scan['files_scanned']} files (TorchFix {scanner.get('torchfix', '?')} "
              f"and upgrade-gate's {scanner.get('rules', '?')} rules for the move to the candidate, "
              "compat/migration_rules.toml):", ""]
    if findings:
        lines += _table(["Where", "Code", "Call", "Why it matters for the candidate", "Replacement"], [
            [f"{f['file']}:{f['line']}", f["code"], f"`{_short(f['call'])}`", f.get("why") or f.get("summary", ""),
             f.get("replacement") or ""] for f in findings]) + [""]
    if scan.get("errors"):
        lines += ["Files the scan could not parse:", ""] + [f"- {e['file']}: {e['error']}" for e in scan["errors"]] + [""]
    return lines


def _verdict_record(plan: Plan, gates: list[GateResult], per_stack: dict[str, Verdict], overall: Verdict,
                    generated: str) -> dict[str, Any]:
    """What verdict.json and compat.json share: the verdict per candidate and overall, and every gate."""
    return {
        "schema_version": SCHEMA_VERSION,
        "tool_version": __version__,
        "generated_at": generated,
        "verdict": overall.value,
        "baseline": plan.baseline.name,
        "candidates": {name: v.value for name, v in per_stack.items()},
        "gates": [g.to_dict() for g in gates],
    }


def write_compat_report(plan: Plan, project: ProjectEvidence, gates: list[GateResult], per_stack: dict[str, Verdict],
                        overall: Verdict) -> list[Path]:
    """`nox -s compat`: the project's gates and evidence alone, in compat.md and compat.json."""
    out = plan.settings.out_dir
    generated = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    data = {**_verdict_record(plan, gates, per_stack, overall, generated), "project": project.to_dict(out)}
    paths = [out / "compat.md", out / "compat.json"]
    write_json_atomic(paths[1], data)
    lines = [f"# upgrade-gate compat: {' → '.join(s.name for s in plan.stacks)}", ""]
    lines += _verdict_lines(plan, gates, per_stack, overall)
    lines += ["", f"Generated {generated} by upgrade-gate {__version__} (`nox -s compat`: the project alone; "
              "`nox -s compare` judges it with the models)", ""]
    lines += _table(["Requirement", "Stack", "Severity", "Status", "Measured", "Threshold", "Evidence"],
                    [[g.gate, g.stack, g.severity, MARK[g.status], g.measured, g.threshold, g.evidence] for g in gates])
    lines += [""] + project_section(to_json(data["project"]), plan.baseline.name, [s.name for s in plan.candidates])
    write_text_atomic(paths[0], "\n".join(lines))
    return paths


def _quantized_summary(plan: Plan, quantized: list[ModelEvidence], stack: str) -> str:
    reference = reference_side(plan)
    ran = [m for m in quantized if m.stacks[stack].record.all_ok]
    offered = [m for m in quantized if (q := m.stacks[stack].record.stage("quantize")) is None or q.status != "skipped"]
    worst: tuple[float, str] | None = None
    for m in ran:
        comparison = m.comparison(Side(stack=stack, kind="artifact"), reference) or m.comparison(
            Side(stack=stack, kind="artifact"), Side(stack=stack, kind="eager"))
        for o in (comparison.outputs or ()) if comparison else ():
            if o.snr_db is not None and (worst is None or o.snr_db < worst[0]):
                worst = (o.snr_db, m.model.name)
    text = f"{len(ran)}/{len(offered)}"
    return text + (f"; worst {_num(worst[0], '{:.1f}')} dB ({worst[1]})" if worst else "")


def _least_delegated(evidence: list[ModelEvidence], stack: str) -> str:
    shares = [(d.share, m.model.name) for m in evidence for d in m.stacks[stack].delegation.values()]
    if not shares:
        return "— (no delegate)"
    share, model = min(shares)
    return f"{share:.1%} ({model})"


def _p50s(latency: dict[str, LatencySummary] | None) -> str:
    return " / ".join(f"{lat.p50_ms:.3f}" for lat in latency.values()) + " ms" if latency else "—"


def _ratio_note(model: ModelEvidence, stack: str, threads: int) -> str:
    estimates = [e for (s, t, _), e in model.ratios.items() if s == stack and t == threads]
    return f" ({' / '.join(str(e) for e in estimates)})" if estimates else ""


def _cold(measured: Measured | None) -> str:
    if measured is None or measured.load_ms is None or measured.first_run_ms is None:
        return "—"
    return f"{measured.load_ms:.0f} + {measured.first_run_ms:.0f} ms"


def _worst(evidence: list[ModelEvidence], actual: Side, reference: Side) -> str:
    values = []
    for model in evidence:
        comparison = model.comparison(actual, reference)
        value = comparison.worst_rel_l2 if comparison else None
        if value is None:
            return f"n/a ({model.model.name})"
        values.append(value)
    return _num(max(values)) if values else "n/a"


def _model_section(plan: Plan, model: ModelEvidence, family: list[ModelEvidence]) -> list[str]:
    """``family``: the model's fp32 and quantized variants, shown side by side under the fp32 one."""
    names = list(model.stacks)
    lines = [f"### {model.model.name}", "", model.model.description, ""]
    if not model.model.quantized and len(family) > 1:
        lines += _variants_table(plan, family)
    stage_names = list(dict.fromkeys(s.stage for ev in model.stacks.values() for s in ev.record.stages))
    rows = []
    for stage in stage_names:
        row = [stage]
        for n in names:
            s = model.stacks[n].record.stage(stage)
            row.append("—" if s is None else (f"ok {s.duration_s:.2f} s" if s.ok else f"**{s.status}**"))
        rows.append(row)
    lines += ["Stages:", ""] + _table(["Stage", *names], rows) + [""]
    reused = [f"{n} {' and '.join(model.stacks[n].record.reused_phases())}" for n in names
              if model.stacks[n].record.reused_phases()]
    if reused:
        lines += [f"Reused from the result cache (same key: stack, model code, weights, inputs, tool): "
                  f"{'; '.join(reused)}. `--fresh` runs them again.", ""]

    lines += ["Numerics:", ""]
    rows = []
    for c in model.comparisons:
        if c.outputs is None:
            rows.append([c.purpose, c.label, "—", *["" for _ in range(7)], c.missing or ""])
            continue
        for o in c.outputs:
            note = "" if o.comparable else ("shape mismatch" if not o.shape_match else "NaN/Inf")
            rows.append([c.purpose, c.label, o.name, _num(o.max_abs), _num(o.mean_abs), _num(o.max_rel),
                         _num(o.rel_l2), _num(o.snr_db, "{:.1f}"), _num(o.cosine, "{:.8f}"), _num(o.min_atol), note])
    lines += _table(["Purpose", "Comparison", "Output", "max abs", "mean abs", "max rel", "rel L2", "SNR dB",
                     "cosine", "min atol", "note"], rows) + [""]

    task_rows = [[c.purpose, c.label, _task_cell(c)] for c in model.comparisons if c.task or c.task_missing]
    if task_rows:
        lines += [f"Task agreement ({model.task_kind}):", ""]
        lines += _table(["Purpose", "Comparison", "Agreement"], task_rows) + [""]
    lines += _generated_text(plan, model)

    lines += _latency_tables(plan, model)
    lines += ["Cold start (a fresh process: load every method, then call each once) and memory:", ""]
    rows = []
    for n in names:
        ev = model.stacks[n]
        planned = ev.planned_memory_bytes
        for threads, m in ev.measured.items():
            rows.append([n, str(threads), _ms(m.load_ms), _ms(m.first_run_ms), _size(m.runtime_memory_bytes),
                         _size(m.peak_rss_bytes), _size(m.idle_rss_bytes),
                         " / ".join(_size(v) for v in planned.values()) if planned else "— (no plan)",
                         _size(ev.record.peak_rss_bytes("export")), _size(ev.artifact_bytes)])
    lines += _table(["Stack", "threads", "load", "first run", "runtime memory", "peak RSS", "runtime started",
                     "planned memory", "export peak RSS", "artifact"], rows) + [""]
    unmeasured = [f"{n} at {t} thread(s): {m.status}" + (f" — {m.problem}" if m.problem else "")
                  for n in names for t, m in model.stacks[n].measured.items() if m.status != "ok"]
    lines += [f"- not measured: {line}" for line in unmeasured] + ([""] if unmeasured else [])

    lines += _delegation_lines(model)
    lines += _backends_table(model)
    lines += _profile_tables(model)
    lines += _localization_lines(model)
    for n in names:
        record = model.stacks[n].record
        problems = [s for s in record.stages if s.error]
        for s in problems:
            lines += [f"**{n}: {s.explain()}**", "", "```", *s.error.traceback_tail, "```", ""]  # type: ignore[union-attr]
        export = record.stage("export")
        if export and export.ok and export.details:
            detail = ", ".join(f"{k}: {_short(v)}" for k, v in export.details.items())
            lines += [f"- {n} export: {detail}"]
        program = record.stage("program")
        if program and program.ok and program.details:
            lines += [f"- {n} multi-method artifact: {program.details.get('file')}, "
                      f"{_size(program.details.get('bytes'))}, methods {', '.join(program.details.get('methods', []))}"]
    lines += [""]
    return lines


def _variants_table(plan: Plan, family: list[ModelEvidence]) -> list[str]:
    """fp32 and every quantized variant, per stack: numerics against the fp32
    reference, latency at the first thread count, size, delegation."""
    threads = plan.settings.threads[0]
    reference = reference_side(plan)
    rows = []
    for n in family[0].stacks:
        fp32_p50 = _p50_sum(family[0].stacks[n].measured[threads].latency)
        for unit in family:
            ev = unit.stacks[n]
            quantize = ev.record.stage("quantize")
            if quantize is not None and quantize.status == "skipped":
                rows.append([n, unit.model.variant, f"no {unit.model.variant} recipe in this stack",
                             *[""] * 6])
                continue
            problem = ev.record.first_problem()
            # What each method really got (the legacy recipe falls back where FX cannot trace).
            used = [m.get("recipe", "") for m in (quantize.details.get("methods") or {}).values()] if quantize else []
            recipe = "float" if quantize is None else " / ".join(dict.fromkeys(used)) or quantize.details.get("recipe", "")
            actual = Side(stack=n, kind="artifact")
            comparison = unit.comparison(actual, reference) or unit.comparison(actual, Side(stack=n, kind="eager"))
            outputs = [o for o in (comparison.outputs or ()) if o.comparable] if comparison else []
            snr = min((o.snr_db for o in outputs if o.snr_db is not None), default=None)
            cosine = min((o.cosine for o in outputs if o.cosine is not None), default=None)
            task = comparison.task.headline if comparison and comparison.task else None
            p50 = _p50_sum(ev.measured[threads].latency)
            speed = f" ({fp32_p50 / p50:.2f}× fp32)" if p50 and fp32_p50 and unit.model.quantized else ""
            coverage = ev.delegation
            delegated = (f"{min(d.share for d in coverage.values()):.1%}" if coverage else "—")
            rows.append([n, unit.model.variant, "ok" if problem is None else f"**{problem.explain()}**", recipe,
                         "∞" if snr is not None and math.isinf(snr) else _num(snr, "{:.1f}"), _num(cosine, "{:.5f}"),
                         _num(task, "{:.3f}"), f"{p50:.3f} ms{speed}" if p50 else "—", _size(ev.artifact_bytes),
                         delegated])
    key = HEADLINE.get(family[0].task_kind, ("task", ""))[0].replace("_", " ")
    lines = [f"Variants, each against the fp32 reference ({reference}); latency: p50 of every method summed at "
             f"{threads} thread(s):", ""]
    lines += _table(["Stack", "variant", "status", "recipe", "SNR dB (worst output)", "cosine (worst)", key,
                     "latency", "artifact", "delegated"], rows)
    return lines + [""]


def _p50_sum(latency: dict[str, LatencySummary] | None) -> float | None:
    return sum(lat.p50_ms for lat in latency.values()) if latency else None


def _delegation_lines(model: ModelEvidence) -> list[str]:
    """Per candidate method: nodes inside delegate partitions, and the operators left to portable kernels."""
    lines = []
    for n, ev in model.stacks.items():
        for method, d in ev.delegation.items():
            where = "" if method == "forward" else f" {method}:"
            left = f"; not delegated: {d.portable_summary()}" if d.portable_ops else "; every operator delegated"
            lines.append(f"- {n}{where} {d.delegate} took {d.delegated_nodes} of {d.delegated_nodes + d.portable_nodes} "
                         f"operator nodes ({d.share:.1%}) in {d.partitions} partition(s){left}")
    return ["Delegation (ExecuTorch's get_delegation_info; what is not delegated runs on portable kernels):", "",
            *lines, ""] if lines else []


def _backends_table(model: ModelEvidence) -> list[str]:
    """Each stack's other backends, export only: which lowered every method, how much they took, why not."""
    rows = []
    for n, ev in model.stacks.items():
        for backend, methods in ev.other_backends.items():
            statuses = [m.get("status", "?") for m in methods.values()]
            lowered = [m for m in methods.values() if m.get("status") == "ok"]
            status = statuses[0] if len(set(statuses)) == 1 else f"{len(lowered)}/{len(methods)} methods ok"
            delegated = sum(m.get("delegated_nodes", 0) for m in lowered)
            total = delegated + sum(m.get("portable_nodes", 0) for m in lowered)
            why = next((m.get("error") or m.get("reason") for m in methods.values() if m.get("status") != "ok"), "")
            rows.append([n, backend, status if status != "ok" else "ok",
                         str(sum(m.get("delegate_partitions", 0) for m in lowered)) if lowered else "",
                         f"{delegated / total:.1%}" if total else "", _size(sum(m.get("bytes", 0) for m in lowered)),
                         f"{sum(m.get('seconds', 0.0) for m in methods.values()):.1f} s" if lowered else "",
                         _short(why or "")])
    if not rows:
        return []
    return ["Other backends, export only (lowered on this machine, not run):", "",
            *_table(["Stack", "backend", "status", "partitions", "delegated", ".pte", "lowering", "why not"], rows), ""]


def _backends_summary(evidence: list[ModelEvidence], stack: str) -> str:
    """Per backend, how many fp32 models lowered in every method; unavailable ones named once."""
    lowered: dict[str, list[int]] = {}
    unavailable: set[str] = set()
    for model in evidence:
        for backend, methods in model.stacks[stack].other_backends.items():
            statuses = {m.get("status") for m in methods.values()}
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


PROFILE_TOP = 10


def _profile_tables(model: ModelEvidence) -> list[str]:
    """The top operators by time, every stack side by side, per method."""
    profiles = {n: ev.profile for n, ev in model.stacks.items() if ev.profile}
    if not profiles:
        return []
    names = list(profiles)
    lines = []
    methods = list(dict.fromkeys(m for p in profiles.values() for m in p))
    for method in methods:
        columns = [profiles[n].get(method, [])[:PROFILE_TOP] for n in names]
        rows = []
        for rank in range(max(len(c) for c in columns)):
            row = [str(rank + 1)]
            for column in columns:
                op = column[rank] if rank < len(column) else None
                row += [f"`{op.name}`", f"{op.total_ms:.3f} ms", f"{op.share:.1%}", str(op.calls)] if op else [""] * 4
            rows.append(row)
        header = ["#"] + [f"{n} {h}" for n in names for h in ("operator", "ms per call", "share", "calls per call")]
        where = "" if method == "forward" else f" — {method}"
        lines += [f"Top operators by time{where} (per-operator profile in the runtime phase, averaged over its calls):", ""]
        lines += _table(header, rows) + [""]
    return lines


def _localization_lines(model: ModelEvidence) -> list[str]:
    lines = []
    for n, ev in model.stacks.items():
        found = ev.localized
        if not found:
            continue
        method = found.get("method", "forward")
        tried = f"{found.get('attempts', 0)} submodule exports in {found.get('seconds', 0):.1f} s"
        if not found.get("complete", True):
            tried += f", stopped at the {found.get('budget_s', 0):g} s budget (localize-budget)"
        lines.append(f"**{n}: where the export of {method} breaks** ({tried}):")
        lines.append("")
        for culprit in found.get("culprits", []):
            where = f" at {culprit['source']}" if culprit.get("source") else ""
            op = f", operator `{culprit['operator']}`" if culprit.get("operator") else ""
            also = f" (the same in {', '.join(culprit['same_failure_in'])})" if culprit.get("same_failure_in") else ""
            first = (culprit.get("message") or "").strip().splitlines()[0] if culprit.get("message") else ""
            lines.append(f"- `{culprit['module']}` ({culprit['class']}){where}{op}: {culprit['type']}: "
                         f"{_short(first)}{also}")
        lines.append("")
    return lines


def _latency_tables(plan: Plan, model: ModelEvidence) -> list[str]:
    """Per thread count: every method's distribution in every stack, and the candidate's ratio to the baseline."""
    base = plan.baseline.name
    lines = []
    for threads in plan.settings.threads:
        rows = []
        methods = list(dict.fromkeys(m for ev in model.stacks.values() for m in ev.measured[threads].latency))
        for method in methods:
            baseline = model.stacks[base].measured[threads].latency.get(method)
            for n, ev in model.stacks.items():
                measured = ev.measured[threads]
                lat = measured.latency.get(method)
                if lat is None:
                    continue
                estimate = model.ratios.get((n, threads, method))
                rate = f"{lat.per_second:.1f} FPS" if measured.image_input else f"{lat.per_second:.1f}/s"
                winner = "" if estimate is None or baseline is None else (
                    n if lat.p50_ms < baseline.p50_ms and estimate.high < 1 else
                    base if lat.p50_ms > baseline.p50_ms and estimate.low > 1 else "tie (within noise)")
                rows.append([method, n, str(lat.runs), _ms(lat.min_ms), _ms(lat.p50_ms), _ms(lat.p90_ms),
                             _ms(lat.p99_ms), _ms(lat.trimmed_mean_ms), _ms(lat.iqr_ms), rate,
                             str(estimate) if estimate else "", winner])
        if not rows:
            continue
        lines += [f"Latency at {threads} thread(s), {plan.settings.rounds} interleaved rounds "
                  "(ratio: candidate/baseline median of per-round ratios, 95% bootstrap interval):", ""]
        lines += _table(["method", "Stack", "runs", "min", "p50", "p90", "p99", "trimmed mean", "IQR", "rate",
                         "ratio [95% CI]", "faster"], rows) + [""]
    return lines


def _task_cell(c: Comparison) -> str:
    if c.task is None:
        return c.task_missing or "—"
    return ", ".join(f"{k} {_short(_fmt(v))}" for k, v in c.task.values.items())


def _fmt(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _generated_text(plan: Plan, model: ModelEvidence) -> list[str]:
    """What each side answered, prompt by prompt: the reference's eager text, then every artifact's."""
    sides = [(f"{plan.baseline.name} eager (reference)", model.stacks[plan.baseline.name].record.task_result("eager"))]
    sides += [(f"{n} artifact", model.stacks[n].record.task_result("artifact"))
              for n in model.stacks]
    results = [(label, r) for label, r in sides if r is not None]
    if not results:
        return []
    lines = ["Generated text (greedy):", ""]
    prompts = next((r.prompts for _, r in results if r.prompts), [])
    count = max(len(r.text) for _, r in results)
    for i in range(count):
        lines += [f"- prompt {i + 1}" + (f": “{prompts[i]}”" if i < len(prompts) else "")]
        for label, r in results:
            text = r.text[i] if i < len(r.text) else "—"
            lines += [f"  - {label}: “{' '.join(text.split())}”"]
    return lines + [""]


def _stack_section(name: str, info: dict[str, Any] | None) -> list[str]:
    if info is None:
        return [f"### {name}", "", "Not run: no stack.json.", ""]
    spec, installed = info["spec"], info.get("installed") or {}
    lines = [f"### {name} ({spec['role']}) — {spec['description']}", ""]
    lines += [f"- spec: `envs/{spec['file']}`; requirements: `{'`, `'.join(spec['requirements'])}`"]
    lines += [f"- exporter: {spec['exporter']}", f"- runtime: {spec['runtime']}"]
    if installed:
        versions = ", ".join(f"{k} {v}" for k, v in installed.get("distributions", {}).items())
        lines += [f"- installed: {versions}; torch.__version__ {installed.get('torch_version')}",
                  f"- Python {installed.get('python')} on {installed.get('platform')}; CPU {installed.get('cpu')} "
                  f"({installed.get('cpu_count')} cores)"]
    else:
        lines += ["- installed versions unknown: the probe did not run"]
    return lines + [""]


def _installed(info: dict[str, Any] | None) -> str:
    if not info or not info.get("installed"):
        return "not built"
    dists = info["installed"].get("distributions", {})
    keep = [f"{k} {v}" for k, v in dists.items() if k in ("torch", "executorch") and v]
    return ", ".join(keep) or f"torch {info['installed'].get('torch_version')}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(cell).replace("|", "\\|").replace("\n", " ") for cell in row) + " |" for row in rows]
    return lines


def _num(value: float | None, fmt: str = "{:.2e}") -> str:
    if value is None:
        return "—"
    if math.isinf(value):
        return "∞" if value > 0 else "−∞"
    return fmt.format(value)


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f} ms"


def _size(count: int | None) -> str:
    if not count:
        return "—"
    return f"{count / 2**20:.1f} MiB" if count >= 2**20 else f"{count / 2**10:.0f} KiB"


def _short(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 160 else text[:157] + "…"
