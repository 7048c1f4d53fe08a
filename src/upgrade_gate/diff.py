"""What changed between two reports (`nox -s diff -- OLD NEW`), for following a
migration over time: the verdict, every gate whose status moved, and the metrics
that moved by more than their noise.

"Beyond noise" per metric:
- latency ratio: the two runs' 95% intervals do not overlap;
- numerics (worst relative L2 error of an artifact against the reference): a
  factor of NUMERICS_FACTOR either way, and above NUMERICS_FLOOR (float
  round-off moves between machines by less);
- artifact size: SIZE_CHANGE of the old size;
- runtime memory: MEMORY_CHANGE of the old value and MEMORY_FLOOR_BYTES
  (a process's resident memory moves by a few MiB from run to run);
- stages: any status change.
Inputs are report folders (or their results.json).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from upgrade_gate.atomic import from_json_float
from upgrade_gate.errors import ConfigError

NUMERICS_FACTOR = 2.0
NUMERICS_FLOOR = 1e-6
SIZE_CHANGE = 0.01
MEMORY_CHANGE = 0.10
MEMORY_FLOOR_BYTES = 16 * 2**20
REFERENCE_PURPOSE = "candidate artifact vs reference"


@dataclass(frozen=True)
class Report:
    path: Path
    results: dict[str, Any]

    @property
    def verdict(self) -> dict[str, Any]:
        return self.results["verdict"]

    @property
    def models(self) -> dict[str, dict[str, Any]]:
        return {m["model"]: m for m in self.results["models"]}


def load_report(path: Path) -> Report:
    """A report folder or its results.json; ConfigError naming the file if it is not one."""
    file = path / "results.json" if path.is_dir() else path
    try:
        results = json.loads(file.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{file}: no such report; pass report folders written by `nox -s compare`") from None
    except (OSError, ValueError) as error:
        raise ConfigError(f"{file}: not a readable results.json ({error})") from None
    if not isinstance(results, dict) or "verdict" not in results or "models" not in results:
        raise ConfigError(f"{file}: not an upgrade-gate results.json (no verdict or models)")
    if str(results.get("schema_version", "")).split(".")[0] != "1":
        raise ConfigError(f"{file}: results schema {results.get('schema_version')!r}; this upgrade-gate reads 1.x")
    return Report(file.parent, results)


def diff(old: Report, new: Report) -> list[str]:
    """The changes as Markdown lines, most important first."""
    lines = [f"# upgrade-gate diff: {old.path} → {new.path}", ""]
    ov, nv = old.verdict, new.verdict
    moved = "unchanged" if ov["verdict"] == nv["verdict"] else "changed"
    lines.append(f"**Verdict: {ov['verdict']} → {nv['verdict']}** ({moved}; "
                 f"{ov['generated_at']} → {nv['generated_at']}, upgrade-gate {ov['tool_version']} → "
                 f"{nv['tool_version']})")
    for stack in sorted(set(ov["candidates"]) | set(nv["candidates"])):
        before, after = ov["candidates"].get(stack, "—"), nv["candidates"].get(stack, "—")
        if before != after:
            lines.append(f"- {stack}: {before} → {after}")
    added = sorted(set(new.models) - set(old.models))
    removed = sorted(set(old.models) - set(new.models))
    if added or removed:
        lines += ["", f"Models added: {', '.join(added) or 'none'}; removed: {', '.join(removed) or 'none'}"]

    gate_rows = list(_gate_changes(ov["gates"], nv["gates"]))
    lines += ["", f"## Gates that changed ({len(gate_rows)})", ""]
    lines += _table(["stack", "model", "gate", "before", "after", "measured before", "measured after"], gate_rows) \
        if gate_rows else ["None."]

    metric_rows = [row for model in sorted(set(old.models) & set(new.models))
                   for row in _metric_changes(model, old.models[model], new.models[model])]
    lines += ["", f"## Metrics beyond noise ({len(metric_rows)})", ""]
    lines += _table(["model", "metric", "before", "after", "why it counts"], metric_rows) if metric_rows else ["None."]
    lines.append("")
    return lines


def _gate_changes(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> Iterator[list[str]]:
    def key(g: dict[str, Any]) -> tuple[str, str, str]:
        return g["stack"], g["model"], g["gate"]

    before, after = {key(g): g for g in old}, {key(g): g for g in new}
    for k in sorted(set(before) | set(after)):
        b, a = before.get(k), after.get(k)
        if b and a and b["status"] == a["status"]:
            continue
        yield [*k, b["status"] if b else "(absent)", a["status"] if a else "(absent)",
               b["measured"] if b else "", a["measured"] if a else ""]


def _metric_changes(name: str, old: dict[str, Any], new: dict[str, Any]) -> Iterator[list[str]]:
    for stack in sorted(set(old["stacks"]) & set(new["stacks"])):
        before_stages = {s["stage"]: s["status"] for s in old["stacks"][stack]["stages"]}
        for stage in new["stacks"][stack]["stages"]:
            was = before_stages.get(stage["stage"])
            if was is not None and was != stage["status"]:
                yield [name, f"{stack} stage {stage['stage']}", was, stage["status"], "status changed"]
        b_size = (old["stacks"][stack].get("artifact") or {}).get("bytes")
        a_size = (new["stacks"][stack].get("artifact") or {}).get("bytes")
        if b_size and a_size and abs(a_size - b_size) > SIZE_CHANGE * b_size:
            yield [name, f"{stack} artifact size", f"{b_size:,} B", f"{a_size:,} B", f"> {SIZE_CHANGE:.0%}"]
        b_mem, a_mem = old["stacks"][stack].get("runtime_memory_bytes"), new["stacks"][stack].get("runtime_memory_bytes")
        if b_mem and a_mem and abs(a_mem - b_mem) > max(MEMORY_CHANGE * b_mem, MEMORY_FLOOR_BYTES):
            yield [name, f"{stack} runtime memory", _mib(b_mem), _mib(a_mem),
                   f"> {MEMORY_CHANGE:.0%} and > {_mib(MEMORY_FLOOR_BYTES)}"]
    b_rel, a_rel = _reference_error(old), _reference_error(new)
    for side in sorted(set(b_rel) & set(a_rel)):
        b, a = b_rel[side], a_rel[side]
        if max(a, b) > NUMERICS_FLOOR and (a > NUMERICS_FACTOR * b or b > NUMERICS_FACTOR * a):
            yield [name, f"rel L2 of {side} vs the reference", f"{b:.3g}", f"{a:.3g}",
                   f"factor > {NUMERICS_FACTOR:g}"]
    ratios_before = {(r["stack"], r["threads"], r["method"]): r for r in old["latency_ratios"]}
    for r in new["latency_ratios"]:
        before = ratios_before.get((r["stack"], r["threads"], r["method"]))
        if before and (r["low"] > before["high"] or r["high"] < before["low"]):
            yield [name, f"latency ratio {r['stack']} {r['method']} at {r['threads']} thread(s)",
                   _interval(before), _interval(r), "95% intervals do not overlap"]


def _reference_error(model: dict[str, Any]) -> dict[str, float]:
    found = {}
    for c in model["comparisons"]:
        value = from_json_float(c.get("worst_rel_l2"))
        if c["purpose"] == REFERENCE_PURPOSE and value is not None:
            found[c["actual"]] = value
    return found


def _interval(r: dict[str, Any]) -> str:
    return f"{r['median']:.3f} [{r['low']:.3f}, {r['high']:.3f}]"


def _mib(count: float) -> str:
    return f"{count / 2**20:.1f} MiB"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return lines


def main(args: list[str]) -> str:
    """`nox -s diff -- OLD NEW`: the diff as Markdown; ConfigError for bad arguments."""
    if len(args) != 2:
        raise ConfigError("nox -s diff -- OLD NEW: give two report folders (or their results.json), older first")
    old, new = (load_report(Path(a)) for a in args)
    return "\n".join(diff(old, new))
