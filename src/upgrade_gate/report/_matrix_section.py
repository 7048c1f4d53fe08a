"""The report's matrix: each factor the gates judge, by stack, with the mark of the gate that judged it."""

from __future__ import annotations

import math
from collections.abc import Callable

from upgrade_gate.report._verdict_section import WHERE_MEASURED
from upgrade_gate.report.render import mark as status_mark
from upgrade_gate.schema.comparison import Side
from upgrade_gate.schema.measured import RatioEstimate
from upgrade_gate.schema.project import ProjectResults
from upgrade_gate.schema.results import ModelResults, Results, StackInfo
from upgrade_gate.schema.verdict import GateResult, GateStatus
from upgrade_gate.text import num, short, size


def matrix_rows(results: Results) -> list[list[str]]:
    names = list(results.stacks)
    gates = results.verdict.gates
    base = results.baseline.name

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
    rows += _latency_rows(results, mark)
    task_gates = sorted({g.gate for g in gates if g.gate.startswith("task-")})
    if task_gates:
        rows.append(["Task agreement (vs reference; worst model)", *[
            "" if n == base else _task_summary([g for g in gates if g.stack == n and g.gate in task_gates])
            + "".join(mark(n, t) for t in task_gates) for n in names]])
    return rows + _size_rows(results, mark)


def _latency_rows(results: Results, mark: Callable[[str, str], str]) -> list[list[str]]:
    """Where latency was measured, and each candidate's ratios: this machine's, then each device's."""
    names, base = list(results.stacks), results.baseline.name
    rows = []
    target = results.measured_on
    if target is not None:
        rows.append([f"Latency, cold start and memory measured on ([where](#{WHERE_MEASURED}))",
                     *[target.described for _ in names]])
    on = f" on {target.name}" if target is not None else ""
    for threads in results.settings.threads:
        rows.append([f"Latency at {threads} thread(s){on}, candidate/baseline per method ([table](#latency))", *[
            ("" if n == base else _latency_summary(results.models, n, threads)) + mark(n, "latency") for n in names]])
    for device in results.device_targets:
        for threads in sorted({d.threads for m in results.models for d in m.device_latency
                               if d.target.name == device.name}):
            rows.append([f"Latency at {threads} thread(s) on {device.name} ([where](#{WHERE_MEASURED}))", *[
                ("" if n == base else _device_summary(results.models, n, device.name, threads))
                + mark(n, "device-latency") for n in names]])
        if any(d.target.name == device.name for m in results.models for d in m.device_memory):
            rows.append([f"Runtime memory and cold start on {device.name} ([where](#{WHERE_MEASURED}))", *[
                ("" if n == base else _device_memory_summary(results.models, n, device.name))
                + mark(n, "device-memory") for n in names]])
    return rows


def _size_rows(results: Results, mark: Callable[[str, str], str]) -> list[list[str]]:
    """The artifact's size, cold start and memory, the project's tests, and the verdict."""
    names, base = list(results.stacks), results.baseline.name
    rows = []
    rows.append(["Artifact size (largest)", *[
        size(max((m.stacks[n].artifact_bytes or 0 for m in results.models), default=0)) + mark(n, "artifact-size")
        for n in names]])
    rows.append(["Cold start at first use: load + first run (slowest model)", *[
        _slowest_cold_start(results.models, n) for n in names]])
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
    rows.append(["Verdict", *["baseline" if n == base else f"**{results.verdict.candidates[n]}**" for n in names]])
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
    """The least delegated method, by name; a method with no operator node at all is none a delegate could
    take (0 of 0 is no 0.0%): counted apart."""
    found = [(d.share, m.name, method, d.delegated_nodes + d.portable_nodes) for m in models
             for method, d in m.stacks[stack].delegation.items()]
    if not found:
        return "— (no delegate)"
    with_nodes = [f for f in found if f[3]]
    empty = len(found) - len(with_nodes)
    aside = f"; {empty} method{'s' if empty > 1 else ''} with no operator node to delegate" if empty else ""
    if not with_nodes:
        return f"— ({empty} method{'s' if empty > 1 else ''}, none with an operator node to delegate)"
    share, model, method, _ = min(with_nodes)
    return f"{share:.1%} ({model} · {method})" + aside


def _latency_summary(models: tuple[ModelResults, ...], stack: str, threads: int) -> str:
    """A candidate's latency at a thread count in a line (``_typical``), and the models a busy machine left untimed."""
    estimates = [e for m in models if m.busy_at(threads) is None for e in m.ratios_of(stack, threads)]
    busy = sum(1 for m in models if m.busy_at(threads) is not None and m.ratios_of(stack, threads))
    aside = f"; {busy} model{'s' if busy > 1 else ''} not timed: machine busy" if busy else ""
    return _typical(estimates) + aside


def _device_summary(models: tuple[ModelResults, ...], stack: str, target: str, threads: int) -> str:
    """A candidate's latency on a device at a thread count, as the host's line says it; what was not judged."""
    rows = [d for m in models for d in m.device_latency
            if (d.stack, d.target.name, d.threads) == (stack, target, threads)]
    estimates = [d.estimate for d in rows if d.estimate is not None]
    unjudged = len(rows) - len(estimates)
    return _typical(estimates) + (f"; {unjudged} method{'s' if unjudged > 1 else ''} not judged" if unjudged else "")


def _device_memory_summary(models: tuple[ModelResults, ...], stack: str, target: str) -> str:
    """A candidate's largest memory ratio on a target and its slowest cold start against the baseline's there."""
    rows = [(m.name, d) for m in models for d in m.device_memory if (d.stack, d.target.name) == (stack, target)]
    ratios = [(d.candidate_bytes / d.baseline_bytes, name) for name, d in rows
              if d.candidate_bytes is not None and d.baseline_bytes]
    said = [f"memory up to ×{max(ratios)[0]:.2f} ({max(ratios)[1]})" if ratios else "memory not read"]
    if rows:
        name, slowest = max(rows, key=lambda row: row[1].candidate_cold_ms)
        said.append(f"cold start up to {slowest.candidate_cold_ms:.0f} ms against {slowest.baseline_cold_ms:.0f} ms "
                    f"({name})")
    return "; ".join(said)


def _typical(estimates: list[RatioEstimate]) -> str:
    """The geometric mean of the medians, and how many intervals call the candidate faster, slower or not told apart."""
    if not estimates:
        return "no ratio"
    typical = math.exp(sum(math.log(e.median) for e in estimates) / len(estimates))
    faster = sum(1 for e in estimates if e.holds and e.high < 1)
    slower = sum(1 for e in estimates if e.holds and e.low > 1)
    unsure = len(estimates) - faster - slower
    methods = f"{len(estimates)} method{'s' if len(estimates) > 1 else ''}"
    return f"×{typical:.2f} typical over {methods}: {faster} faster, {slower} slower, {unsure} not told apart"


def _task_summary(gates: list[GateResult]) -> str:
    """How many task gates passed, and the worst one's figure (the one nearest its threshold fails first)."""
    if not gates:
        return ""
    passed = sum(1 for g in gates if g.status is GateStatus.PASSED)
    worst = next((g for g in gates if g.status is not GateStatus.PASSED), gates[0])
    return f"{passed}/{len(gates)} passed; {'worst' if passed < len(gates) else 'e.g.'} {worst.model}: " + short(
        worst.measured_text, 160)


def _slowest_cold_start(models: tuple[ModelResults, ...], stack: str) -> str:
    timed = [(m.load_ms + m.first_run_ms, m.load_ms, m.first_run_ms, model.name) for model in models
             if (m := next(iter(model.stacks[stack].measured.values()), None)) is not None
             and m.load_ms is not None and m.first_run_ms is not None]
    if not timed:
        return "—"
    _, load, first, name = max(timed)
    return f"{load:.0f} + {first:.0f} ms ({name})"


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
    calls = f"{len(project.scan.to_change)} calls to migrate" if project.scan else "not scanned"
    return (f"{ran}; {len(newly) - accepted} newly failing" + (f" (+{accepted} accepted)" if accepted else "")
            + f", {len(diff.newly_passing) if diff else 0} newly passing; {calls}")
