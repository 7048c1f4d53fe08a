"""``stages`` and ``worker-start`` (benchmark.py says what each measures): where a run's time went, and the
fork servers against a fresh interpreter per phase."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from upgrade_gate import layout
from upgrade_gate._atomic import sha256_file, write_json_atomic, write_text_atomic
from upgrade_gate._confined import remove_tree
from upgrade_gate.config import catalog
from upgrade_gate.config.plan import Shard
from upgrade_gate.layout import NOXFILE
from upgrade_gate.schema.results import Results
from upgrade_gate.stages import RUNTIME_STAGES

# The worker's phases, each a column (the diagnose phase runs only where an artifact departs: 0 elsewhere).
PHASE_COLUMNS = (*layout.PHASES, layout.DIAGNOSE)


def run_parts(report: Path, export_jobs: int) -> dict[str, Any]:
    """A finished run's work, from its report folder: per stack and model the export and runtime
    phases (their stages' durations summed: a phase taken from the result cache counts 0), and
    the measure session's model calls. ``floor_s`` is what the candidate's exports cost at best
    on ``export_jobs`` workers: their phase time spread over the workers with none idle."""
    results = Results.load(report)
    stacks: dict[str, dict[str, dict[str, float]]] = {}
    for model in results.models:
        for name, stack in model.stacks.items():
            reused = set(stack.reused_phases())
            phases = {phase: 0.0 for phase in PHASE_COLUMNS}
            for stage in stack.stages:
                phase = "runtime" if stage.stage in RUNTIME_STAGES else "export"
                if phase not in reused:
                    phases[phase] += stage.duration_s
            found = stack.diagnosis
            if found is not None and not (found.cache and found.cache.reused_from):
                phases[layout.DIAGNOSE] = sum(stage.duration_s for stage in found.stages)
            stacks.setdefault(name, {})[model.name] = phases
    timed_ms = warm_ms = 0.0
    measurements = 0
    for path in sorted((report / "measurements").glob("*/threads-*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        warmup = int((data.get("settings") or {}).get("warmup") or 0)
        for stack in (data.get("stacks") or {}).values():
            if stack.get("status") != "ok":
                continue
            measurements += 1
            for round_ in stack.get("rounds") or ():
                calls = round_.get("calls") or {}  # a round keeps at most stats.SAMPLES_KEPT samples of its calls
                timed_ms += sum(statistics.fmean(samples) * calls.get(method, len(samples))
                                for method, samples in (round_.get("samples_ms") or {}).items() if samples)
            # Warm-up calls and the first call of a fresh process, at the warm mean of each method.
            warm_ms += sum((warmup + 1) * float(ms) for ms in (stack.get("warm_mean_ms") or {}).values())
    totals = {name: {phase: sum(m[phase] for m in models.values()) for phase in PHASE_COLUMNS}
              for name, models in stacks.items()}
    candidates = [name for name in stacks if name != results.baseline.name]
    export_s = sum(totals[name]["export"] for name in candidates)
    return {"report": str(report), "export_jobs": export_jobs, "stacks": stacks, "totals": totals,
            "start_up": worker_start_up(report),
            "candidate_export_floor_s": export_s / max(1, export_jobs),
            "measure": {"measurements": measurements, "timed_calls_s": timed_ms / 1000, "warm_up_s": warm_ms / 1000}}


def worker_start_up(report: Path) -> dict[str, dict[str, dict[str, float]]]:
    """Per stack and phase, the workers' seconds outside their stages — the interpreter's start and the
    imports before the first stage, the exit after the last — summed over the phases a worker ran (the
    supervisor's ``elapsed_s`` less the stages' durations), and how many of those workers were forked
    by the stack's fork server (``worker-start``) or started fresh."""
    found: dict[str, dict[str, dict[str, float]]] = {}
    for path in sorted(report.glob("stacks/*/models/*/*.json")) + sorted(report.glob("stacks/*/models/*/diagnose/diagnose.json")):
        if path.stem not in PHASE_COLUMNS:
            continue
        record = json.loads(path.read_text(encoding="utf-8"))
        watched = (record.get("facts") or {}).get("supervisor")
        if not watched:  # reused from the cache: no worker ran
            continue
        stack = path.relative_to(report).parts[1]
        phase = found.setdefault(stack, {}).setdefault(path.stem, {"start_up_s": 0.0, "forked": 0, "fresh": 0})
        phase["start_up_s"] += watched["elapsed_s"] - sum(s.get("duration_s") or 0.0 for s in record["stages"])
        phase["forked" if watched.get("forked") else "fresh"] += 1
    return found


def measure_seconds(path: Path) -> float:
    """A measurement's wall time (its ``elapsed_s``); a file from before it recorded one: its calls, timed,
    warmed up and first (the servers' start left out)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("elapsed_s") is not None:
        return float(data["elapsed_s"])
    warmup, ms = int((data.get("settings") or {}).get("warmup") or 0), 0.0
    for stack in (data.get("stacks") or {}).values():
        for round_ in stack.get("rounds") or ():
            calls = round_.get("calls") or {}
            ms += sum(statistics.fmean(samples) * calls.get(method, len(samples))
                      for method, samples in (round_.get("samples_ms") or {}).items() if samples)
        ms += sum((warmup + 1) * float(mean) for mean in (stack.get("warm_mean_ms") or {}).values())
    return ms / 1000


def family_costs(report: Path, parts: dict[str, Any]) -> dict[str, Any]:
    """Each model family's minutes in a finished run — its models' and variants' export, runtime and diagnose
    phases in every stack (``run_parts``: one from the cache counts 0) and their measurements' wall time —
    beside its ``cost`` in models/suite.toml, which ``--shard`` splits by (issue 40: the costs were the exports'
    minutes only); and the minutes each part of ``--shard K/2`` would take, split by the suite's costs and by
    this run's minutes."""
    results = Results.load(report)
    known = {**catalog.load_catalog(), **{entry.name: entry for entry in results.settings.project_models}}
    minutes: dict[str, float] = {}
    for model in results.models:
        phases = sum(sum(by_model.get(model.name, {}).values()) for by_model in parts["stacks"].values())
        measured = sum(measure_seconds(path)
                       for path in layout.measurement_dir(report, model.name).glob("threads-*.json"))
        minutes[model.base] = minutes.get(model.base, 0.0) + (phases + measured) / 60
    families = list(minutes)
    suite_costs = [known[f].cost if f in known else 1.0 for f in families]
    rows = [{"family": f, "cost": cost, "minutes": minutes[f]} for f, cost in zip(families, suite_costs)]

    def split(costs: list[float]) -> list[float]:
        return [sum(minutes[families[i]] for i in Shard(part, 2).families(costs)) for part in (1, 2)]

    return {"families": rows, "shards_by_suite_costs": split(suite_costs),
            "shards_by_these_minutes": split([minutes[f] for f in families])}


def stages(report: Path, out: Path, log: Any) -> int:
    parts = run_parts(report, Results.load(report).settings.export_jobs)
    parts["costs"] = family_costs(report, parts)
    lines = [f"# Where the run's time went: {report}", "",
             "| stack | model | " + " | ".join(f"{phase} phase s" for phase in PHASE_COLUMNS) + " |",
             "|---|---|" + "---|" * len(PHASE_COLUMNS)]
    for name, models in parts["stacks"].items():
        for model, phases in sorted(models.items(), key=lambda item: -item[1]["export"]):
            lines.append(f"| {name} | {model} | " + " | ".join(f"{phases[p]:.0f}" for p in PHASE_COLUMNS) + " |")
        lines.append(f"| {name} | **all** | " + " | ".join(f"**{parts['totals'][name][p]:.0f}**"
                                                          for p in PHASE_COLUMNS) + " |")
    lines += ["", "| stack | phase | workers forked | fresh | seconds outside their stages (start, imports, exit) |",
              "|---|---|---|---|---|"]
    lines += [f"| {name} | {phase} | {n['forked']} | {n['fresh']} | {n['start_up_s']:.0f} |"
              for name, by_phase in parts["start_up"].items() for phase, n in by_phase.items()]
    measured = parts["measure"]
    lines += ["", f"Candidate exports' floor on {parts['export_jobs']} workers: "
                  f"{parts['candidate_export_floor_s'] / 60:.1f} min.",
              f"Measure session's model calls: {measured['measurements']} stack measurements, "
              f"{measured['timed_calls_s']:.0f} s of timed calls + {measured['warm_up_s']:.0f} s of warm-up "
              "and first calls."]
    costs = parts["costs"]
    lines += ["", "| family | cost (models/suite.toml) | minutes in this run (phases of every stack, measure) |",
              "|---|---|---|"]
    lines += [f"| {row['family']} | {row['cost']:g} | {row['minutes']:.1f} |" for row in costs["families"]]
    lines += ["", "`--shard 1/2`, `2/2` by the suite's costs: "
                  + " / ".join(f"{m:.1f} min" for m in costs["shards_by_suite_costs"])
                  + "; by this run's minutes: " + " / ".join(f"{m:.1f} min" for m in costs["shards_by_these_minutes"])
                  + "."]
    write_json_atomic(out / "stages.json", parts)
    write_text_atomic(out / "stages.md", "\n".join(lines) + "\n")
    log("\n".join(lines))
    return 0


WORKER_STARTS = ("fork", "fresh")


def worker_start(out: Path, models: str | None, log: Any) -> int:
    """The same phases with each ``worker-start``: time, start-up seconds, and whether every file is the same."""
    stacks = ("legacy", "candidate")
    subprocess.run([sys.executable, "-m", "nox", "--noxfile", str(NOXFILE), "--no-color", "-s", "assets"], check=True)
    seconds, digests = {}, {}
    for how in WORKER_STARTS:
        folder = out / how
        if folder.exists():
            remove_tree(folder, within=out)
        folder.mkdir()
        config = folder / "pyproject.toml"
        config.write_text(f'[tool.upgrade-gate]\nenvs = "{NOXFILE.parent / "envs"}"\ncache = "cache"\n'
                          f'diagnose-budget = 0\nworker-start = "{how}"\n')
        start = time.monotonic()
        ran = subprocess.run(
            [sys.executable, "-m", "nox", "--noxfile", str(NOXFILE), "--no-color", "-s", *(f"run({s})" for s in stacks),
             "--", "--out", str(folder / "report"), *(("--models", models) if models else ())],
            env={**os.environ, "UPGRADE_GATE_CONFIG": str(config)}, capture_output=True, text=True)
        seconds[how] = time.monotonic() - start
        if ran.returncode != 0:
            log(ran.stderr[-3000:])
            return 1
        digests[how] = phase_files(folder / "cache")
    fork, fresh = digests["fork"], digests["fresh"]
    differ = sorted(name for name in fork.keys() | fresh.keys() if fork.get(name) != fresh.get(name))
    start_up = {how: worker_start_up(out / how / "report") for how in WORKER_STARTS}
    lines = [f"# Fork servers against a fresh interpreter per phase: {models or 'the default suite'}", "",
             "| worker-start | run sessions | " + " | ".join(f"{s} {p} start-up s" for s in stacks for p in layout.PHASES)
             + " |", "|---|---|" + "---|" * 2 * len(layout.PHASES)]
    for how in WORKER_STARTS:
        cells = [f"{start_up[how].get(s, {}).get(p, {}).get('start_up_s', 0):.0f}" for s in stacks for p in layout.PHASES]
        lines.append(f"| {how} | {seconds[how] / 60:.1f} min | " + " | ".join(cells) + " |")
    lines += ["", f"Files the phases left in each cache (artifacts, outputs): {len(fork)}; identical: "
                  f"{len(fork) - len(differ)}; different or missing: {len(differ)}" + "".join(f"\n- {n}" for n in differ)]
    write_json_atomic(out / "worker-start.json", {"seconds": seconds, "start_up": start_up, "files": len(fork),
                                                  "differ": differ})
    write_text_atomic(out / "worker-start.md", "\n".join(lines) + "\n")
    log("\n".join(lines))
    return 1 if differ else 0


def phase_files(cache_dir: Path) -> dict[str, str]:
    """Every artifact and tensor file of a result cache, by stack, model, phase and name (not key: a runtime
    phase's key holds its export's record, whose durations differ run to run), and its SHA-256."""
    found = {}
    for path in sorted(cache_dir.rglob("*")):
        parts = path.relative_to(cache_dir).parts
        if path.is_file() and path.suffix in (".pte", ".ptl", ".npz", ".pt") and len(parts) > 4:
            found["/".join((*parts[:3], *parts[4:]))] = sha256_file(path)
    return found
