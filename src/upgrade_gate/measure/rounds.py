"""Latency, cold start and memory, measured so that noise cannot flip the verdict.

Runs after every stack has exported and checked its artifacts, when the tool
has nothing else to do: nothing is timed while anything of ours runs beside it.
For each model and each thread count:

1. One fresh server process per stack (compat/worker.py ``measure``), all started
   at once: each imports its stack, starts its runtime and notes its resident
   memory; then, one after the other while the others wait idle, each loads the
   artifacts and runs every method once — the cold start — then warms up.
2. Rounds, the stacks in turn and the order reversed every other counted round
   (A B, B A, …): in each round every stack times each method ``iterations / rounds``
   times or for ``time-budget / rounds`` seconds, whichever is more. A round's
   medians saw the same machine, so their ratio is the round's candidate/baseline ratio
   (schema.measured.ratio_by_rounds; its interval, upgrade_gate.stats). Around each stack's part
   the rest of the machine's load is measured (upgrade_gate.measure._contention); a round
   it disturbed is repeated in the same order, and does not count. With ``stop-early``
   the rounds stop at a look of the sequential design (upgrade_gate.stats.sequential_looks)
   once every candidate's latency gate is decided (every interval wholly on one side of the
   threshold, or one wholly beyond: ``clear_of_threshold``), and
   go on past ``rounds``, up to ``most-rounds``, while one still straddles, where the gate's
   share of the coverage leaves room for looks there (``rounds_design``). The
   file says why the rounds ended (schema.measured.RoundsEnded).
   A candidate whose diagnose phase chose a remedy is timed twice in each round: as shipped, and with the
   remedied artifacts in place of the shipped ones (``Side``, schema.measured.remedied), so that the latency
   gate judges the remedy with the same rounds, stop rule and contention check as the stack.
3. Each server exits with its peak resident memory: what loading and running
   the model took is that peak minus the memory it had with only the runtime
   started.

A measurement is cached like a phase, keyed by the runtime keys of every
stack it measured, the measurement settings and the machine (CPU model and
core count): a cache shared between machines does not hand one's timings to
another.
"""

from __future__ import annotations

import functools
import os
import platform
import socket
import sys
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np

from upgrade_gate import layout, stats
from upgrade_gate._atomic import write_json_atomic
from upgrade_gate.config.catalog import ModelEntry
from upgrade_gate.config.plan import Plan
from upgrade_gate.config.specs import StackSpec
from upgrade_gate.judge.fail_fast import stopped_at
from upgrade_gate.layout import PACKAGE_DIR, TOOL_ROOT
from upgrade_gate.measure import _contention
from upgrade_gate.run import artifacts, cache, supervisor, workers
from upgrade_gate.run.progress import Progress
from upgrade_gate.schema import measured
from upgrade_gate.schema.measured import RatioEstimate, RoundsEnded, ratio_by_rounds
from upgrade_gate.schema.records import (
    RECORDS_VERSION,
    load_diagnosis,
    load_stack_info,
    load_stack_model,
    phase_code,
    read_key_record,
)
from upgrade_gate.schema.stack import Diagnosis

# The code that decides how a measurement is made (the stop rule's ratios: stats, measured): part of its cache key.
MEASURE_CODE = [Path(str(module.__file__)).resolve()
                for module in (sys.modules[__name__], supervisor, _contention, stats, measured)]


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
    intervals = gate_intervals(plan, model, runnable)
    stacks: dict[str, dict[str, Any]] = {name: {"status": "not measured", "reason": why}
                                         for name, why in skipped.items()}
    servers: dict[str, supervisor.Server] = {}
    try:
        every_side = [Side(spec.name, spec, bin_dir) for spec, bin_dir in runnable] + sides
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
        rounds, ended, most = play_rounds(plan, threads, servers, stacks, [side.name for side in sides], intervals,
                                          log=lambda said: log(f"{label}: {said}"), on_round=on_round)
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
    data = measurement_data(plan, model, threads, intervals=intervals, most=most,
                            order=[spec.name for spec, _ in runnable],
                            remedied={side.name: side.artifacts for side in sides}, key=key, tried=rounds,
                            ended=ended, elapsed_s=round(time.monotonic() - started, 2), stacks=stacks)
    # Compact: indented, the samples took a line each and the file more than twice the room (nanoVLM's 954 KB).
    write_json_atomic(out_file, data, indent=None)
    # A stack without a runnable artifact (a variant it has no recipe for) is not
    # part of the key: which stacks ran is (``names``).
    # Only a whole measurement is kept: one cut short, or of a busy machine, is made again next time.
    whole = ended in (RoundsEnded.PLANNED, RoundsEnded.DECIDED)
    timed = [spec.name for spec, _ in runnable] + [side.name for side in sides]
    if key is not None and whole and all(stacks[name]["status"] == "ok" for name in timed):
        logs = sorted(out_file.parent.glob(f"threads-{threads}.*.log"))
        store.store(names, model.name, phase, key, [out_file, *logs], {})
    summary = ", ".join(f"{name} {record['status']}" for name, record in stacks.items())
    log(f"{label}: {summary}")
    return out_file


def play_rounds(plan: Plan, threads: int, servers: dict[str, AnyServer], stacks: dict[str, dict[str, Any]],
                remedied_sides: Sequence[str], intervals: int, *, log: Callable[[str], Any],
                on_round: Callable[[str], Any] | None = None,
                watch: Watch | None = None) -> tuple[list[dict[str, Any]], RoundsEnded, int]:
    """The measure session's rounds of the loaded ``servers`` (``run_rounds``), ended by the stop rule
    (``stop_rule``) over every candidate's ratios and its remedied side's (their latency gate is judged as the
    stack's is, so the rounds go on until they are decided too), each interval at its share of a gate of
    ``intervals``: every round tried, why they ended, the most they could take. A side whose server ends ends alone;
    the others go on to their decision."""
    settings, gate = plan.settings, plan.settings.gates["latency"]
    looks, most, clear = stop_rule(plan.baseline.name, [spec.name for spec in plan.candidates] + list(remedied_sides),
                                   stacks, servers, rounds=settings.rounds, most_rounds=settings.most_rounds,
                                   stop_early=settings.stop_early, confidence=stats.interval_confidence(intervals),
                                   threshold=gate.threshold, min_delta_ms=gate["min-delta-ms"])
    log(f"{'up to ' if looks else ''}{settings.rounds} rounds"
        f"{f' (up to {most} while an interval straddles)' if most > settings.rounds else ''} of "
        f"{', '.join(servers) or 'no stack'}")
    tried, ended = run_rounds(servers, stacks, settings.rounds, threads, on_round, clear, looks=looks, most=most,
                              watch=watch, baseline=plan.baseline.name)
    return tried, ended, most


def measurement_data(plan: Plan, model: ModelEntry, threads: int, *, intervals: int, most: int, order: list[str],
                     remedied: dict[str, dict[str, str]], key: str | None, tried: list[dict[str, Any]],
                     ended: RoundsEnded, elapsed_s: float, stacks: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A measurement file's contents (gather reads them): how its rounds were designed, every round ``tried`` and
    why they ``ended``, each side's record (``stacks``: its samples by round, cold start, memory, or how it ended)."""
    settings = plan.settings
    return {
        "schema_version": str(RECORDS_VERSION),
        "model": model.name,
        "threads": threads,
        "settings": {"rounds": settings.rounds, "warmup": settings.warmup, "iterations": settings.iterations,
                     "time_budget_s": settings.time_budget_s, "stop_early": settings.stop_early,
                     # The rounds it could take, going on while an interval straddled (rounds_design).
                     "most_rounds": most,
                     # The intervals the model's latency gate judges: they share its 5% (stats.interval_confidence).
                     "intervals": intervals},
        "order": order,  # the stacks measured (their cache entry's name)
        "remedied": remedied,
        "key": key,
        # Timings of another machine are not this one's: the cache key has the machine too.
        "machine": machine(),
        # Every round tried: the stacks' order, what the rest of the machine did, whether it counts, whose server
        # ended in it.
        "rounds": tried,
        "ended": ended.value,
        # Its wall time, servers' start to exit: what the model costs the measure session (a family's cost).
        "elapsed_s": elapsed_s,
        "stacks": stacks,
    }


class _Process(Protocol):
    @property
    def pid(self) -> int: ...


class RoundServer(Protocol):
    """What the rounds ask of a measurement server: supervisor.Server, or an in-process stand-in
    (tests/benchmarks/scripted.py: the benchmarks' and tests' rounds of known ratios, a run's rounds replayed)."""

    @property
    def process(self) -> _Process: ...

    def request(self, command: dict[str, Any] | None, until: str) -> dict[str, Any]: ...

    def stop(self) -> None: ...


AnyServer = TypeVar("AnyServer", bound=RoundServer)
# Watches the machine around one stack's part of a round: (every server's pid, the timed one's) → the end of the
# watch, which gives the part's load (_contention.watch; a stand-in's in tests/benchmarks/scripted.py).
Watch = Callable[[list[int], int], Callable[[], _contention.Load | None]]


def run_rounds(servers: dict[str, AnyServer], stacks: dict[str, dict[str, Any]], wanted: int, threads: int,
               on_round: Callable[[str], Any] | None = None, clear: Callable[[set[int]], bool] | None = None, *,
               looks: Collection[int] = (), most: int = 0, watch: Watch | None = None,
               baseline: str | None = None) -> tuple[list[dict[str, Any]], RoundsEnded]:
    """``wanted`` quiet rounds, the stacks in turn — A B, then B A, so that whatever running
    first or second does to a stack (a warm cache, a clock still ramping, the other's
    leftovers) falls on both alike. A round the rest of the machine disturbed (``watch``:
    upgrade_gate.measure._contention by default) is repeated in the same order, up to as many
    rounds again as wanted, so the rounds that count alternate whatever the machine did: an
    order effect that came with the disturbances would otherwise tip them to one side. Its
    samples are kept in the record but its ratio is not used. Each stack's samples of a round are its
    ``rounds`` entry (``stats.kept_samples``, with the calls they stand for); the round's order and load
    are the measurement's. With ``clear`` (stop-early), after a quiet round that is one of ``looks`` (the
    sequential design's) the rounds stop when ``clear(quiet rounds)`` says every ratio is decided; they
    go on past ``wanted``, up to ``most``, while it does not (``rounds_design``).

    A side whose server ends (it failed, was killed: its record says how) ends alone, named in the round's
    ``servers_ended``: while the ``baseline``'s server and another side's run, the others go on to their
    decision (issue 61: a remedied side's server that ended had ended every side's rounds, and the candidate's
    own gate read "machine busy"). Once the baseline's ends, or no other is left — or with no ``baseline``
    given — the rounds end: ``RoundsEnded.SERVER_ENDED``. Returns every round tried and why the rounds ended."""
    watch = watch or functools.partial(_contention.watch, threads=threads, cores=CORES)
    names = list(servers)
    counted: set[int] = set()
    tried: list[dict[str, Any]] = []
    at_most = max(wanted, most)
    while servers:
        if len(counted) == at_most:
            return tried, RoundsEnded.PLANNED
        if len(tried) >= REPEAT_BUDGET * max(wanted, len(counted) + 1):  # a round past ``wanted`` adds its share
            return tried, RoundsEnded.REPEATS_RAN_OUT
        number, place = len(tried) + 1, len(counted) + 1
        if on_round is not None:  # "n/wanted" up to ``wanted``, then how far it may go; a repeat names its round
            repeat = bool(tried) and tried[-1]["round"] not in counted
            of = f"/{wanted}" if place <= wanted else f" of up to {at_most} (an interval still straddles)"
            on_round(f"{'repeating busy round' if repeat else 'round'} {place}{of}")
        order = [n for n in (names if place % 2 else names[::-1]) if n in servers]
        loads, cut, ended = _round_parts(servers, stacks, order, number, watch)
        disturbed = bool(cut) or any(load is not None and load.disturbed for load in loads.values())
        if not disturbed and loads:  # every side still timed gave its part (one that ended gave none)
            counted.add(number)
        tried.append({"round": number, "order": order, "disturbed": disturbed,
                      "load": {name: load.to_dict() if load else None for name, load in loads.items()},
                      **({"cut": cut} if cut else {}), **({"servers_ended": ended} if ended else {})})
        if len(servers) < len(names) and not (baseline in servers and len(servers) > 1):
            break  # the baseline's server ended, or every other's: no more ratios to be had; what finished is kept
        if (clear is not None and number in counted and len(counted) < at_most and len(counted) in looks
                and clear(counted)):
            return tried, RoundsEnded.DECIDED
    return tried, RoundsEnded.SERVER_ENDED


def _round_parts(servers: dict[str, AnyServer], stacks: dict[str, dict[str, Any]], order: list[str], number: int,
                 watch: Watch) -> tuple[dict[str, _contention.Load | None], dict[str, float], list[str]]:
    """Each side's part of round ``number``, in ``order``, its samples into its record: the parts' loads, the sides
    whose server cut its part short (and after how many seconds: part_limit_s), and those whose server ended, each
    left out of ``servers`` from then on with its record saying how it ended."""
    loads: dict[str, _contention.Load | None] = {}
    cut: dict[str, float] = {}
    ended: list[str] = []
    for name in order:
        watched = watch([server.process.pid for server in servers.values()], servers[name].process.pid)
        try:
            event = servers[name].request({"command": "round", "round": number}, "round")
        except supervisor.ServerFailed as failure:
            stacks[name].update(_failed(failure))
            servers.pop(name).stop()
            ended.append(name)
            continue
        loads[name] = watched()
        samples: dict[str, list[float]] = event["samples_ms"]
        stacks[name]["rounds"].append({"round": number,
                                       "samples_ms": {m: stats.kept_samples(v) for m, v in samples.items()},
                                       "calls": {m: len(v) for m, v in samples.items()}})
        if "cut_after_s" in event:
            cut[name] = round(float(event["cut_after_s"]), 3)
    return loads, cut, ended


def rounds_design(rounds: int, most_rounds: int, stop_early: bool, confidence: float) -> tuple[dict[int, int], int]:
    """Where the rounds of an interval at ``confidence`` may stop (stop-early's looks, ``{rounds: rank}``;
    none without it) and the most they may take: ``rounds``, or up to ``most_rounds`` where looks past them
    fit its share of the coverage (stats.looks_past: a gate of up to 6 intervals at 15). Every round is sized
    for ``rounds`` (the server's parts): one past them costs what a planned one does, only where one straddles.
    Through ``stop_rule`` for the rounds themselves; the measurement's cache key too."""
    if not stop_early:
        return {}, rounds
    looks = stats.sequential_looks(rounds, confidence, most_rounds)
    return looks, max(looks)


def ratio_to_decide(baseline: str, candidates: Collection[str], timed: Collection[str]) -> bool:
    """Whether the stacks ``timed`` make a ratio a latency gate decides: the baseline's and a candidate's (or a
    remedied side's). Where they do not (a variant only one stack has, a stack whose artifact did not load),
    stop-early has nothing to decide and the rounds are the planned ones: no stop at a look, none past them."""
    return baseline in timed and any(name in timed for name in candidates)


def stop_rule(baseline: str, candidates: Sequence[str], stacks: dict[str, dict[str, Any]], timed: Collection[str],
              *, rounds: int, most_rounds: int, stop_early: bool, confidence: float, threshold: float,
              min_delta_ms: float) -> tuple[dict[int, int], int, Callable[[set[int]], bool] | None]:
    """How the rounds of the stacks ``timed`` end (run_rounds' ``looks``, ``most`` and ``clear``): stop-early's
    looks and the most rounds (``rounds_design``) where they make a ratio to decide (``ratio_to_decide``), and
    at a look the latency gate's rule over every candidate's ratios so far (``clear_of_threshold``, reading
    ``stacks`` as the rounds fill it); the planned rounds, no look and no rule, where they do not. The
    measure session's, a target's (measure/target_rounds.py) and the benchmarks' (scripted.py)."""
    looks, most = rounds_design(rounds, most_rounds, stop_early and ratio_to_decide(baseline, candidates, timed),
                                confidence)
    clear = functools.partial(clear_of_threshold, baseline, candidates, stacks, threshold=threshold,
                              min_delta_ms=min_delta_ms, planned=rounds, confidence=confidence,
                              most=most) if looks else None
    return looks, most, clear


def gate_intervals(plan: Plan, model: ModelEntry, runnable: list[tuple[StackSpec, Path]]) -> int:
    """The intervals the model's latency gate judges: one per thread count and method."""
    methods = {method for spec, _ in runnable for method in _methods(plan, spec, model)}
    return stats.gate_intervals(len(plan.settings.threads), len(methods))


def ratios_so_far(baseline: str, candidates: Sequence[str], stacks: dict[str, dict[str, Any]], quiet: set[int], *,
                  planned: int, confidence: float, most: int = 0) -> list[tuple[RatioEstimate, float]] | None:
    """Every candidate's ratio to the baseline, per method, over the ``quiet`` rounds (the sequential
    design's interval of ``planned`` rounds, up to ``most``, each at ``confidence``), each with the baseline's
    median in ms; None without a baseline and a candidate, or where a ratio cannot be made."""
    found = _ratios_by_candidate(baseline, candidates, stacks, quiet, planned=planned, confidence=confidence, most=most)
    return None if found is None else [pair for pairs in found.values() for pair in pairs]


def _ratios_by_candidate(baseline: str, candidates: Sequence[str], stacks: dict[str, dict[str, Any]], quiet: set[int],
                         *, planned: int, confidence: float,
                         most: int) -> dict[str, list[tuple[RatioEstimate, float]]] | None:
    theirs = _samples_by_method(stacks.get(baseline) or {}, quiet)
    # A candidate not measured, or whose server ended (its record says why), has no ratio, and does not make the
    # gate decided: the others' rounds go on to their own decision.
    measured = {name: samples for name in candidates if name in stacks and stacks[name].get("status") == "ok"
                and (samples := _samples_by_method(stacks[name], quiet))}
    if not theirs or not measured:
        return None
    found: dict[str, list[tuple[RatioEstimate, float]]] = {}
    for name, mine in measured.items():
        for method, rounds in mine.items():
            if method not in theirs or len(theirs[method]) != len(rounds):
                return None
            estimate = ratio_by_rounds(rounds, theirs[method], confidence=confidence, planned=planned, most=most)
            if estimate is None:
                return None
            found.setdefault(name, []).append(
                (estimate, float(np.median([v for samples in theirs[method] for v in samples]))))
    return found


def clear_of_threshold(baseline: str, candidates: Sequence[str], stacks: dict[str, dict[str, Any]], quiet: set[int],
                       *, threshold: float, min_delta_ms: float, planned: int, confidence: float,
                       most: int = 0) -> bool:
    """Whether every candidate's latency gate is decided by its ratios to the baseline (``ratios_so_far``) as the
    gate decides each (RatioEstimate.outcome: its interval wholly within or wholly beyond the threshold, or its
    top at most ``min_delta_ms`` slower): one of them wholly beyond (the gate fails whatever its other methods
    say: going on could only widen that interval back over the threshold), or every one decided. False without
    a baseline and a candidate."""
    found = _ratios_by_candidate(baseline, candidates, stacks, quiet, planned=planned, confidence=confidence, most=most)
    if found is None:
        return False
    for pairs in found.values():
        outcomes = {estimate.outcome(threshold, baseline_ms, min_delta_ms) for estimate, baseline_ms in pairs}
        if "failed" not in outcomes and "inconclusive" in outcomes:
            return False
    return True


def _samples_by_method(record: dict[str, Any], quiet: set[int]) -> dict[str, list[list[float]]]:
    """A stack's samples of the ``quiet`` rounds, per method, in round order."""
    found: dict[str, list[list[float]]] = {}
    for entry in record.get("rounds", []):
        if entry["round"] in quiet:
            for method, samples in entry["samples_ms"].items():
                found.setdefault(method, []).append(samples)
    return found


def machine() -> dict[str, Any]:
    """The CPU that timed it, by model name and core count."""
    try:
        cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), platform.processor())
    except OSError:
        cpu = platform.processor()
    return {"cpu": cpu or "unknown", "cores": CORES}


# The cores a measurement shares with the rest of the machine.
CORES = os.cpu_count() or 1
# Rounds tried at most, as a multiple of the rounds wanted: a busy machine gets a second chance, not an endless one.
REPEAT_BUDGET = 2


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
) -> tuple[supervisor.Server | None, dict[str, Any]]:
    """Start one side's server and wait for its cold start and warm-up; the side's record so far (a benchmark's
    one server: ``measure_model`` starts every side's at once)."""
    server = launch_server(plan, model, side, threads, out_file)
    failed = server_started(server)
    record = failed if failed is not None else load_server(server, side, out_file)
    return (server if record["status"] == "ok" else None), record


def _job_file(out_file: Path, side: Side) -> Path:
    stem = out_file.with_suffix("")
    return stem.with_name(f"{stem.name}.{side.name}-job.json")


def launch_server(plan: Plan, model: ModelEntry, side: Side, threads: int, out_file: Path) -> supervisor.Server:
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
    return supervisor.Server(
        workers.worker_argv(bin_dir, "measure", job_file), env=workers.worker_env(bin_dir), cwd=TOOL_ROOT,
        log_file=stem.with_name(f"{stem.name}.{side.name}.log"), deadline_for=settings.timeout_s,
        memory_limit_bytes=settings.memory_limit_bytes, control_env=supervisor.CONTROL_FDS_ENV,
        deadline_key=settings.timeout_key,
    )


def server_started(server: supervisor.Server) -> dict[str, Any] | None:
    """Wait until the server has imported its stack: None, or the side's record of why it could not."""
    try:
        server.request(None, "started")
    except supervisor.ServerFailed as failure:
        server.stop()
        return {**_failed(failure), "rounds": []}
    return None


def load_server(server: supervisor.Server, side: Side, out_file: Path) -> dict[str, Any]:
    """Tell a started server to load its artifacts, time their cold start and warm up; the side's record so far."""
    try:
        ready = server.request({"command": "load"}, "ready")
    except supervisor.ServerFailed as failure:
        server.stop()
        return {**_failed(failure), "rounds": []}
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


def _failed(failure: supervisor.ServerFailed) -> dict[str, Any]:
    return {"status": failure.status, "error": {"stage": failure.stage, "message": failure.message,
                                                "traceback_tail": failure.traceback_tail}}


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
    intervals = gate_intervals(plan, model, runnable)
    return cache.digest_of({
        "machine": machine(),
        "runtime": runtime_keys,
        "order": [spec.name for spec, _ in runnable] + [side.name for side in sides],
        "threads": threads,
        "rounds": settings.rounds,
        # The intervals the gate judges set each interval's rank (and where the rounds may stop, how many at most).
        "intervals": intervals,
        "most_rounds": rounds_design(settings.rounds, settings.most_rounds, settings.stop_early,
                                     stats.interval_confidence(intervals))[1],
        # Where the rounds stop depends on the latency gate's threshold.
        "stop_early": [settings.gates["latency"].threshold, settings.gates["latency"]["min-delta-ms"]]
        if settings.stop_early else False,
        "warmup": settings.warmup,
        "iterations": settings.iterations,
        "time_budget_s": settings.time_budget_s,
        "code": cache.files_digest(MEASURE_CODE, PACKAGE_DIR),
    })
