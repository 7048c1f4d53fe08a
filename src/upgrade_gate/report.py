"""Writes the report: report.md for people, results.json and verdict.json for tools."""

from __future__ import annotations

import datetime
import math
from pathlib import Path
from typing import Any

from upgrade_gate import __version__
from upgrade_gate.atomic import write_json_atomic, write_text_atomic
from upgrade_gate.compare import Comparison, ModelEvidence, Side
from upgrade_gate.config import Plan
from upgrade_gate.policy import GateResult, Verdict
from upgrade_gate.records import load_stack_info
from upgrade_gate.stats import LatencySummary
from upgrade_gate.tasks import HEADLINE

SCHEMA_VERSION = "1.0"
MARK = {True: "✅ PASS", False: "❌ FAIL"}


def write_reports(
    plan: Plan,
    evidence: list[ModelEvidence],
    gates: list[GateResult],
    per_stack: dict[str, Verdict],
    overall: Verdict,
) -> list[Path]:
    """Write all three files; each replaces its old version whole."""
    out = plan.settings.out_dir
    stacks = {spec.name: load_stack_info(out, spec.name) for spec in plan.stacks}
    generated = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    findings = baseline_findings(plan, evidence)
    verdict = {
        "schema_version": SCHEMA_VERSION,
        "tool_version": __version__,
        "generated_at": generated,
        "verdict": overall.value,
        "baseline": plan.baseline.name,
        "candidates": {name: v.value for name, v in per_stack.items()},
        "gates": [g.to_dict() for g in gates],
        # Not gates: the baseline is what ships today; these say where it is already off.
        "baseline_findings": findings,
    }
    results = {
        "schema_version": SCHEMA_VERSION,
        "tool_version": __version__,
        "generated_at": generated,
        "config": str(plan.settings.config_path),
        "settings": {
            "threads": plan.settings.threads,
            "export_jobs": plan.settings.export_jobs,
            "warmup": plan.settings.warmup,
            "iterations": plan.settings.iterations,
            "gates": plan.settings.gates.to_dict(),
        },
        "stacks": stacks,
        "models": [_model_results(plan, m) for m in evidence],
        "verdict": verdict,
    }
    paths = [out / "results.json", out / "verdict.json", out / "report.md"]
    write_json_atomic(paths[0], results)
    write_json_atomic(paths[1], verdict)
    write_text_atomic(paths[2], render_markdown(plan, evidence, gates, per_stack, overall, findings, stacks,
                                                     generated))
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
                    # Raw latency samples stay in runtime.json; the summary is below.
                    "details": {k: v for k, v in s.details.items() if s.stage != "latency" or k != "methods"},
                }
                for s in record.stages
            ],
            "artifact": record.artifact,
            "latency": {m: lat.to_dict() for m, lat in ev.latency.items()} if ev.latency else None,
            "export_peak_rss_bytes": record.peak_rss_bytes("export"),
            "runtime_peak_rss_bytes": record.peak_rss_bytes("runtime"),
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
    }


# -- Markdown -------------------------------------------------------------------


def render_markdown(
    plan: Plan,
    evidence: list[ModelEvidence],
    gates: list[GateResult],
    per_stack: dict[str, Verdict],
    overall: Verdict,
    findings: list[dict[str, Any]],
    stacks: dict[str, Any],
    generated: str,
) -> str:
    names = [s.name for s in plan.stacks]
    lines = [f"# upgrade-gate: {' → '.join(names)}", ""]
    lines += [f"## Verdict: **{overall.value}**", ""]
    for name, verdict in per_stack.items():
        failed = [g for g in gates if g.stack == name and not g.passed]
        summary = ", ".join(f"{g.gate} ({g.model}, {g.severity})" for g in failed) or "every gate passed"
        lines.append(f"- **{name}** vs baseline **{plan.baseline.name}**: **{verdict.value}** — {summary}")
    failing = [g for g in gates if not g.passed]
    if failing:
        lines += ["", "Failing gates:", "", "```"]
        lines += [_gate_line(g) for g in failing]
        lines += ["```"]
    if findings:
        lines += ["", f"The baseline's own artifacts depart from its eager models (what {plan.baseline.name} "
                  "ships today, whatever the verdict):", ""]
        lines += [f"- {_finding_line(finding)}" for finding in findings]
    lines += ["", f"Generated {generated} by upgrade-gate {__version__} · models: "
              f"{', '.join(m.model.name for m in evidence)} · {plan.settings.threads} thread(s), "
              f"{plan.settings.warmup} warm-up + {plan.settings.iterations} timed runs", ""]

    lines += ["## Decision matrix", ""]
    header = [n if n == plan.stack(n).role else f"{n} ({plan.stack(n).role})" for n in names]
    lines += _table(["Factor", *header], _matrix_rows(plan, evidence, gates, stacks, per_stack))

    lines += ["", "## Requirements", ""]
    lines += _table(
        ["Requirement", "Stack", "Model", "Severity", "Status", "Measured", "Threshold", "Evidence"],
        [[g.gate, g.stack, g.model, g.severity, MARK[g.passed], g.measured, g.threshold, g.evidence] for g in gates],
    )

    lines += ["", "## Models", ""]
    for model in evidence:
        lines += _model_section(plan, model)

    lines += ["## Stacks", ""]
    for name in names:
        lines += _stack_section(name, stacks.get(name))
    lines += [
        "## Reading this report",
        "",
        "- *reference* is the baseline stack's eager output: what the team validates today. The numerics gate",
        "  compares each candidate's artifact with it; the other comparisons locate where a difference comes from",
        "  (the torch upgrade itself, or the export).",
        "- rel_l2 = ‖actual − reference‖₂ / ‖reference‖₂; SNR = 20·log10(‖reference‖/‖error‖) dB; min atol is the",
        "  smallest absolute tolerance at which every element matches.",
        "- Every file named under *Evidence* is relative to this folder; `results.json` holds every record,",
        "  `verdict.json` every gate.",
        "",
    ]
    return "\n".join(lines)


def baseline_findings(plan: Plan, evidence: list[ModelEvidence]) -> list[dict[str, Any]]:
    """Models whose baseline artifact is further from the baseline's eager output
    than the numerics gate lets a candidate be: a bug in today's export."""
    base = plan.baseline.name
    findings = []
    for model in evidence:
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
    plan: Plan, evidence: list[ModelEvidence], gates: list[GateResult], stacks: dict[str, Any], per_stack: dict[str, Verdict]
) -> list[list[str]]:
    names = [s.name for s in plan.stacks]

    def gate_mark(stack: str, gate: str) -> str:
        relevant = [g for g in gates if g.stack == stack and g.gate == gate]
        if not relevant:
            return ""
        return " ✅" if all(g.passed for g in relevant) else (" ❌" if any(g.severity == "hard" for g in relevant if not g.passed) else " ⚠️")

    rows = [["Installed", *[_installed(stacks.get(n)) for n in names]]]
    rows.append(["Export → load → run", *[
        f"{sum(m.stacks[n].record.all_ok for m in evidence)}/{len(evidence)} models" + gate_mark(n, "export") for n in names
    ]])
    numerics = []
    for n in names:
        if plan.stack(n).is_baseline:
            worst = _worst(evidence, Side(stack=n, kind="artifact"), Side(stack=n, kind="eager"))
            numerics.append(f"artifact vs own eager: {worst}")
        else:
            worst = _worst(evidence, Side(stack=n, kind="artifact"), Side(stack=plan.baseline.name, kind="eager"))
            numerics.append(f"artifact vs reference: {worst}" + gate_mark(n, "numerics"))
    rows.append(["Numerics (worst rel L2)", *numerics])
    rows.append(["Latency p50 (per model; methods joined by /)", *[
        ", ".join(_p50s(m.stacks[n].latency) for m in evidence) + gate_mark(n, "latency")
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
    rows.append(["Runtime peak RSS (largest)", *[
        _size(max((m.stacks[n].record.peak_rss_bytes("runtime") or 0 for m in evidence), default=0) or None)
        + gate_mark(n, "budget-memory")
        for n in names
    ]])
    rows.append(["Export peak RSS (largest)", *[
        _size(max((m.stacks[n].record.peak_rss_bytes("export") or 0 for m in evidence), default=0) or None) for n in names
    ]])
    rows.append(["Verdict", *["baseline" if plan.stack(n).is_baseline else f"**{per_stack[n].value}**" for n in names]])
    return rows


def _p50s(latency: dict[str, LatencySummary] | None) -> str:
    return " / ".join(f"{lat.p50_ms:.3f}" for lat in latency.values()) + " ms" if latency else "—"


def _worst(evidence: list[ModelEvidence], actual: Side, reference: Side) -> str:
    values = []
    for model in evidence:
        comparison = model.comparison(actual, reference)
        value = comparison.worst_rel_l2 if comparison else None
        if value is None:
            return f"n/a ({model.model.name})"
        values.append(value)
    return _num(max(values)) if values else "n/a"


def _model_section(plan: Plan, model: ModelEvidence) -> list[str]:
    names = list(model.stacks)
    lines = [f"### {model.model.name}", "", model.model.description, ""]
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

    lines += ["Latency, size and memory:", ""]
    rows = []
    for n in names:
        ev = model.stacks[n]
        latency: dict[str, LatencySummary | None] = {**ev.latency} if ev.latency else {"—": None}
        for method, lat in latency.items():
            rows.append([n, method, str(lat.runs) if lat else "—", _ms(lat.min_ms if lat else None),
                         _ms(lat.p50_ms if lat else None), _ms(lat.p90_ms if lat else None),
                         _ms(lat.trimmed_mean_ms if lat else None),
                         _size(ev.artifact_bytes), _size(ev.record.peak_rss_bytes("export")),
                         _size(ev.record.peak_rss_bytes("runtime"))])
    lines += _table(["Stack", "method", "runs", "min", "p50", "p90", "trimmed mean", "artifact (all methods)",
                     "export peak RSS", "runtime peak RSS"], rows) + [""]

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
    return f"{count / 2**20:.1f} MiB"


def _short(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 160 else text[:157] + "…"
