"""From the stacks' records to results (upgrade_gate.schema.results): comparisons, latency summaries and ratios,
sizes. Pure functions over what the workers and the measure session wrote; no torch, no thresholds.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from upgrade_gate import layout
from upgrade_gate.config.catalog import ModelEntry
from upgrade_gate.config.plan import Plan
from upgrade_gate.config.specs import StackSpec
from upgrade_gate.judge._comparisons import (
    attributions_of,
    compare_sides,
    damage_note,
    damaged_artifacts,
    reference_side,
    remedy_compared,
)
from upgrade_gate.judge._device_rounds import device_latency, device_memory, device_runs
from upgrade_gate.schema.device import DeviceRun
from upgrade_gate.schema.diagnosis import CacheUse, Diagnosis
from upgrade_gate.schema.measured import (
    BusyRounds,
    LatencyRatio,
    Measured,
    ratio_by_rounds,
    remedied,
    summarize,
)
from upgrade_gate.schema.measurement import (
    Contention,
    Measurement,
    TimedSide,
    load_latency_reproducer,
    load_measurement,
)
from upgrade_gate.schema.reader import Reader
from upgrade_gate.schema.records import (
    StackModelRecord,
    load_diagnosis,
    load_stack_info,
    load_stack_model,
)
from upgrade_gate.schema.results import ExtraRequirement, Installed, ModelResults, StackInfo
from upgrade_gate.schema.stack import StackResults

# Per method, each round's samples by round number: what the ratio is computed from (the results keep summaries).
Rounds = dict[str, dict[int, list[float]]]


def measured_from_record(data: TimedSide, quiet: set[int] | None = None) -> tuple[Measured, Rounds]:
    """One side's entry of a measurement file: its summary (of the ``quiet`` rounds when any is here: a busy machine
    slowed the calls, not the stack) and its samples by round."""
    error = data.error
    problem = data.reason or (f"{error.stage}: {error.message}" if error else None)
    rounds: Rounds = {}
    calls: dict[str, dict[int, int]] = {}  # per method and round, the calls its samples stand for
    for entry in data.rounds or ():
        for method, samples in entry.samples_ms.items():
            rounds.setdefault(method, {})[entry.round] = list(samples)
            calls.setdefault(method, {})[entry.round] = entry.calls.get(method, len(samples))
    if data.status != "ok" and rounds:  # a measurement that ended early: its rounds are kept, never judged
        problem = f"{problem} after {max(len(r) for r in rounds.values())} round(s)"
    latency = {}
    for method, by_round in rounds.items():
        counted = sorted(_counted(by_round, quiet))
        summary = summarize([v for n in counted for v in by_round[n]], calls=sum(calls[method][n] for n in counted))
        if summary is not None:
            latency[method] = summary
    cold, shapes = data.cold or {}, data.input_shapes or {}
    return Measured(
        status=data.status if data.status != "ok" or latency else "not measured",
        problem=problem if data.status != "ok" or latency else "no timed rounds",
        latency=latency,
        rounds={method: len(r) for method, r in rounds.items()},
        load_ms=cold.get("load_ms"),
        first_run_ms=sum(cold["first_ms"].values()) if cold.get("first_ms") else None,
        runtime_memory_bytes=data.runtime_memory_bytes,
        peak_rss_bytes=(data.exit_memory or {}).get("peak_rss_bytes"),
        idle_rss_bytes=(data.idle_memory or {}).get("rss_bytes"),
        image_input=any(len(s) == 4 and s[1] in (1, 3) for ins in shapes.values() for s in ins[:1]),
        host=data.host,
    ), rounds


# No measurement file: the measure session did not run for this report (the tool's, not a stack's)
NOT_MEASURED = Measured(status="not run", problem="no measurement: `nox -s measure` did not run for this report")


def stack_info(out: Path, spec: StackSpec) -> StackInfo:
    """A stack as the report shows it: its spec, and what the probe found installed (None: not built here)."""
    recorded = Reader(load_stack_info(out, spec.name) or {}, f"stacks/{spec.name}/stack.json")
    probe = recorded.child("installed")
    versions = recorded.child("packages") or Reader({}, recorded.where)
    return StackInfo(name=spec.name, role=spec.role, file=spec.path.name, description=spec.description,
                     requirements=tuple(str(r) for r in spec.requirements), exporter=spec.exporter,
                     runtime=spec.runtime, installed=Installed.from_reader(probe) if probe else None,
                     packages={name: versions.text(name) for name in versions.data},
                     extra_requirements=tuple(ExtraRequirement.from_reader(e)
                                              for e in recorded.opt_children("extra_requirements") or ()))


def gather_model(plan: Plan, model: ModelEntry,
                 runs: list[tuple[Path, DeviceRun]] | None = None) -> ModelResults:
    """One model's results; ``runs``: the devices' results files, read once for every model (device_runs)."""
    out = plan.settings.out_dir
    measurements = {t: found for t in plan.settings.threads if (found := load_measurement(out, model.name, t))}
    contention = {threads: contention_of(data) for threads, data in measurements.items()}
    records = {spec.name: load_stack_model(out, spec.name, model.name) for spec in plan.stacks}
    samples: dict[str, dict[int, Rounds]] = {}  # each side's, filled by _stack_results
    stacks = {name: _stack_results(plan, model, record, measurements, contention, samples)
              for name, record in records.items()}
    ratios, busy_rounds = _latency_ratios(plan, stacks, samples, measurements, contention)
    kind = next((r.task_kind for r in records.values() if r.stage("build")), "generic")
    # What part of an output a later call reads is the model's, the same in every stack: read it once.
    extents = next((r.read_extents for r in records.values() if r.read_extents), {})
    comparisons = compare_sides(plan, model, records, kind, extents)
    reference = reference_side(plan)
    stacks = {name: own if own.diagnosis is None else replace(
        own, diagnosis=remedy_compared(own.diagnosis, out, kind, name, records, reference, extents))
        for name, own in stacks.items()}
    runs = device_runs(plan) if runs is None else runs
    return ModelResults(name=model.name, factory=model.factory, description=model.description, source=model.source,
                        variant=model.variant, task_kind=kind, stacks=stacks, comparisons=tuple(comparisons),
                        ratios=tuple(ratios), contention=contention, busy_rounds=tuple(busy_rounds),
                        attributions=attributions_of(plan, model, comparisons),
                        latency_reproducer=load_latency_reproducer(out, model.name),
                        device_latency=device_latency(plan, model, runs),
                        device_memory=device_memory(plan, model, runs))


def _stack_results(plan: Plan, model: ModelEntry, record: StackModelRecord, measurements: dict[int, Measurement],
                   contention: dict[int, Contention], samples: dict[str, dict[int, Rounds]]) -> StackResults:
    """One stack's results for the model; its samples (and its timed remedied side's) into ``samples``."""
    out, name = plan.settings.out_dir, record.stack

    def measured_side(side: str) -> dict[int, Measured]:
        """A side's summaries per thread count (a stack's, or a candidate's remedied one), its samples kept."""
        found: dict[int, Measured] = {}
        for threads in plan.settings.threads:
            entry = measurements[threads].stacks.get(side) if threads in measurements else None
            found[threads], samples.setdefault(side, {})[threads] = (
                measured_from_record(entry, contention[threads].quiet_rounds()) if entry else (NOT_MEASURED, {}))
        return found

    timed_remedied = any(remedied(name) in data.stacks for data in measurements.values())
    return StackResults(
        record_dir=record.directory.relative_to(out).as_posix(), stages=record.stages, measured=measured_side(name),
        export_peak_rss_bytes=record.peak_rss_bytes("export"),
        runtime_phase_peak_rss_bytes=record.peak_rss_bytes("runtime"),
        cache={phase: CacheUse(key=c.get("key"), reused_from=c.get("reused_from"))
               for phase, c in record.cache.items()},
        damaged=tuple(damage_note(out, damage) for damage in damaged_artifacts(record)),
        diagnosis=_diagnosis(plan, name, model.name),
        remedied_measured=measured_side(remedied(name)) if timed_remedied else {})


def _latency_ratios(plan: Plan, stacks: dict[str, StackResults], samples: dict[str, dict[int, Rounds]],
                    measurements: dict[int, Measurement], contention: dict[int, Contention],
                    ) -> tuple[list[LatencyRatio], list[BusyRounds]]:
    """Each candidate's ratios to the baseline, and its remedied side's where it was timed: the latency gate's rows
    of each; and on a busy machine, every round's, which are not judged."""
    ratios, busy_rounds = [], []
    base = plan.baseline.name
    sides = [(spec.name, stacks[spec.name].measured) for spec in plan.candidates]
    sides += [(remedied(spec.name), stacks[spec.name].remedied_measured) for spec in plan.candidates
              if stacks[spec.name].remedied_measured]
    for side, side_measured in sides:
        for threads, by_method in samples[side].items():
            if not (side_measured[threads].status == stacks[base].measured[threads].status == "ok"):
                continue  # a measurement that did not finish gives no ratio: never a part presented as whole
            machine = contention.get(threads)
            quiet = machine.quiet_rounds() if machine is not None else None
            # Judged by the design the rounds ran with (the sequential one where they could stop early).
            design = measurements[threads].design
            for method, rounds in by_method.items():
                theirs = samples[base][threads].get(method, {})
                common = [n for n in sorted(rounds) if n in theirs and (quiet is None or n in quiet)]
                estimate = design.ratio([rounds[n] for n in common], [theirs[n] for n in common])
                if estimate is not None:
                    ratios.append(LatencyRatio(stack=side, threads=threads, method=method, estimate=estimate))
                if machine is not None and machine.busy:  # every round tried, disturbed or not: no judgement
                    every = ratio_by_rounds([rounds[n] for n in sorted(rounds) if n in theirs],
                                            [theirs[n] for n in sorted(rounds) if n in theirs])
                    if every is not None:
                        busy_rounds.append(BusyRounds(stack=side, threads=threads, method=method,
                                                      per_round=every.per_round))
    return ratios, busy_rounds


def _diagnosis(plan: Plan, stack: str, model: str) -> Diagnosis | None:
    out = plan.settings.out_dir
    found = load_diagnosis(out, stack, model)
    if found is None:
        return None
    stages, cache = found
    return Diagnosis(record_dir=layout.diagnose_dir(out, stack, model).relative_to(out).as_posix(), stages=stages,
                     cache=CacheUse(key=cache.get("key"), reused_from=cache.get("reused_from")) if cache else None)


def _counted(rounds: dict[int, list[float]], quiet: set[int] | None) -> set[int]:
    """The rounds a summary is made of: the quiet ones if there are any."""
    return (quiet & set(rounds)) or set(rounds) if quiet is not None else set(rounds)


def contention_of(measurement: Measurement) -> Contention:
    """The rounds a measurement tried, with the machine's load, why they ended and the design they ran with."""
    design = measurement.design
    return Contention(threads=measurement.threads, cores=measurement.machine.cores, cpu=measurement.machine.cpu,
                      rounds=measurement.rounds, most=design.at_most, ended=measurement.ended,
                      intervals=design.intervals)


def gather(plan: Plan) -> list[ModelResults]:
    runs = device_runs(plan)
    return [gather_model(plan, model, runs) for model in plan.models]
