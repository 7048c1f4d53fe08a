"""From the stacks' records to results: comparisons, latency summaries and ratios, sizes.

Pure functions over what the workers and the measure session wrote; no torch,
no thresholds. What they build are the records of the results schema
(upgrade_gate.schema.results).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np

from upgrade_gate import layout
from upgrade_gate._atomic import sha256_file
from upgrade_gate.config.catalog import ModelEntry
from upgrade_gate.config.plan import Plan
from upgrade_gate.config.specs import StackSpec
from upgrade_gate.invocation import command
from upgrade_gate.judge import agreement
from upgrade_gate.judge._device_rounds import device_latency, device_memory, device_runs
from upgrade_gate.judge.attribution import attributions, lowering_floor
from upgrade_gate.judge.numerics import compare_outputs, method_of, worst_rel_l2_by_method
from upgrade_gate.schema.comparison import Attribution, Comparison, Side, TaskAgreement
from upgrade_gate.schema.device import DeviceRun
from upgrade_gate.schema.measured import (
    BusyRounds,
    LatencyRatio,
    Measured,
    ratio_by_rounds,
    remedied,
    summarize,
)
from upgrade_gate.schema.measurement import Contention, Measurement, TimedSide, load_measurement
from upgrade_gate.schema.records import (
    DamagedFile,
    Reader,
    StackModelRecord,
    TaskResult,
    load_diagnosis,
    load_stack_info,
    load_stack_model,
    read_arrays,
    read_task_result,
    released,
)
from upgrade_gate.schema.results import ExtraRequirement, Installed, ModelResults, StackInfo
from upgrade_gate.schema.stack import CacheUse, Diagnosis, StackResults

# Per method, each round's samples by round number: what the ratio is computed from (the results keep summaries).
Rounds = dict[str, dict[int, list[float]]]


def measured_from_record(data: TimedSide, quiet: set[int] | None = None) -> tuple[Measured, Rounds]:
    """One side's entry of a measurement file: its summary, and its samples by round. The
    summary is of the ``quiet`` rounds when any of them is here (the rounds a busy machine
    disturbed slowed the calls, not the stack), else of every round."""
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


# A quantized variant's two departures, apart (judge/attribution.py weighs one against the other).
QUANTIZATION, QUANTIZED_LOWERING = "candidate quantization (eager)", "candidate lowering of the quantized model"


def reference_side(plan: Plan) -> Side:
    """What every artifact is judged against: the baseline's eager outputs,
    the numbers the team has validated today."""
    return Side(stack=plan.baseline.name, kind="eager")


def comparison_pairs(plan: Plan, model: ModelEntry) -> list[tuple[str, Side, Side]]:
    """Which outputs are compared with which, and why. A candidate's quantized variant also apart: its quantization
    run eagerly against the float model, and its artifact against that (what the lowering alone changed)."""
    base = plan.baseline.name
    pairs = [("baseline export fidelity", Side(stack=base, kind="artifact"), Side(stack=base, kind="eager"))]
    for spec in plan.candidates:
        cand = spec.name
        pairs += [
            ("torch upgrade drift (eager)", Side(stack=cand, kind="eager"), Side(stack=base, kind="eager")),
            ("candidate export fidelity", Side(stack=cand, kind="artifact"), Side(stack=cand, kind="eager")),
            ("artifact vs artifact", Side(stack=cand, kind="artifact"), Side(stack=base, kind="artifact")),
            ("candidate artifact vs reference", Side(stack=cand, kind="artifact"), reference_side(plan)),
        ]
        if model.quantized:
            pairs += [
                (QUANTIZATION, Side(stack=cand, kind="quantized"), Side(stack=cand, kind="eager")),
                (QUANTIZED_LOWERING, Side(stack=cand, kind="artifact"), Side(stack=cand, kind="quantized")),
            ]
    return pairs


def gather_model(plan: Plan, model: ModelEntry,
                 runs: list[tuple[Path, DeviceRun]] | None = None) -> ModelResults:
    """One model's results; ``runs``: the devices' results files, read once for every model (device_runs)."""
    out = plan.settings.out_dir
    measurements = {t: found for t in plan.settings.threads if (found := load_measurement(out, model.name, t))}
    records: dict[str, StackModelRecord] = {}
    stacks: dict[str, StackResults] = {}
    samples: dict[str, dict[int, Rounds]] = {}
    contention = {threads: contention_of(data) for threads, data in measurements.items()}
    runs = device_runs(plan) if runs is None else runs

    def measured_side(name: str) -> dict[int, Measured]:
        """A side's summaries per thread count (a stack's, or a candidate's remedied one), its samples kept."""
        found: dict[int, Measured] = {}
        for threads in plan.settings.threads:
            entry = measurements[threads].stacks.get(name) if threads in measurements else None
            found[threads], samples.setdefault(name, {})[threads] = (
                measured_from_record(entry, contention[threads].quiet_rounds()) if entry else (NOT_MEASURED, {}))
        return found

    for spec in plan.stacks:
        record = records[spec.name] = load_stack_model(out, spec.name, model.name)
        measured = measured_side(spec.name)
        timed_remedied = any(remedied(spec.name) in data.stacks for data in measurements.values())
        with_remedy = measured_side(remedied(spec.name)) if timed_remedied else {}
        stacks[spec.name] = StackResults(
            record_dir=record.directory.relative_to(out).as_posix(), stages=record.stages, measured=measured,
            export_peak_rss_bytes=record.peak_rss_bytes("export"),
            runtime_phase_peak_rss_bytes=record.peak_rss_bytes("runtime"),
            cache={phase: CacheUse(key=c.get("key"), reused_from=c.get("reused_from"))
                   for phase, c in record.cache.items()},
            damaged=tuple(_damage(out, damage) for damage in damaged_artifacts(record)),
            diagnosis=_diagnosis(plan, spec.name, model.name),
            remedied_measured=with_remedy)
    ratios, busy_rounds = [], []
    base = plan.baseline.name
    # Each candidate's ratios, and its remedied side's where it was timed: the latency gate's rows of each.
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
    kind = next((r.task_kind for r in records.values() if r.stage("build")), "generic")

    # What part of an output a later call reads is the model's, the same in every stack: read it once.
    extents = next((r.read_extents for r in records.values() if r.read_extents), {})
    comparisons = []
    for purpose, actual, reference in comparison_pairs(plan, model):
        try:
            actual_out = records[actual.stack].outputs(actual.kind)
            reference_out = records[reference.stack].outputs(reference.kind)
        except DamagedFile as damage:
            comparisons.append(Comparison(purpose=purpose, actual=actual, reference=reference, outputs=None,
                                          missing=_damage(out, damage), damaged=_damage(out, damage)))
            continue
        if actual_out is None or reference_out is None:
            absent = tuple(side for side, data in ((actual, actual_out), (reference, reference_out)) if data is None)
            comparisons.append(Comparison(purpose=purpose, actual=actual, reference=reference, outputs=None,
                                          missing=f"no outputs from {' and '.join(map(str, absent))}", absent=absent))
            continue
        try:
            task, task_missing = _task_agreement(kind, actual, reference, actual_out, reference_out,
                                                 lambda side: records[side.stack].task_result(side.kind))
            damaged = None
        except DamagedFile as damage:
            task, task_missing = None, _damage(out, damage)
            damaged = task_missing
        comparisons.append(
            Comparison(
                purpose=purpose,
                actual=actual,
                reference=reference,
                outputs=tuple(compare_outputs(actual_out, reference_out, extents)),
                task=task,
                task_missing=task_missing,
                damaged=damaged,
            )
        )
    reference = reference_side(plan)
    for name, own in stacks.items():
        if own.diagnosis is not None:
            stacks[name] = replace(own, diagnosis=_remedy_compared(own.diagnosis, out, kind, name, records,
                                                                   reference, extents))
    return ModelResults(name=model.name, factory=model.factory, description=model.description, source=model.source,
                        variant=model.variant, task_kind=kind, stacks=stacks, comparisons=tuple(comparisons),
                        ratios=tuple(ratios), contention=contention, busy_rounds=tuple(busy_rounds),
                        attributions=_attributions(plan, model, comparisons),
                        device_latency=device_latency(plan, model, runs),
                        device_memory=device_memory(plan, model, runs))


def _attributions(plan: Plan, model: ModelEntry, comparisons: list[Comparison]) -> tuple[Attribution, ...]:
    """Each candidate's quantized variant, per method: its lowering weighed against its quantization, as the
    diagnose phase chose its search (the same rule, the same floor), kept for the report to say."""
    if not model.quantized:
        return ()
    outputs = {(c.actual, c.reference): list(c.outputs) for c in comparisons if c.outputs}
    found: list[Attribution] = []
    for spec in plan.candidates:
        eager, quantized, artifact = (Side(stack=spec.name, kind=kind) for kind in ("eager", "quantized", "artifact"))
        quantization, lowering = outputs.get((quantized, eager)), outputs.get((artifact, quantized))
        if quantization is not None and lowering is not None:
            found += attributions(quantization, lowering, floor=lowering_floor(plan, model.base),
                                  stack=spec.name).values()
    return tuple(found)


def _diagnosis(plan: Plan, stack: str, model: str) -> Diagnosis | None:
    out = plan.settings.out_dir
    found = load_diagnosis(out, stack, model)
    if found is None:
        return None
    stages, cache = found
    return Diagnosis(record_dir=layout.diagnose_dir(out, stack, model).relative_to(out).as_posix(), stages=stages,
                     cache=CacheUse(key=cache.get("key"), reused_from=cache.get("reused_from")) if cache else None)


# What a remedied comparison is: the candidate as the team would ship it remedied, against the reference.
REMEDIED = "candidate with its remedy vs reference"


def _remedy_compared(diagnosis: Diagnosis, out: Path, kind: str, stack: str, records: dict[str, StackModelRecord],
                     reference: Side, extents: dict[str, tuple[int, int]]) -> Diagnosis:
    """The candidate as the team would ship it remedied — the remedied methods' outputs (the diagnose phase's
    remedy.npz), the others' as shipped, a generator's loop run with the remedy (its ``task`` stage) — against
    the reference, as the shipped artifact's comparison is made: the comparison the remedy's gates judge
    (judge/_remedies.py), and each remedied method's worst relative L2 and cosine for its rows."""
    remedied_file = diagnosis.remedy_outputs_file
    if remedied_file is None or not (out / remedied_file).is_file():
        return diagnosis
    actual = Side(stack=remedied(stack), kind="artifact")
    try:
        remedy_out = read_arrays(out / remedied_file)
        shipped, expected = records[stack].outputs("artifact") or {}, records[reference.stack].outputs(reference.kind)
    except DamagedFile as damage:
        return replace(diagnosis, remedy_comparison=Comparison(
            purpose=REMEDIED, actual=actual, reference=reference, outputs=None, missing=_damage(out, damage),
            damaged=_damage(out, damage)))
    if expected is None:
        return replace(diagnosis, remedy_comparison=Comparison(
            purpose=REMEDIED, actual=actual, reference=reference, outputs=None, absent=(reference,),
            missing=f"no outputs from {reference}"))
    methods = {method_of(name) for name in remedy_out}
    outputs = {**{name: array for name, array in shipped.items() if method_of(name) not in methods}, **remedy_out}
    task_stage = diagnosis.stage("task")
    task_file = out / diagnosis.record_dir / str((task_stage.details if task_stage else {}).get("file", ""))
    try:
        task, task_missing = _task_agreement(
            kind, actual, reference, outputs, expected,
            lambda side: read_task_result(task_stage, task_file) if side == actual
            else records[side.stack].task_result(side.kind))
        damaged = None
    except DamagedFile as damage:
        task, task_missing = None, _damage(out, damage)
        damaged = task_missing
    if kind == "generation" and (task_stage is None or not task_stage.ok):
        task_missing = ("the remedy's loop did not run ("
                        f"{task_stage.explain() if task_stage else 'the diagnose phase recorded none'})")
    compared = compare_outputs(outputs, expected, extents)
    own = [output for output in compared if method_of(output.name) in methods]
    cosine: dict[str, float] = {}
    for output in own:  # a kept-float remedy is judged by the quantized gate's cosine too
        method = method_of(output.name)
        cosine[method] = min(cosine.get(method, 1.0), output.cosine if output.cosine is not None else -1.0)
    return replace(diagnosis, remedy_against=str(reference),
                   remedy_rel_l2=worst_rel_l2_by_method(own, incomparable=math.inf), remedy_cosine=cosine,
                   remedy_comparison=Comparison(purpose=REMEDIED, actual=actual, reference=reference,
                                                outputs=tuple(compared), task=task, task_missing=task_missing,
                                                damaged=damaged))


def _counted(rounds: dict[int, list[float]], quiet: set[int] | None) -> set[int]:
    """The rounds a summary is made of: the quiet ones if there are any."""
    return (quiet & set(rounds)) or set(rounds) if quiet is not None else set(rounds)


def contention_of(measurement: Measurement) -> Contention:
    """The rounds a measurement tried, with the machine's load, why they ended and the design they ran with."""
    design = measurement.design
    return Contention(threads=measurement.threads, cores=measurement.machine.cores, cpu=measurement.machine.cpu,
                      rounds=measurement.rounds, most=design.at_most, ended=measurement.ended,
                      intervals=design.intervals)


def damaged_artifacts(record: StackModelRecord) -> list[DamagedFile]:
    """The artifacts whose file is not the one the save stage recorded (size and SHA-256)."""
    found = []
    left_in_cache = released(record.directory)
    for method in record.saved_files.values():
        path = record.directory / str(method.get("file"))
        if path.name in left_in_cache and not path.is_file():
            continue  # in the result cache by digest (run/artifacts.py), as the key record says
        if not path.is_file():
            found.append(DamagedFile(path, "missing"))
        elif path.stat().st_size != method.get("bytes"):
            found.append(DamagedFile(path, f"{path.stat().st_size} bytes, the export wrote {method.get('bytes')}"))
        elif method.get("sha256") and sha256_file(path) != method["sha256"]:
            found.append(DamagedFile(path, "its SHA-256 is not the one the export recorded"))
    return found


def _damage(out: Path, damage: DamagedFile) -> str:
    """What is damaged, and how to make it again: the cache holds the finished phase, or the phase runs again."""
    where = damage.path.relative_to(out) if damage.path.is_relative_to(out) else damage.path
    return (f"{where} is damaged ({damage.why}); run `{command('compare', f'--out {out}')}` again (the result cache "
            "copies the phase back, or the phase runs again)")


def _task_agreement(
    kind: str, actual: Side, reference: Side, actual_out: dict[str, np.ndarray], reference_out: dict[str, np.ndarray],
    task_of: Callable[[Side], TaskResult | None],
) -> tuple[TaskAgreement | None, str | None]:
    """The task metric for one comparison; the first output carries logits or embeddings, a generator's loop
    (``task_of`` each side) its tokens and logits."""
    if kind in ("classification", "embedding"):
        first = sorted(reference_out)[0]
        a, r = actual_out.get(first), reference_out.get(first)
        if a is None or r is None or a.shape != r.shape or not (np.isfinite(a).all() and np.isfinite(r).all()):
            return None, f"{first}: missing, shape mismatch or NaN/Inf"
        return (agreement.classification(a, r) if kind == "classification" else agreement.embedding(a, r)), None
    if kind == "generation":
        if "quantized" in (actual.kind, reference.kind):
            return None, "the quantized model is run on the method's inputs, not through a generation loop"
        a_task, r_task = task_of(actual), task_of(reference)
        if a_task is None or r_task is None:
            absent = [str(side) for side, t in ((actual, a_task), (reference, r_task)) if t is None]
            return None, f"no generation from {' and '.join(absent)}"
        if a_task.step_logits.shape != r_task.step_logits.shape:
            return None, f"step logits shape {a_task.step_logits.shape} vs {r_task.step_logits.shape}"
        return agreement.generation(a_task.tokens, r_task.tokens, a_task.step_logits, r_task.step_logits), None
    return None, None


def gather(plan: Plan) -> list[ModelResults]:
    runs = device_runs(plan)
    return [gather_model(plan, model, runs) for model in plan.models]
