"""report.html's figures, drawn with matplotlib and embedded as PNG data: URIs (the page fetches nothing); each a
data URI, or None when there is nothing to plot. Imported only when a page is drawn: matplotlib's font-cache
chatter would fill nox's DEBUG log.
"""

from __future__ import annotations

import base64
import io
import logging
import math
from pathlib import Path
from typing import Any

logging.getLogger("matplotlib").setLevel(logging.WARNING)

import matplotlib  # noqa: E402 - after its logger is quieted

matplotlib.use("Agg")  # no display

import matplotlib.pyplot as plt  # noqa: E402 - after the backend is chosen
import numpy as np  # noqa: E402
from matplotlib.colors import ListedColormap  # noqa: E402

from upgrade_gate.schema.comparison import Side  # noqa: E402
from upgrade_gate.schema.results import ModelResults, Results  # noqa: E402
from upgrade_gate.schema.verdict import GateResult  # noqa: E402
from upgrade_gate.stages import EXPORT_STAGES, RUNTIME_STAGES, STAGE_STATUSES  # noqa: E402

# Export-success matrix cells: absent, ok, skipped, did not succeed.
STAGE_COLOURS = ["#ffffff", "#2da44e", "#d0d7de", "#cf222e"]
STAGE_CODES = {status: 1 if status == "ok" else 2 if status == "skipped" else 3 for status in STAGE_STATUSES}
# An exact match is +inf dB: drawn at this height.
SNR_CAP_DB = 200.0


def _png(figure: Any) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    plt.close(figure)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def latency(results: Results) -> str | None:
    threads = list(results.settings.threads)
    models, stacks = results.models, list(results.stacks)
    if not any(m.stacks[s].measured[t].latency for m in models for s in stacks for t in threads):
        return None
    names = [m.name for m in models]
    figure, axes = plt.subplots(1, len(threads), figsize=(5 + 4 * len(threads), 0.35 * len(names) + 1.5),
                                squeeze=False, sharey=True)
    height = 0.8 / len(stacks)
    for ax, count in zip(axes[0], threads):
        for i, stack in enumerate(stacks):
            values = [m.stacks[stack].measured[count].p50_sum_ms or 0 for m in models]
            ax.barh(np.arange(len(names)) + i * height, values, height=height, label=stack)
        ax.set_yticks(np.arange(len(names)) + 0.4 - height / 2, names)
        ax.invert_yaxis()
        _log_scale(ax, [v for stack in stacks for v in (m.stacks[stack].measured[count].p50_sum_ms or 0
                                                         for m in models)])
        ax.set_xlabel("ms per call (median; sum over methods)")
        ax.set_title(f"{count} thread(s)")
        ax.grid(axis="x", alpha=0.3)
    axes[0][0].legend(loc="lower right")
    return _png(figure)


def _log_scale(ax: Any, values: list[float]) -> None:
    """A log x-axis where there is a positive value to put on it (matplotlib warns "Data has no positive
    values" on the console otherwise: a stack that measured nothing), else the linear one."""
    if any(v > 0 for v in values):
        ax.set_xscale("log")


def ratios(results: Results) -> str | None:
    # A ratio of the few quiet rounds a busy machine left is no judgement: not drawn (the verdict says why).
    rows = [(f"{m.name} · {r.method} · {r.threads}t ({r.stack})", r.estimate) for m in results.models for r in m.ratios
            if m.busy_at(r.threads) is None]
    if not rows:
        return None
    thresholds = [g.threshold.value for g in results.verdict.gates if g.gate == "latency" and g.threshold]
    threshold = max(thresholds) if thresholds else None
    figure, ax = plt.subplots(figsize=(9, 0.28 * len(rows) + 1.2))
    y = np.arange(len(rows))
    # Red: the whole interval is above the threshold; amber: it straddles it.
    colours = ["#1a7f37" if threshold is None or e.high <= threshold else "#cf222e" if e.low > threshold else "#9a6700"
               for _, e in rows]
    ax.hlines(y, [e.low for _, e in rows], [e.high for _, e in rows], colors=colours, lw=2)
    ax.scatter([e.median for _, e in rows], y, c=colours, zorder=3)
    ax.axvline(1.0, color="#57606a", lw=0.8)
    if threshold is not None:
        ax.axvline(threshold, color="#cf222e", lw=0.8, ls="--", label=f"threshold {threshold:g}")
        ax.legend(loc="lower right")
    ax.set_yticks(y, [label for label, _ in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("candidate / baseline latency (log scale; < 1 is faster)")
    ax.grid(axis="x", alpha=0.3)
    return _png(figure)


def numerics(results: Results) -> str | None:
    base = results.baseline.name
    reference = Side(stack=base, kind="eager")
    rows = []
    for m in results.models:
        for stack in m.stacks:
            comparison = m.comparison(Side(stack=stack, kind="artifact"), reference) if stack != base else None
            outputs = comparison.comparable_outputs if comparison else ()
            snr = [o.snr_db for o in outputs if o.snr_db is not None and not math.isnan(o.snr_db)]
            rel = [o.rel_l2 for o in outputs if o.rel_l2 is not None and not math.isnan(o.rel_l2)]
            if snr and rel:
                rows.append((f"{m.name} ({stack})", min(snr), max(rel)))
    if not rows:
        return None
    quantized = [g.threshold.value for g in results.verdict.gates if g.gate == "quantized-numerics" and g.threshold]
    floats = [g.threshold.value for g in results.verdict.gates if g.gate == "numerics" and g.threshold]
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 0.32 * len(rows) + 1.4), sharey=True)
    y = np.arange(len(rows))
    snr_shown = [min(r[1], SNR_CAP_DB) for r in rows]
    min_snr = min(quantized) if quantized else None
    left.barh(y, snr_shown, color=["#cf222e" if min_snr is not None and s < min_snr else "#2da44e" for s in snr_shown])
    if min_snr is not None:
        left.axvline(min_snr, color="#57606a", ls="--", lw=0.8, label=f"{min_snr:g} dB (quantized gate)")
        left.legend(loc="lower right")
    left.set_xlabel("worst output SNR (dB; higher is closer)")
    left.set_yticks(y, [r[0] for r in rows], fontsize=8)
    left.invert_yaxis()
    right.barh(y, [max(r[2], 1e-12) for r in rows], color="#0969da")
    right.set_xscale("log")
    if floats:
        right.axvline(max(floats), color="#57606a", ls="--", lw=0.8, label=f"{max(floats):g} (float numerics gate)")
        right.legend(loc="lower right")
    right.set_xlabel("worst output relative L2 error (log)")
    for ax in (left, right):
        ax.grid(axis="x", alpha=0.3)
    return _png(figure)


def stages(results: Results) -> str | None:
    models = results.models
    columns: list[tuple[str, str]] = []
    for stack in results.stacks:
        seen = {s.stage for m in models for s in m.stacks[stack].stages}
        columns += [(stack, stage) for stage in (*EXPORT_STAGES, *RUNTIME_STAGES) if stage in seen]
    if not columns:
        return None
    grid = np.zeros((len(models), len(columns)), dtype=int)
    for i, m in enumerate(models):
        for j, (stack, stage) in enumerate(columns):
            found = m.stacks[stack].stage(stage)
            grid[i, j] = STAGE_CODES[found.status] if found else 0
    figure, ax = plt.subplots(figsize=(0.42 * len(columns) + 3, 0.32 * len(models) + 2.2))
    ax.imshow(grid, cmap=ListedColormap(STAGE_COLOURS), vmin=0, vmax=3, aspect="auto")
    ax.set_xticks(np.arange(len(columns)), [f"{stack}: {stage}" for stack, stage in columns], rotation=70,
                  ha="right", fontsize=8)
    ax.set_yticks(np.arange(len(models)), [m.name for m in models], fontsize=8)
    ax.set_xticks(np.arange(len(columns) + 1) - 0.5, minor=True)
    ax.set_yticks(np.arange(len(models) + 1) - 0.5, minor=True)
    ax.grid(which="minor", color="#ffffff", lw=1.5)
    ax.tick_params(which="minor", length=0)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in STAGE_COLOURS[1:]]
    ax.legend(handles, ["ok", "skipped", "did not succeed"], loc="upper left", bbox_to_anchor=(1.01, 1))
    return _png(figure)


def size_memory(results: Results) -> str | None:
    models, stacks = results.models, list(results.stacks)
    names = [m.name for m in models]
    sizes = {s: [m.stacks[s].artifact_bytes or 0 for m in models] for s in stacks}
    memory = {s: [m.stacks[s].runtime_memory_bytes or 0 for m in models] for s in stacks}
    if not any(v for values in sizes.values() for v in values):
        return None
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 0.35 * len(names) + 1.5), sharey=True)
    height = 0.8 / len(stacks)
    for ax, data, label in ((left, sizes, "artifact size (MiB, log)"), (right, memory, "runtime memory (MiB, log)")):
        for i, stack in enumerate(stacks):
            ax.barh(np.arange(len(names)) + i * height, [v / 2**20 for v in data[stack]], height=height, label=stack)
        _log_scale(ax, [v for values in data.values() for v in values])
        ax.set_xlabel(label)
        ax.grid(axis="x", alpha=0.3)
    left.set_yticks(np.arange(len(names)) + 0.4 - height / 2, names, fontsize=8)
    left.invert_yaxis()
    left.legend(loc="lower right")
    return _png(figure)


def error_histogram(results: Results, report_dir: Path, model: ModelResults, gate: GateResult) -> str | None:
    """actual − reference of the gate's worst output, from the arrays the stacks wrote."""
    try:
        actual, reference = (Side.parse(side) for side in gate.evidence.split(" vs "))
    except ValueError:
        return None
    comparison = model.comparison(actual, reference)
    worst = comparison.worst_output if comparison else None
    if worst is None:
        return None
    arrays = []
    for side in (actual, reference):
        file = report_dir / model.stacks[side.stack].record_dir / f"{side.kind}.npz"
        try:
            with np.load(file) as data:
                arrays.append(np.asarray(data[worst.name], dtype=np.float64))
        except (OSError, KeyError, ValueError):
            return None
    if arrays[0].shape != arrays[1].shape:
        return None
    error = (arrays[0] - arrays[1]).ravel()
    figure, ax = plt.subplots(figsize=(7, 2.6))
    ax.hist(error[np.isfinite(error)], bins=80, color="#cf222e")
    ax.set_yscale("log")
    ax.set_xlabel(f"{worst.name}: actual − reference ({gate.evidence})")
    ax.set_ylabel("elements")
    ax.grid(alpha=0.3)
    return _png(figure)
