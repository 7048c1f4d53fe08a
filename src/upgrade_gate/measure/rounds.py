"""The measure session: latency, cold start and memory, measured so that noise cannot flip the verdict.

Runs after every stack has exported and checked its artifacts, when nothing else of the tool runs. For each model
and thread count: one fresh server process per stack (compat/worker.py ``measure``), all started at once, each
importing its stack and noting its resident memory; then, one after the other while the others wait idle, each
loads the artifacts and runs every method once (the cold start), then warms up. Then the rounds, the stacks in
turn (measure/round_loop.py), as the model's ``RoundsDesign`` says (schema.measurement). A candidate whose diagnose
phase chose a remedy is timed twice in each round, as shipped and with the remedied artifacts (``Side``,
schema.measured.remedied), so that the latency gate judges the remedy as it judges the stack. Each server exits
with its peak resident memory: what the model took is that peak less the memory of the runtime alone.

The file (schema.measurement.Measurement) is cached like a phase, keyed by the runtime keys of every stack it
measured, the measurement settings and the machine (CPU model and core count): a cache shared between machines
does not hand one's timings to another.
"""

from __future__ import annotations

import functools
import platform
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from upgrade_gate import layout, stats
from upgrade_gate._atomic import write_json_atomic
from upgrade_gate.config.catalog import ModelEntry
from upgrade_gate.config.plan import Plan
from upgrade_gate.config.specs import StackSpec
from upgrade_gate.judge.fail_fast import stopped_at
from upgrade_gate.layout import PACKAGE_DIR, TOOL_ROOT
from upgrade_gate.measure import _contention, round_loop
from upgrade_gate.measure.round_loop import CORES, failed_record
from upgrade_gate.run import artifacts, cache, measure_server, process_group, workers
from upgrade_gate.run.progress import Progress
from upgrade_gate.schema import measured, measurement
from upgrade_gate.schema.diagnosis import Diagnosis
from upgrade_gate.schema.measured import RoundsEnded
from upgrade_gate.schema.measurement import Machine, Measurement, MeasureSettings, RoundLoad, RoundsDesign, TimedSide
from upgrade_gate.schema.records import (
    RECORDS_VERSION,
    load_diagnosis,
    load_stack_info,
    load_stack_model,
    phase_code,
    read_key_record,
)

# The code that decides how a measurement is made (the stop rule's ratios and design: stats, measured, measurement):
# part of its cache key.
MEASURE_CODE = [Path(str(module.__file__)).resolve() for module in (
    sys.modules[__name__], round_loop, measure_server, process_group, _contention, stats, measured, measurement)]


def measure_all(plan: Plan, log: Callable[[str], Any] = print) -> None:
    stopped = [f"{stop.get('stack')} at {stop.get('model')}'s {stop.get('gate')}" for spec in plan.candidates
               if (stop := stopped_at(plan.settings.out_dir, spec.name))]
    if stopped:
        log(f"measure: skipped: --fail-fast stopped the run ({'; '.join(stopped)})")
        for model in plan.models:  # an earlier run's timings are not of this run's artifacts
            for stale in layout.measurement_dir(plan.settings.out_dir, model.name).glob("threads-*"):
                stale.unlink()
        return
    units = [(model, threads) for model in plan.models for threads in plan.settings.threads]
    with Progress("measure", len(units), log=log) as progress:
        for model, threads in units:
            task = f"measure: {model.name}: {threads} thread(s)"
            progress.start(task)
            measure_model(plan, model, threads, progress.log, on_round=functools.partial(progress.stage, task))
            progress.finish(task, "finished")


def measure_model(plan: Plan, model: ModelEntry, threads: int, log: Callable[[str], Any] = print,
                  on_round: Callable[[str], Any] | None = None) -> Path:
    """One model at one thread count in every stack that can run it; returns the measurement file."""
    settings = plan.settings
    out_file = layout.measurement_file(settings.out_dir, model.name, threads)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    label = f"measure: {model.name} at {threads} thread(s)"
    for stale in out_file.parent.glob(f"threads-{threads}.*"):  # an earlier run's, which this one replaces
        stale.unlink()
    runnable, skipped = runnable_stacks(plan, model)
    sides = remedied_sides(plan, model, runnable)
    key = _measurement_key(plan, model, threads, runnable, sides)
    store = cache.ResultCache(settings.cache_dir)
    names = "+".join(spec.name for spec, _ in runnable) or "none"
    phase = f"measure-t{threads}"
    if key is not None and not (plan.fresh or plan.remeasure):
        hit, problem = store.lookup(names, model.name, phase, key)
        if problem:
            log(f"{label}: {problem}")
        if hit is not None:
            for file in hit.files:
                cache.copy_file(hit.path / file, out_file.parent / file)
            log(f"{label}: reused from the cache (entry {key[:12]})")
            return out_file
    started = time.monotonic()
    stacks: dict[str, dict[str, Any]] = {name: {"status": "not measured", "reason": why}
                                         for name, why in skipped.items()}
    every_side = [Side(spec.name, spec, bin_dir) for spec, bin_dir in runnable] + sides
    tried, ended, design = _time_sides(plan, model, threads, every_side, stacks, rounds_design(plan, model, runnable),
                                       log=lambda said: log(f"{label}: {said}"), on_round=on_round)
    data = measurement_data(plan, model, threads, design=design, order=[spec.name for spec, _ in runnable],
                            remedied={side.name: side.artifacts for side in sides}, key=key, tried=tried,
                            ended=ended, elapsed_s=round(time.monotonic() - started, 2), stacks=stacks)
    # Compact: indented, the samples took a line each and the file more than twice the room (nanoVLM's 954 KB).
    write_json_atomic(out_file, data.to_dict(), indent=None)
    # A stack without a runnable artifact (a variant it has no recipe for) is not part of the key: which stacks ran
    # is (``names``). Only a whole measurement is kept: one cut short, or of a busy machine, is made again next time.
    whole = ended in (RoundsEnded.PLANNED, RoundsEnded.DECIDED)
    if key is not None and whole and all(stacks[side.name]["status"] == "ok" for side in every_side):
        logs = sorted(out_file.parent.glob(f"threads-{threads}.*.log"))
        store.store(names, model.name, phase, key, [out_file, *logs], {})
    log(f"{label}: " + ", ".join(f"{name} {record['status']}" for name, record in stacks.items()))
    return out_file


def _time_sides(plan: Plan, model: ModelEntry, threads: int, every_side: list[Side], stacks: dict[str, dict[str, Any]],
                design: RoundsDesign, *, log: Callable[[str], Any],
                on_round: Callable[[str], Any] | None) -> tuple[list[dict[str, Any]], RoundsEnded, RoundsDesign]:
    """Every side's server started, loaded, timed in the rounds of ``design`` and ended, each side's record in
    ``stacks``: the rounds tried, why they ended and the design they ran with."""
    out_file = layout.measurement_file(plan.settings.out_dir, model.name, threads)
    servers: dict[str, measure_server.Server] = {}
    try:
        # Started together, so that their imports run side by side; then loaded one after the other, the others
        # waiting idle: a cold start timed beside another server's start or load would time both.
        for side in every_side:
            servers[side.name] = launch_server(plan, model, side, threads, out_file)
        for side in every_side:
            if (failed := server_started(servers[side.name])) is not None:
                stacks[side.name] = failed
                servers.pop(side.name)
        for side in every_side:
            if side.name in servers:
                stacks[side.name] = load_server(servers[side.name], side, out_file)
                if stacks[side.name]["status"] != "ok":
                    servers.pop(side.name)
        remedied = [side.name for side in every_side if side.artifacts]
        tried, ended, design = round_loop.play_rounds(plan, threads, servers, stacks, remedied, design, log=log,
                                           on_round=on_round)
        for server in servers.values():  # nothing is timed any more: they end together
            server.ask_to_exit()
        for name, server in servers.items():
            goodbye = server.close()
            record = stacks[name]
            record["supervisor_peak_rss_bytes"] = server.peak_rss_bytes
            if goodbye is not None:
                record["exit_memory"] = goodbye["memory"]
                record["runtime_memory_bytes"] = max(
                    0, int(goodbye["memory"]["peak_rss_bytes"]) - int(record["idle_memory"]["rss_bytes"]))
        servers.clear()
    finally:
        for server in servers.values():
            server.stop()
    return tried, ended, design


def measurement_data(plan: Plan, model: ModelEntry, threads: int, *, design: RoundsDesign, order: list[str],
                     remedied: dict[str, dict[str, str]], key: str | None, tried: list[dict[str, Any]],
                     ended: RoundsEnded, elapsed_s: float, stacks: dict[str, dict[str, Any]]) -> Measurement:
    """A measurement file's record: how its rounds were designed, every round ``tried`` and why they ``ended``,
    each side's record (``stacks``: its samples by round, cold start, memory, or how it ended)."""
    settings = plan.settings
    return Measurement(
        schema_version=str(RECORDS_VERSION), model=model.name, threads=threads,
        settings=MeasureSettings(design=design, warmup=settings.warmup, iterations=settings.iterations,
                                 time_budget_s=settings.time_budget_s),
        order=tuple(order), remedied=remedied, key=key, machine=Machine(**machine()),
        rounds=tuple(RoundLoad.from_dict(entry, f"rounds[{i}]") for i, entry in enumerate(tried)),
        ended=ended, elapsed_s=elapsed_s,
        stacks={name: TimedSide.from_dict(record, f"stacks.{name}") for name, record in stacks.items()})


def rounds_design(plan: Plan, model: ModelEntry, runnable: list[tuple[StackSpec, Path]]) -> RoundsDesign:
    """How the model's rounds are designed, for the intervals its latency gate judges: one per thread count and
    method. The rounds' (through ``stop_rule``) and the measurement's cache key."""
    settings = plan.settings
    methods = {method for spec, _ in runnable for method in _methods(plan, spec, model)}
    return RoundsDesign.of(planned=settings.rounds, most_rounds=settings.most_rounds, stop_early=settings.stop_early,
                           intervals=stats.gate_intervals(len(settings.threads), len(methods)))


def machine() -> dict[str, Any]:
    """The CPU that timed it, by model name and core count."""
    try:
        cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), platform.processor())
    except OSError:
        cpu = platform.processor()
    return {"cpu": cpu or "unknown", "cores": CORES}


@dataclass(frozen=True)
class Side:
    """What one server of a round times: a stack's artifacts as it shipped them, or — a remedied side
    (``measured.remedied``) — with some methods' files replaced, relative to the model's folder."""

    name: str
    spec: StackSpec
    bin_dir: Path
    artifacts: dict[str, str] = field(default_factory=dict)


def remedied_sides(plan: Plan, model: ModelEntry, runnable: list[tuple[StackSpec, Path]]) -> list[Side]:
    """Each runnable candidate whose diagnose phase chose, for every method it remedied, a remedy that passes
    against its eager model, with those remedied artifacts in place of the shipped ones: the remedy the report
    judges, timed in the same rounds as the stacks, so that the latency gate judges it as it judges the stack."""
    out = plan.settings.out_dir
    sides = []
    for spec, bin_dir in runnable:
        found = load_diagnosis(out, spec.name, model.name) if spec.name != plan.baseline.name else None
        if found is None:
            continue
        diagnosis = Diagnosis(record_dir=layout.diagnose_dir(out, spec.name, model.name).relative_to(out).as_posix(),
                              stages=found[0])
        chosen = [method for method in diagnosis.findings if method.remedy_code is not None]
        files = {method.method: out / method.remedy_file for method in chosen if method.remedy_file}
        if not chosen or not all(m.remedy_passes and m.method in files and files[m.method].is_file() for m in chosen):
            continue  # a remedy that fails its own check is judged without timing; one without its file, too
        model_dir = layout.model_dir(out, spec.name, model.name)
        sides.append(Side(measured.remedied(spec.name), spec, bin_dir,
                          {name: file.relative_to(model_dir).as_posix() for name, file in files.items()}))
    return sides


def start_server(
    plan: Plan, model: ModelEntry, side: Side, threads: int, out_file: Path
) -> tuple[measure_server.Server | None, dict[str, Any]]:
    """Start one side's server and wait for its cold start and warm-up; the side's record so far (a benchmark's
    one server: ``measure_model`` starts every side's at once)."""
    server = launch_server(plan, model, side, threads, out_file)
    failed = server_started(server)
    record = failed if failed is not None else load_server(server, side, out_file)
    return (server if record["status"] == "ok" else None), record


def _job_file(out_file: Path, side: Side) -> Path:
    stem = out_file.with_suffix("")
    return stem.with_name(f"{stem.name}.{side.name}-job.json")


def launch_server(plan: Plan, model: ModelEntry, side: Side, threads: int, out_file: Path) -> measure_server.Server:
    """Start one side's server: it imports its stack, says "started" and waits for ``load_server``."""
    settings = plan.settings
    spec, bin_dir = side.spec, side.bin_dir
    job = {
        **artifacts_job(plan, model, spec),
        "artifacts": side.artifacts,
        "threads": threads,
        "warmup": settings.warmup,
        "iterations": settings.iterations,
        "rounds": settings.rounds,
        "time_budget_s": settings.time_budget_s,
        "shortest_part_s": _contention.SHORTEST_PART_S,
    }
    job_file = _job_file(out_file, side)
    write_json_atomic(job_file, job)
    stem = out_file.with_suffix("")
    return measure_server.Server(
        workers.worker_argv(bin_dir, "measure", job_file), env=workers.worker_env(bin_dir), cwd=TOOL_ROOT,
        log_file=stem.with_name(f"{stem.name}.{side.name}.log"), deadline_for=settings.timeout_s,
        memory_limit_bytes=settings.memory_limit_bytes, control_env=process_group.CONTROL_FDS_ENV,
        deadline_key=settings.timeout_key,
    )


def server_started(server: measure_server.Server) -> dict[str, Any] | None:
    """Wait until the server has imported its stack: None, or the side's record of why it could not."""
    try:
        server.request(None, "started")
    except measure_server.ServerFailed as failure:
        server.stop()
        return {**failed_record(failure), "rounds": []}
    return None


def load_server(server: measure_server.Server, side: Side, out_file: Path) -> dict[str, Any]:
    """Tell a started server to load its artifacts, time their cold start and warm up; the side's record so far."""
    try:
        ready = server.request({"command": "load"}, "ready")
    except measure_server.ServerFailed as failure:
        server.stop()
        return {**failed_record(failure), "rounds": []}
    _job_file(out_file, side).unlink(missing_ok=True)
    return {
        "status": "ok",
        # Times from two machines do not compare: a merge of sharded runs checks this.
        "host": socket.gethostname(),
        "cold": ready["cold"],
        "idle_memory": ready["idle"],
        "after_first_run_memory": ready["after_first_run"],
        "warm_mean_ms": ready["warm_mean_ms"],
        "runs_per_round": ready["runs_per_round"],
        "input_shapes": ready["input_shapes"],
        "rounds": [],
    }


def artifacts_job(plan: Plan, model: ModelEntry, spec: StackSpec) -> dict[str, Any]:
    """What a worker needs to load and run a stack's artifacts of a model with the fixture's inputs: the measure
    server's job, and the device bundle's (measure/device.py)."""
    settings = plan.settings
    model_dir = layout.model_dir(settings.out_dir, spec.name, model.name)
    code = phase_code(model_dir, "export") or cache.model_code_digest(model)
    return {
        "stack": spec.name,
        "model": model.name,
        "adapter": spec.adapter,
        "model_dir": str(model_dir),
        # The inputs the artifacts were exported with, whatever the model's code is now.
        "fixtures_dir": str(layout.fixtures_dir(settings.cache_dir, model.base, code)),
        "methods": _methods(plan, spec, model),
    }


def _methods(plan: Plan, spec: StackSpec, model: ModelEntry) -> list[str]:
    """The methods the stack built for the model (its build stage's record)."""
    built = load_stack_model(plan.settings.out_dir, spec.name, model.name).stage("build")
    return list(built.details.get("methods") or ["forward"]) if built else ["forward"]


def runnable_stacks(plan: Plan, model: ModelEntry) -> tuple[list[tuple[StackSpec, Path]], dict[str, str]]:
    """Stacks whose artifacts loaded and ran in the runtime phase, with their venv's bin/; why the others are not."""
    out = plan.settings.out_dir
    runnable, skipped = [], {}
    for spec in plan.stacks:
        info = load_stack_info(out, spec.name) or {}
        executable = (info.get("installed") or {}).get("executable")
        run = load_stack_model(out, spec.name, model.name).stage("run")
        if not executable or not Path(executable).is_file():
            skipped[spec.name] = "the stack was not built in this report folder"
        elif run is None or not run.ok:
            skipped[spec.name] = "its artifact did not load and run (runtime phase)"
        elif (missing := artifacts.restore(plan, spec.name, model.name)) is not None:
            skipped[spec.name] = missing  # left in the result cache, which no longer has it
        else:
            runnable.append((spec, Path(executable).parent))
    return runnable, skipped


def _measurement_key(plan: Plan, model: ModelEntry, threads: int, runnable: list[tuple[StackSpec, Path]],
                     sides: Sequence[Side] = ()) -> str | None:
    """The runtime keys of the stacks measured, the diagnose keys of the remedied sides (what made their files)
    and how they are measured; None if one is not known."""
    runtime_keys = {}
    for spec, _ in runnable:
        record = read_key_record(layout.model_dir(plan.settings.out_dir, spec.name, model.name), "runtime")
        if not record or not record.get("stored") or not record.get("key"):
            return None
        runtime_keys[spec.name] = record["key"]
    for side in sides:
        record = read_key_record(layout.diagnose_dir(plan.settings.out_dir, side.spec.name, model.name),
                                 layout.DIAGNOSE)
        if not record or not record.get("stored") or not record.get("key"):
            return None
        runtime_keys[side.name] = [record["key"], side.artifacts]
    if not runtime_keys:
        return None
    settings = plan.settings
    design = rounds_design(plan, model, runnable)
    return cache.digest_of({
        "machine": machine(),
        "runtime": runtime_keys,
        "order": [spec.name for spec, _ in runnable] + [side.name for side in sides],
        "threads": threads,
        "rounds": settings.rounds,
        # The intervals the gate judges set each interval's rank (and where the rounds may stop, how many at most).
        "intervals": design.intervals,
        "most_rounds": design.most,
        # Where the rounds stop depends on the latency gate's threshold.
        "stop_early": [settings.gates["latency"].threshold, settings.gates["latency"]["min-delta-ms"]]
        if settings.stop_early else False,
        "warmup": settings.warmup,
        "iterations": settings.iterations,
        "time_budget_s": settings.time_budget_s,
        "code": cache.files_digest(MEASURE_CODE, PACKAGE_DIR),
    })
