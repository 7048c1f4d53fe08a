"""What changed between two reports (`nox -s diff -- OLD NEW`): the verdict, every gate whose status
moved, and the metrics that moved beyond their noise (each threshold below; docs/ci.md says them in words).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

from upgrade_gate.errors import ConfigError
from upgrade_gate.invocation import command
from upgrade_gate.report.render import markdown_table
from upgrade_gate.schema.results import ModelResults, Results
from upgrade_gate.schema.verdict import GateResult
from upgrade_gate.text import size

# How far the median latency ratio of an unchanged stack moves between runs on the reference
# machine: over five fresh measurements of an identical copy on a quiet machine, one row's median
# moved by up to 8.8% (`nox -s benchmark -- noise`, 2026-11-25, docs/benchmarks-log.md).
RUN_TO_RUN = 0.09
NUMERICS_FACTOR = 2.0
NUMERICS_FLOOR = 1e-6  # float round-off moves between machines by less
SIZE_CHANGE = 0.01
MEMORY_CHANGE = 0.10
MEMORY_FLOOR_BYTES = 16 * 2**20  # a process's resident memory moves by a few MiB from run to run
REFERENCE_PURPOSE = "candidate artifact vs reference"


def diff(old: Results, new: Results, old_path: Path, new_path: Path) -> list[str]:
    """The changes as Markdown lines, most important first."""
    lines = [f"# upgrade-gate diff: {old_path} → {new_path}", ""]
    ov, nv = old.verdict, new.verdict
    moved = "unchanged" if ov.verdict == nv.verdict else "changed"
    lines.append(f"**Verdict: {ov.verdict} → {nv.verdict}** ({moved}; {ov.generated_at} → {nv.generated_at}, "
                 f"upgrade-gate {ov.tool_version} → {nv.tool_version})")
    for stack in sorted(set(ov.candidates) | set(nv.candidates)):
        before, after = ov.candidates.get(stack), nv.candidates.get(stack)
        if before != after:
            lines.append(f"- {stack}: {before or '—'} → {after or '—'}")
    old_models, new_models = {m.name: m for m in old.models}, {m.name: m for m in new.models}
    added = sorted(set(new_models) - set(old_models))
    removed = sorted(set(old_models) - set(new_models))
    if added or removed:
        lines += ["", f"Models added: {', '.join(added) or 'none'}; removed: {', '.join(removed) or 'none'}"]

    gate_rows = list(_gate_changes(ov.gates, nv.gates))
    lines += ["", f"## Gates that changed ({len(gate_rows)})", ""]
    lines += markdown_table(["stack", "model", "gate", "before", "after", "measured before", "measured after"],
                            gate_rows) if gate_rows else ["None."]

    metric_rows = [row for name in sorted(set(old_models) & set(new_models))
                   for row in _metric_changes(old_models[name], new_models[name])]
    lines += ["", f"## Metrics beyond noise ({len(metric_rows)})", ""]
    lines += markdown_table(["model", "metric", "before", "after", "why it counts"], metric_rows) \
        if metric_rows else ["None."]
    within = [row for name in sorted(set(old_models) & set(new_models))
              for row, beyond in _latency_moves(old_models[name], new_models[name]) if not beyond]
    if within:
        lines += ["", f"## Latency moves within run-to-run noise ({len(within)})", "",
                  f"Within one run the interval is narrow; between runs of an unchanged stack the ratio moves by up to "
                  f"±{RUN_TO_RUN:.0%} here (`nox -s benchmark -- noise`, docs/benchmarks-log.md): these are not "
                  "changes.", ""]
        lines += markdown_table(["model", "metric", "before", "after", "why it does not count"], within)
    lines.append("")
    return lines


def _gate_changes(old: tuple[GateResult, ...], new: tuple[GateResult, ...]) -> Iterator[list[str]]:
    def key(g: GateResult) -> tuple[str, str, str]:
        return g.stack, g.model, g.gate

    before, after = {key(g): g for g in old}, {key(g): g for g in new}
    for k in sorted(set(before) | set(after)):
        b, a = before.get(k), after.get(k)
        if b and a and b.status is a.status:
            continue
        yield [*k, b.status.label if b else "(absent)", a.status.label if a else "(absent)",
               b.measured_text if b else "", a.measured_text if a else ""]


def _metric_changes(old: ModelResults, new: ModelResults) -> Iterator[list[str]]:
    name = new.name
    for stack in sorted(set(old.stacks) & set(new.stacks)):
        before, after = old.stacks[stack], new.stacks[stack]
        before_stages = {s.stage: s.status for s in before.stages}
        for stage in after.stages:
            was = before_stages.get(stage.stage)
            if was is not None and was != stage.status:
                yield [name, f"{stack} stage {stage.stage}", was, stage.status, "status changed"]
        b_size, a_size = before.artifact_bytes, after.artifact_bytes
        if b_size and a_size and abs(a_size - b_size) > SIZE_CHANGE * b_size:
            yield [name, f"{stack} artifact size", f"{b_size:,} B", f"{a_size:,} B", f"> {SIZE_CHANGE:.0%}"]
        b_mem, a_mem = before.runtime_memory_bytes, after.runtime_memory_bytes
        if b_mem and a_mem and abs(a_mem - b_mem) > max(MEMORY_CHANGE * b_mem, MEMORY_FLOOR_BYTES):
            yield [name, f"{stack} runtime memory", size(b_mem), size(a_mem),
                   f"> {MEMORY_CHANGE:.0%} and > {size(MEMORY_FLOOR_BYTES)}"]
    b_rel, a_rel = _reference_error(old), _reference_error(new)
    for side in sorted(set(b_rel) & set(a_rel)):
        b, a = b_rel[side], a_rel[side]
        if max(a, b) > NUMERICS_FLOOR and (a > NUMERICS_FACTOR * b or b > NUMERICS_FACTOR * a):
            yield [name, f"rel L2 of {side} vs the reference", f"{b:.3g}", f"{a:.3g}", f"factor > {NUMERICS_FACTOR:g}"]
    yield from (row for row, beyond in _latency_moves(old, new) if beyond)


def _latency_moves(old: ModelResults, new: ModelResults) -> Iterator[tuple[list[str], bool]]:
    """Latency ratios whose intervals are apart, each with whether it moved beyond what re-runs scatter by."""
    ratios_before = {(r.stack, r.threads, r.method): r.estimate for r in old.ratios}
    for r in new.ratios:
        earlier = ratios_before.get((r.stack, r.threads, r.method))
        if earlier is None or not (r.estimate.low > earlier.high or r.estimate.high < earlier.low):
            continue
        moved = r.estimate.median / earlier.median - 1
        beyond = abs(math.log(1 + moved)) > math.log(1 + RUN_TO_RUN)
        why = (f"intervals apart, and moved {moved:+.1%}: more than runs of an unchanged stack do (±{RUN_TO_RUN:.0%})"
               if beyond else f"intervals apart, but moved {moved:+.1%}: within what runs of an unchanged stack "
                              f"scatter by (±{RUN_TO_RUN:.0%})")
        yield [new.name, f"latency ratio {r.stack} {r.method} at {r.threads} thread(s)", str(earlier),
               str(r.estimate), why], beyond


def _reference_error(model: ModelResults) -> dict[str, float]:
    return {str(c.actual): c.worst_rel_l2 for c in model.comparisons
            if c.purpose == REFERENCE_PURPOSE and c.worst_rel_l2 is not None}


def main(args: list[str], invoked_from: Path | None = None) -> str:
    """`nox -s diff -- OLD NEW`: the diff as Markdown; ConfigError for bad arguments. Relative paths
    are from ``invoked_from``, the folder the command ran in (nox runs sessions in the noxfile's)."""
    if len(args) != 2:
        raise ConfigError(f"{command('diff', 'OLD NEW')}: give two report folders (or their results.json), older first")
    old_path, new_path = ((invoked_from or Path.cwd()) / a for a in args)
    old, new = Results.load(old_path), Results.load(new_path)
    return "\n".join(diff(old, new, _folder(old_path), _folder(new_path)))


def _folder(path: Path) -> Path:
    return path if path.is_dir() else path.parent
