"""A device's rounds (`upgrade-gate device-results`, docs/device.md) → each candidate's latency ratio there, per
thread count and method, as the host's. A runtime key changed since the bundle (the model exported again) leaves
the device's figures unjudged, with the reason. The gate's intervals share its 95% over every target × thread count
× method: two targets of one interval each at 95% were wrongly clear 9.2% of the time (issue 61, D1).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from upgrade_gate import layout
from upgrade_gate.config.catalog import ModelEntry
from upgrade_gate.config.plan import Plan
from upgrade_gate.errors import RecordError
from upgrade_gate.schema.device import DeviceRun, read_device_results
from upgrade_gate.schema.measured import DeviceLatency, DeviceMemory, Target, summarize
from upgrade_gate.schema.measurement import RoundsDesign
from upgrade_gate.schema.records import runtime_key
from upgrade_gate.stats import gate_intervals


def device_runs(plan: Plan) -> list[tuple[Path, DeviceRun]]:
    """Every device's results file the report folder keeps, with what it reads as."""
    out = plan.settings.out_dir
    return [(file, read_device_results(file, file.relative_to(out).as_posix()))
            for file in layout.device_results_files(out)]


def device_memory(plan: Plan, model: ModelEntry, runs: list[tuple[Path, DeviceRun]]) -> tuple[DeviceMemory, ...]:
    """Each candidate's runtime memory and cold start against the baseline's per thread count, on each target timed
    over ssh (run-on-device.sh's rounds have no ``server`` line)."""
    found = []
    for _, run in runs:
        for threads in sorted({s.threads for s in run.servers if s.model == model.name}):
            servers = {s.stack: s for s in run.servers if (s.model, s.threads) == (model.name, threads)}
            theirs = servers.get(plan.baseline.name)
            for spec in plan.candidates:
                mine = servers.get(spec.name)
                if mine is None or theirs is None:
                    continue
                found.append(DeviceMemory(
                    target=run.target, stack=spec.name, threads=threads,
                    candidate_bytes=mine.runtime_memory_bytes, baseline_bytes=theirs.runtime_memory_bytes,
                    candidate_cold_ms=mine.load_ms + sum(mine.first_ms.values()),
                    baseline_cold_ms=theirs.load_ms + sum(theirs.first_ms.values())))
    return tuple(found)


def _kept_manifest(out: Path, file: Path) -> dict[str, Any]:
    """The bundle's manifest kept beside a device's results (what the device timed)."""
    try:
        manifest = json.loads(layout.device_manifest_file(file).read_text(encoding="utf-8"))
        if not isinstance(manifest["models"], dict):
            raise TypeError(f"models is {type(manifest['models']).__name__}")
        return dict(manifest)
    except (OSError, ValueError, KeyError, AttributeError, TypeError) as error:
        where = layout.device_manifest_file(file).relative_to(out).as_posix()
        raise RecordError(f"{where}: unreadable ({error}); read the results in again with "
                          "`upgrade-gate device-results`") from error


def judged_targets(plan: Plan, model: str, runs: list[tuple[Path, DeviceRun]]) -> list[str]:
    """The targets a model's device-latency gate judges, whose intervals share its 95%: every configured target, every
    device whose kept results hold the model (or say the bundle could not), every target whose failure is kept.
    Counted once, for where a target's rounds are designed and where they are judged."""
    out = plan.settings.out_dir
    names = {target.name for target in plan.settings.targets}
    for file, run in runs:
        manifest = _kept_manifest(out, file)
        bundled = manifest["models"].get(model) or {}
        if model in (manifest.get("not_bundled") or {}) or plan.baseline.name in bundled.get("stacks", {}):
            names.add(run.target.name)
    for failed in layout.device_failed_files(out):
        try:
            names.add(str(json.loads(failed.read_text(encoding="utf-8"))["target"]))
        except (OSError, ValueError, KeyError, TypeError) as damaged:
            raise RecordError(f"{failed.relative_to(out).as_posix()}: unreadable ({damaged}); run the compare "
                              "again: it tries the target again") from damaged
    return sorted(names)


def device_gate_intervals(plan: Plan, model: str, thread_counts: int, methods: int,
                          runs: list[tuple[Path, DeviceRun]]) -> int:
    """The intervals a model's device-latency gate judges, which share its 95%: one per target, thread count and method;
    one count for the rounds over ssh designed for it and the fixed rounds judged at it."""
    return gate_intervals(thread_counts, methods, len(judged_targets(plan, model, runs)))


def device_latency(plan: Plan, model: ModelEntry, runs: list[tuple[Path, DeviceRun]]) -> tuple[DeviceLatency, ...]:
    out = plan.settings.out_dir
    found: list[DeviceLatency] = []
    for file, run in runs:
        manifest = _kept_manifest(out, file)
        bundled: dict[str, Any] = manifest["models"].get(model.name) or {}
        why = (manifest.get("not_bundled") or {}).get(model.name)
        if why:  # the device timed the bundle, and the bundle could not hold this model: said, never left out
            found += [DeviceLatency(target=run.target, stack=spec.name, threads=threads, method="every method",
                                    rounds=0, planned=run.planned_rounds, missing=f"not in the bundle: {why}")
                      for spec in plan.candidates for threads in plan.settings.threads]
            continue
        if plan.baseline.name not in bundled.get("stacks", {}):
            continue  # the bundle did not hold this model (--models left it out): nothing to say here
        for spec in plan.candidates:
            if spec.name in bundled["stacks"]:
                found += _ratios(plan, model, run, bundled, spec.name, device_gate_intervals(
                    plan, model.name, len(bundled["threads"]), len(bundled["methods"]), runs))
    return tuple(found) + _failed_targets(plan, model)


def _failed_targets(plan: Plan, model: ModelEntry) -> tuple[DeviceLatency, ...]:
    """Each target of [tool.upgrade-gate.targets] whose last try gave no rounds (measure/targets.py): a row per
    candidate, thread count and method the bundle holds for the model, incomplete with the target's reason."""
    out = plan.settings.out_dir
    try:
        bundled = json.loads(layout.bundle_manifest_file(out).read_text(encoding="utf-8"))["models"]
    except (OSError, ValueError, KeyError):
        bundled = {}
    held = bundled.get(model.name) if isinstance(bundled, dict) else None
    rows: list[DeviceLatency] = []
    for file in layout.device_failed_files(out):
        try:
            failed = json.loads(file.read_text(encoding="utf-8"))
            name, error = str(failed["target"]), str(failed["error"])
        except (OSError, ValueError, KeyError, TypeError) as damaged:
            raise RecordError(f"{file.relative_to(out).as_posix()}: unreadable ({damaged}); run the compare again: "
                              "it tries the target again") from damaged
        if not held or plan.baseline.name not in held.get("stacks", {}):
            continue
        target = Target(name=name, cpu="not reached", architecture="", cores=None, isa=())
        rows += [DeviceLatency(target=target, stack=spec.name, threads=threads, method=method, rounds=0, planned=0,
                               missing=f"no rounds from {name}: {error}")
                 for spec in plan.candidates if spec.name in held["stacks"]
                 for threads in held["threads"] for method in held["methods"]]
    return tuple(rows)


def _ratios(plan: Plan, model: ModelEntry, run: DeviceRun, bundled: dict[str, Any], stack: str,
            intervals: int) -> list[DeviceLatency]:
    """The candidate ``stack``'s rows on one device, each interval at its share of a gate of ``intervals``."""
    out, base = plan.settings.out_dir, plan.baseline.name
    methods, thread_counts = list(bundled["methods"]), list(bundled["threads"])
    stale = [name for name in (stack, base)
             if bundled["stacks"][name].get("runtime_key") != runtime_key(out, name, model.name)]
    rows = []
    for threads in thread_counts:
        def rounds_of(name: str, method: str, at: int = threads) -> dict[int, list[float]]:
            return {r.round: list(r.samples_ms.get(method, ())) for r in run.rounds
                    if (r.model, r.stack, r.threads) == (model.name, name, at) and not r.disturbed}

        failed = [f for f in run.failures
                  if f.model == model.name and f.stack in (stack, base) and f.threads == threads]
        ended = run.ended_of(model.name, threads)
        # Rounds that could stop early are judged by the sequential design they ran with, as on the host: its looks
        # were chosen for the intervals it was designed for (0: a file from before, one target's thread counts ×
        # methods); fixed rounds (run-on-device.sh) take their rank here, at the gate's share.
        design = RoundsDesign(planned=run.planned_rounds, intervals=intervals)
        if ended is not None and ended.stop_early and run.planned_rounds:
            design = RoundsDesign(planned=run.planned_rounds, stop_early=True, most=ended.most,
                                  intervals=ended.intervals or gate_intervals(len(thread_counts), len(methods)))
        for method in methods:
            mine, theirs = rounds_of(stack, method), rounds_of(base, method)
            common = sorted(set(mine) & set(theirs))
            estimate = design.ratio([mine[n] for n in common], [theirs[n] for n in common])
            mine_p50 = summarize([s for n in common for s in mine[n]])
            theirs_p50 = summarize([s for n in common for s in theirs[n]])
            if stale:
                missing = (f"the device timed {' and '.join(stale)}'s artifacts of an earlier export; write the bundle "
                           "again (nox -s bundle) and run it")
            elif failed:
                first = failed[0]
                missing = f"{first.stack}, round {first.round}: {first.error}"
            elif estimate is None:
                missing = "no round in which both stacks gave samples" + (
                    f" undisturbed ({ended.tried} tried, the target busy in the others)" if ended else "")
            else:
                missing = ""
            rows.append(DeviceLatency(
                target=run.target, stack=stack, threads=threads, method=method, rounds=len(common),
                planned=run.planned_rounds, candidate_p50_ms=mine_p50.p50_ms if mine_p50 else None,
                baseline_p50_ms=theirs_p50.p50_ms if theirs_p50 else None,
                estimate=None if missing else estimate, missing=missing,
                ended=ended.ended if ended else "", disturbed=ended.tried - ended.counted if ended else 0))
    return rows
