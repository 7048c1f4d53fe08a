"""report.html: one self-contained page for the people who decide.

The verdict and the gates that did not pass come first, each a link to its
model's section; then the plots (latency with the ratio interval, numerics,
export success per stage, size and memory); then one section per model with its
stages, comparisons, latency and, for a failed numerics gate, the histogram of
the output's error. Written from results.json's data alone (plus the output
arrays beside it), so a merged sharded run renders the same page. Plots are
matplotlib PNGs embedded as data: URIs — the page fetches nothing.
"""

from __future__ import annotations

import base64
import html
import io
import logging
import math
import re
from pathlib import Path
from typing import Any, Iterable

# nox logs at DEBUG: without this, matplotlib's font-cache chatter fills the session log.
logging.getLogger("matplotlib").setLevel(logging.WARNING)

import matplotlib  # noqa: E402

matplotlib.use("Agg")  # no display

import matplotlib.pyplot as plt  # noqa: E402 - after the backend is chosen
import numpy as np  # noqa: E402
from matplotlib.colors import ListedColormap  # noqa: E402

from upgrade_gate.atomic import from_json_float, write_text_atomic  # noqa: E402
from upgrade_gate.config import EXPORT_STAGES, RUNTIME_STAGES  # noqa: E402
from upgrade_gate.project import DIFF_GROUPS  # noqa: E402

VERDICT_COLOURS = {"GO": "#1a7f37", "GO-WITH-CONDITIONS": "#9a6700", "NO-GO": "#cf222e"}
STATUS_CLASS = {"passed": "pass", "FAILED": "fail", "inconclusive": "unsure"}
# Export-success matrix cells: absent, ok, skipped, failed.
STAGE_COLOURS = ["#ffffff", "#2da44e", "#d0d7de", "#cf222e"]
STAGE_CODES = {"ok": 1, "skipped": 2, "failed": 3, "timeout": 3, "killed": 3}
NUMERIC_GATES = ("numerics", "quantized-numerics")
_SIDE = re.compile(r"^(eager|artifact)\((.+)\)$")


def write_html(path: Path, results: dict[str, Any], report_dir: Path) -> Path:
    write_text_atomic(path, render_html(results, report_dir))
    return path


def render_html(results: dict[str, Any], report_dir: Path) -> str:
    verdict = results["verdict"]
    stacks = list(results["stacks"])
    models = results["models"]
    gates = verdict["gates"]
    body: list[str] = []
    body += _verdict_header(verdict, stacks)
    body += _problem_gates(gates)
    body += ["<h2 id='plots'>Plots</h2>"]
    for figure_id, title, figure in _figures(results, report_dir):
        body.append(_figure(figure_id, title, figure))
    body += _all_gates(gates)
    body += ["<h2 id='models'>Models</h2>"]
    for model in models:
        body += _model_section(model, [g for g in gates if g["model"] == model["model"]], report_dir)
    if results.get("project"):
        body += _project_section(results["project"], verdict["baseline"], [g for g in gates if g["model"] == "project"])
    body += _stacks_section(results["stacks"])
    title = f"upgrade-gate: {verdict['verdict']} ({' → '.join(stacks)})"
    return PAGE.format(title=_e(title), body="\n".join(body))


# ----------------------------------------------------------------------------- top of the page
def _verdict_header(verdict: dict[str, Any], stacks: list[str]) -> list[str]:
    colour = VERDICT_COLOURS.get(verdict["verdict"], "#57606a")
    lines = [f"<h1>upgrade-gate: {' → '.join(map(_e, stacks))}</h1>",
             f"<p id='verdict' class='verdict' style='background:{colour}'>Verdict: {_e(verdict['verdict'])}</p>",
             "<ul class='stacks'>"]
    for stack, value in verdict["candidates"].items():
        lines.append(f"<li><b>{_e(stack)}</b> vs baseline <b>{_e(verdict['baseline'])}</b>: {_e(value)}</li>")
    lines.append("</ul>")
    for warning in verdict.get("warnings") or []:
        lines.append(f"<p class='warning'>⚠ {_e(warning)}</p>")
    findings = verdict.get("baseline_findings") or []
    if findings:
        lines.append(f"<p>The baseline's own artifacts depart from its eager models in {len(findings)} case(s) "
                     "(what ships today, whatever the verdict): "
                     + "; ".join(f"<a href='#{_anchor(f['model'])}'>{_e(f['model'])}</a> {_e(f['output'])} "
                                 f"rel L2 {_num(f['rel_l2'])}" for f in findings) + "</p>")
    lines.append(f"<p class='meta'>Generated {_e(verdict['generated_at'])} by upgrade-gate "
                 f"{_e(verdict['tool_version'])} · <a href='report.md'>report.md</a> · "
                 "<a href='results.json'>results.json</a> · <a href='junit.xml'>junit.xml</a></p>")
    return lines


def _problem_gates(gates: list[dict[str, Any]]) -> list[str]:
    problems = [g for g in gates if g["status"] != "passed"]
    if not problems:
        return [f"<p id='failing-gates'>All {len(gates)} gates passed.</p>"]
    problems.sort(key=lambda g: (g["status"] != "FAILED", g["severity"] != "hard"))
    return ["<h2 id='failing-gates'>Gates that did not pass</h2>",
            *_gate_table(problems, link=True)]


def _all_gates(gates: list[dict[str, Any]]) -> list[str]:
    return [f"<details><summary>All {len(gates)} gates</summary>", *_gate_table(gates, link=True), "</details>"]


def _gate_table(gates: list[dict[str, Any]], *, link: bool) -> list[str]:
    rows = []
    for g in gates:
        model = f"<a href='#{_anchor(g['model'])}'>{_e(g['model'])}</a>" if link else _e(g["model"])
        rows.append([f"<span class='{STATUS_CLASS.get(g['status'], '')}'>{_e(g['status'])}</span>",
                     _e(g["severity"]), _e(g["stack"]), model, _e(g["gate"]), _e(g["measured"]),
                     _e(g["threshold"]), f"<code>{_e(g['evidence'])}</code>"])
    return _table(["status", "severity", "stack", "model", "gate", "measured", "threshold", "evidence"], rows,
                  raw=True)


# ----------------------------------------------------------------------------- plots
def _figure(figure_id: str, title: str, png: str) -> str:
    return (f"<figure id='{figure_id}'><img alt='{_e(title)}' src='{png}'>"
            f"<figcaption>{_e(title)}</figcaption></figure>")


def _figures(results: dict[str, Any], report_dir: Path) -> Iterable[tuple[str, str, str]]:
    models = results["models"]
    stacks = list(results["stacks"])
    gates = results.get("settings", {}).get("gates", {})
    threshold = float((gates.get("latency") or {}).get("max-ratio", 1.05))
    max_rel_l2 = float((gates.get("numerics") or {}).get("max-rel-l2", 1e-4))
    min_snr_db = float((gates.get("quantized") or {}).get("min-snr-db", 20.0))
    plots = [
        ("plot-latency", "Latency: median per call of every method, per model and stack",
         _latency_plot(models, stacks)),
        ("plot-latency-ratio", f"Latency ratio candidate / baseline with its 95% interval (the gate fails when "
         f"the whole interval is above {threshold:g})", _ratio_plot(models, threshold)),
        ("plot-numerics", "Numerics: SNR and relative L2 error of each candidate artifact against the reference",
         _numerics_plot(models, max_rel_l2, min_snr_db)),
        ("plot-stages", "Export success: every stage of every model in every stack", _stage_matrix(models, stacks)),
        ("plot-size-memory", "Artifact size and runtime memory", _size_memory_plot(models, stacks)),
    ]
    for figure_id, title, figure in plots:
        if figure is not None:
            yield figure_id, title, figure


def _png(figure: Any) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    plt.close(figure)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _latency_plot(models: list[dict[str, Any]], stacks: list[str]) -> str | None:
    threads = sorted({int(t) for m in models for s in m["stacks"].values() for t in s["measured"]})
    if not threads:
        return None
    names = [m["model"] for m in models]
    figure, axes = plt.subplots(1, len(threads), figsize=(5 + 4 * len(threads), 0.35 * len(names) + 1.5),
                                squeeze=False, sharey=True)
    for ax, count in zip(axes[0], threads):
        height = 0.8 / len(stacks)
        for i, stack in enumerate(stacks):
            values = [_p50_sum(m["stacks"].get(stack, {}).get("measured", {}).get(str(count))) for m in models]
            positions = np.arange(len(names)) + i * height
            ax.barh(positions, [v or 0 for v in values], height=height, label=stack)
        ax.set_yticks(np.arange(len(names)) + 0.4 - height / 2, names)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set_xlabel("ms per call (median; sum over methods)")
        ax.set_title(f"{count} thread(s)")
        ax.grid(axis="x", alpha=0.3)
    axes[0][0].legend(loc="lower right")
    return _png(figure)


def _p50_sum(measured: dict[str, Any] | None) -> float | None:
    if not measured or measured.get("status") != "ok" or not measured.get("latency"):
        return None
    return sum(lat["p50_ms"] for lat in measured["latency"].values())


def _ratio_plot(models: list[dict[str, Any]], threshold: float) -> str | None:
    rows = [(f"{m['model']} · {r['method']} · {r['threads']}t ({r['stack']})", r)
            for m in models for r in m["latency_ratios"]]
    if not rows:
        return None
    figure, ax = plt.subplots(figsize=(9, 0.28 * len(rows) + 1.2))
    y = np.arange(len(rows))
    # Red: the whole interval is above the threshold; amber: it straddles it.
    colours = ["#cf222e" if r["low"] > threshold else "#9a6700" if r["high"] > threshold else "#1a7f37"
               for _, r in rows]
    ax.hlines(y, [r["low"] for _, r in rows], [r["high"] for _, r in rows], colors=colours, lw=2)
    ax.scatter([r["median"] for _, r in rows], y, c=colours, zorder=3)
    ax.axvline(1.0, color="#57606a", lw=0.8)
    ax.axvline(threshold, color="#cf222e", lw=0.8, ls="--", label=f"threshold {threshold:g}")
    ax.set_yticks(y, [label for label, _ in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("candidate / baseline latency (log scale; < 1 is faster)")
    ax.legend(loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    return _png(figure)


def _numerics_plot(models: list[dict[str, Any]], max_rel_l2: float, min_snr_db: float) -> str | None:
    rows = []
    for m in models:
        for c in m["comparisons"]:
            if not c["actual"].startswith("artifact(") or c["actual"] == "artifact(" + _baseline(m) + ")":
                continue
            if c["reference"] != f"eager({_baseline(m)})" or not c["outputs"]:
                continue
            snr = _values(c, "snr_db")
            rel = _values(c, "rel_l2")
            if snr and rel:
                rows.append((f"{m['model']} ({_SIDE.match(c['actual']).group(2)})", min(snr), max(rel)))  # type: ignore[union-attr]
    if not rows:
        return None
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 0.32 * len(rows) + 1.4), sharey=True)
    y = np.arange(len(rows))
    snr = [min(r[1], 200.0) for r in rows]  # an exact match is +inf dB
    left.barh(y, snr, color=["#cf222e" if s < min_snr_db else "#2da44e" for s in snr])
    left.axvline(min_snr_db, color="#57606a", ls="--", lw=0.8, label=f"{min_snr_db:g} dB (quantized gate)")
    left.set_xlabel("worst output SNR (dB; higher is closer)")
    left.legend(loc="lower right")
    left.set_yticks(y, [r[0] for r in rows], fontsize=8)
    left.invert_yaxis()
    right.barh(y, [max(r[2], 1e-12) for r in rows], color="#0969da")
    right.set_xscale("log")
    right.axvline(max_rel_l2, color="#57606a", ls="--", lw=0.8, label=f"{max_rel_l2:g} (float numerics gate)")
    right.set_xlabel("worst output relative L2 error (log)")
    right.legend(loc="lower right")
    for ax in (left, right):
        ax.grid(axis="x", alpha=0.3)
    return _png(figure)


def _baseline(model: dict[str, Any]) -> str:
    return next(iter(model["stacks"]))


def _stage_matrix(models: list[dict[str, Any]], stacks: list[str]) -> str | None:
    columns: list[tuple[str, str]] = []
    for stack in stacks:
        seen = {s["stage"] for m in models for s in m["stacks"].get(stack, {}).get("stages", [])}
        columns += [(stack, stage) for stage in (*EXPORT_STAGES, *RUNTIME_STAGES) if stage in seen]
    if not columns:
        return None
    grid = np.zeros((len(models), len(columns)), dtype=int)
    for i, m in enumerate(models):
        for j, (stack, stage) in enumerate(columns):
            found = next((s for s in m["stacks"].get(stack, {}).get("stages", []) if s["stage"] == stage), None)
            grid[i, j] = STAGE_CODES.get(found["status"], 3) if found else 0
    figure, ax = plt.subplots(figsize=(0.42 * len(columns) + 3, 0.32 * len(models) + 2.2))
    ax.imshow(grid, cmap=ListedColormap(STAGE_COLOURS), vmin=0, vmax=3, aspect="auto")
    ax.set_xticks(np.arange(len(columns)), [f"{stack}: {stage}" for stack, stage in columns], rotation=70,
                  ha="right", fontsize=8)
    ax.set_yticks(np.arange(len(models)), [m["model"] for m in models], fontsize=8)
    ax.set_xticks(np.arange(len(columns) + 1) - 0.5, minor=True)
    ax.set_yticks(np.arange(len(models) + 1) - 0.5, minor=True)
    ax.grid(which="minor", color="#ffffff", lw=1.5)
    ax.tick_params(which="minor", length=0)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in STAGE_COLOURS[1:]]
    ax.legend(handles, ["ok", "skipped", "failed"], loc="upper left", bbox_to_anchor=(1.01, 1))
    return _png(figure)


def _size_memory_plot(models: list[dict[str, Any]], stacks: list[str]) -> str | None:
    names = [m["model"] for m in models]
    sizes = {s: [(m["stacks"].get(s, {}).get("artifact") or {}).get("bytes") for m in models] for s in stacks}
    memory = {s: [m["stacks"].get(s, {}).get("runtime_memory_bytes") for m in models] for s in stacks}
    if not any(v for values in sizes.values() for v in values):
        return None
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 0.35 * len(names) + 1.5), sharey=True)
    height = 0.8 / len(stacks)
    for ax, data, label in ((left, sizes, "artifact size (MB, log)"), (right, memory, "runtime memory (MB, log)")):
        for i, stack in enumerate(stacks):
            ax.barh(np.arange(len(names)) + i * height, [(v or 0) / 1e6 for v in data[stack]], height=height,
                    label=stack)
        ax.set_xscale("log")
        ax.set_xlabel(label)
        ax.grid(axis="x", alpha=0.3)
    left.set_yticks(np.arange(len(names)) + 0.4 - height / 2, names, fontsize=8)
    left.invert_yaxis()
    left.legend(loc="lower right")
    return _png(figure)


def _error_histogram(report_dir: Path, model: dict[str, Any], gate: dict[str, Any]) -> str | None:
    """|actual − reference| of the gate's worst output, from the arrays the stacks wrote."""
    comparison = next((c for c in model["comparisons"]
                       if f"{c['actual']} vs {c['reference']}" == gate["evidence"]), None)
    if comparison is None or not comparison.get("worst_output"):
        return None
    output = comparison["worst_output"]
    arrays = []
    for side in (comparison["actual"], comparison["reference"]):
        match = _SIDE.match(side)
        record = model["stacks"].get(match.group(2)) if match else None
        if record is None:
            return None
        file = report_dir / record["record_dir"] / f"{match.group(1)}.npz"  # type: ignore[union-attr]
        try:
            with np.load(file) as data:
                arrays.append(np.asarray(data[output], dtype=np.float64))
        except (OSError, KeyError, ValueError):
            return None
    actual, reference = arrays
    if actual.shape != reference.shape:
        return None
    error = (actual - reference).ravel()
    figure, ax = plt.subplots(figsize=(7, 2.6))
    ax.hist(error[np.isfinite(error)], bins=80, color="#cf222e")
    ax.set_yscale("log")
    ax.set_xlabel(f"{output}: actual − reference ({gate['evidence']})")
    ax.set_ylabel("elements")
    ax.grid(alpha=0.3)
    return _png(figure)


# ----------------------------------------------------------------------------- per model
def _model_section(model: dict[str, Any], gates: list[dict[str, Any]], report_dir: Path) -> list[str]:
    name = model["model"]
    lines = [f"<section id='{_anchor(name)}'><h3>{_e(name)}</h3>"]
    if model.get("description"):
        lines.append(f"<p>{_e(model['description'])}</p>")
    if gates:
        lines += _gate_table(gates, link=False)
    for gate in gates:
        if gate["gate"] in NUMERIC_GATES and gate["status"] == "FAILED":
            figure = _error_histogram(report_dir, model, gate)
            if figure:
                title = f"Error of {gate['stack']}'s worst output ({gate['gate']} failed: {gate['measured']})"
                lines.append(_figure(_id(f"error-{gate['stack']}-{name}-{gate['gate']}"), title, figure))
    lines.append("<h4>Stages</h4>")
    rows = []
    for stack, record in model["stacks"].items():
        for s in record["stages"]:
            why = (s.get("error") or {}).get("message") or s.get("reason") or ""
            rows.append([stack, s["stage"], s["status"], _seconds(s.get("duration_s")), _short(why, 300)])
    lines += _table(["stack", "stage", "status", "time", "reason or error"], rows)
    comparisons = [c for c in model["comparisons"] if c.get("outputs")]
    if comparisons:
        lines.append("<h4>Numerics</h4>")
        lines += _table(["comparison", "purpose", "worst output", "rel L2", "SNR dB", "cosine"], [
            [f"{c['actual']} vs {c['reference']}", c["purpose"], c.get("worst_output") or "",
             _num(from_json_float(c.get("worst_rel_l2"))), _num(_worst(c, "snr_db", min), "{:.1f}"),
             _num(_worst(c, "cosine", min), "{:.6f}")] for c in comparisons])
    latency_rows = []
    for stack, record in model["stacks"].items():
        for threads, measured in sorted(record["measured"].items()):
            for method, lat in (measured.get("latency") or {}).items():
                latency_rows.append([stack, threads, method, _num(lat["p50_ms"], "{:.3f}"),
                                     _num(lat["p90_ms"], "{:.3f}"), str(lat["runs"])])
    if latency_rows:
        lines.append("<h4>Latency (ms)</h4>")
        lines += _table(["stack", "threads", "method", "p50", "p90", "runs"], latency_rows)
    if model["latency_ratios"]:
        lines += _table(["stack", "threads", "method", "ratio", "95% interval"], [
            [r["stack"], str(r["threads"]), r["method"], _num(r["median"], "{:.3f}"),
             f"[{r['low']:.3f}, {r['high']:.3f}]"] for r in model["latency_ratios"]])
    sizes = [[stack, _mb((record.get("artifact") or {}).get("bytes")), _mb(record.get("runtime_memory_bytes"))]
             for stack, record in model["stacks"].items()]
    lines.append("<h4>Size and memory</h4>")
    lines += _table(["stack", "artifact", "runtime memory"], sizes)
    lines.append("</section>")
    return lines


def _values(comparison: dict[str, Any], key: str) -> list[float]:
    """One metric of every output, "inf" and "nan" (results.json's spelling) as floats; NaN left out."""
    values = [from_json_float(o.get(key)) for o in comparison["outputs"] or []]
    return [v for v in values if v is not None and not math.isnan(v)]


def _worst(comparison: dict[str, Any], key: str, pick: Any) -> float | None:
    values = _values(comparison, key)
    return pick(values) if values else None


def _project_section(project: dict[str, Any], baseline: str, gates: list[dict[str, Any]]) -> list[str]:
    """The team's tests per stack, what changed per test (each newly failing test's message), the scan's findings."""
    lines = [f"<section id='{_anchor('project')}'><h2>Project compatibility</h2>",
             f"<p>The team's project at <code>{_e(project['root'])}</code>, installed into each stack "
             f"(<code>{_e(' '.join(project['install']))}</code>) and tested with "
             f"<code>{_e(' '.join(project['test']))}</code>.</p>"]
    lines += _gate_table(gates, link=False)
    rows = []
    for stack, tests in project["stacks"].items():
        count = tests.get("counts") or {}
        run = tests.get("run") or {}
        rows.append([stack, run.get("status", "did not run"), *[count.get(k, 0) for k in
                                                                ("passed", "failed", "error", "skipped")],
                     _seconds(run.get("duration_s")), tests.get("problem") or tests.get("junit")])
    lines += _table(["stack", "run", "passed", "failed", "errors", "skipped", "time", "outcomes"], rows)
    for stack, diff in project["diffs"].items():
        lines.append(f"<h3>Tests: {_e(stack)} against {_e(baseline)}</h3>")
        for group, title in DIFF_GROUPS:
            changes = diff.get(group) or []
            if not changes:
                continue
            lines.append(f"<p>{_e(title.format(base=baseline, stack=stack))}: {len(changes)}</p>")
            lines += _table(["test", baseline, stack, "message", "allow-list"], [
                [f"<code>{_e(c['test'])}</code>", _e(c["baseline"]), _e(c["candidate"]),
                 f"<pre>{_e(c['message'])}</pre>" if c["message"] else "", _e(c.get("allowed") or "")]
                for c in changes], raw=True)
    scan = project.get("scan")
    lines.append("<h3>API scan</h3>")
    if scan is None:
        lines.append(f"<p>Not scanned: {_e(project.get('scan_problem'))}</p>")
    else:
        lines.append(f"<p>{len(scan['findings'])} calls to change in {scan['files_scanned']} files.</p>")
        lines += _table(["where", "code", "call", "why it matters for the candidate", "replacement"], [
            [f"{f['file']}:{f['line']}", f["code"], _short(f["call"], 120), f.get("why") or f.get("summary", ""),
             f.get("replacement") or ""] for f in scan["findings"]])
    lines.append("</section>")
    return lines


def _stacks_section(stacks: dict[str, Any]) -> list[str]:
    lines = ["<h2 id='stacks'>Stacks</h2>"]
    for name, info in stacks.items():
        installed = (info or {}).get("installed") or {}
        distributions = installed.get("distributions") or {}
        lines.append(f"<p><b>{_e(name)}</b>: " + ", ".join(f"{_e(k)} {_e(v)}" for k, v in sorted(
            distributions.items()) if k in ("torch", "torchvision", "executorch", "torchao", "numpy")) + "</p>")
    return lines


# ----------------------------------------------------------------------------- HTML helpers
def _table(header: list[str], rows: list[list[str]], *, raw: bool = False) -> list[str]:
    cell = (lambda v: v) if raw else _e
    lines = ["<table><thead><tr>" + "".join(f"<th>{_e(h)}</th>" for h in header) + "</tr></thead><tbody>"]
    lines += ["<tr>" + "".join(f"<td>{cell(str(v))}</td>" for v in row) + "</tr>" for row in rows]
    lines.append("</tbody></table>")
    return lines


def _anchor(model: str) -> str:
    return "model-" + _id(model)


def _id(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "-", text)


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _num(value: float | None, fmt: str = "{:.2e}") -> str:
    if value is None:
        return "—"
    if isinstance(value, float) and math.isinf(value):
        return "∞" if value > 0 else "−∞"
    return fmt.format(value)


def _seconds(value: float | None) -> str:
    return "" if value is None else f"{value:.1f} s"


def _mb(count: int | None) -> str:
    return "—" if count is None else f"{count / 1e6:.2f} MB"


def _short(text: str, limit: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>
body {{ font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1200px; padding: 0 1em; color: #1f2328; }}
.verdict {{ color: #fff; font-size: 1.8em; font-weight: 700; padding: .4em .8em; border-radius: 6px; display: inline-block; }}
table {{ border-collapse: collapse; margin: .6em 0; font-size: 12px; }}
th, td {{ border: 1px solid #d0d7de; padding: 3px 6px; text-align: left; vertical-align: top; }}
th {{ background: #f6f8fa; }}
.pass {{ color: #1a7f37; }} .fail {{ color: #cf222e; font-weight: 700; }} .unsure {{ color: #9a6700; }}
.warning {{ color: #9a6700; }} .meta {{ color: #57606a; }}
figure {{ margin: 1em 0; }} figure img {{ max-width: 100%; }} figcaption {{ color: #57606a; }}
section {{ border-top: 1px solid #d0d7de; margin-top: 1.5em; }}
</style></head>
<body>
{body}
</body></html>
"""
