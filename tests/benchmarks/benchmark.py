"""Benchmarks of the measurement itself (docs/benchmarks.md): ``nox -s benchmark -- NAME``.

A tool of this repository, not part of what a team installs: the noxfile loads it from a checkout's
tests/benchmarks/, which the wheel does not carry.

* ``overhead`` — per-call latency through the harness (``time_runs`` in the
  measurement server, under the supervisor) against a bare loop of the same
  runtime call in the same process, in alternating block pairs; and the
  harness's fixed cost per call, measured on a call that does nothing. Target:
  ≤ 1.02 on every call, and no pair interval wholly above it.
* ``coverage`` — the latency ratio's interval, by simulation: how often it
  holds a known true ratio, against the coverage it states, per number of
  rounds (no stacks: upgrade_gate.stats, and the measure session's own
  loop with in-process servers for stop-early). Target: never below the stated level.
* ``gate`` — the latency gate's own error rate, per number of intervals it judges
  (thread counts × methods), every true ratio at the threshold: how often it fails
  wrongly and how often it calls any interval clear, exactly (every sign sequence)
  and simulated through the measure session's loop and the gate's rule, with every
  interval at 95% (before issue 37: the audit's figures) and at its share of the
  gate's 95% (now); and what the shares cost in rounds and decisions. Target: the
  gate's figures, exact and simulated, within 5%.
* ``stages`` — where a finished run's time went (``--report DIR``, no stacks
  run): per stack, each model's export and runtime phase (the sum of their
  stages), the candidate exports' floor on the machine's export workers, and
  the measure session's model calls (timed samples, warm-up and first calls).
* ``stop-early`` — what stopping the rounds early saves, replayed on a finished
  run's own rounds (``--report DIR``, measured with fixed rounds; no stacks run):
  where each measurement would have stopped (the measure session's loop, rounds.run_rounds,
  played on the recorded rounds) and the seconds of rounds after that, against all its
  rounds' seconds.
* ``most-rounds`` — what the rounds past the planned ones decided, replayed on a finished run's own rounds
  (``--report DIR``, made with ``most-rounds`` past ``rounds``; no stacks run): each latency gate as the
  planned rounds alone would have left it and as the run judged it (the looks up to the planned rounds are
  the same in both), and the seconds of the rounds past them.
* ``workflow`` — one run of the sample CI workflow (docs/ci/upgrade-gate.yml) on this machine, as
  ``tests/test_integration.py`` rehearses it, on the configured suite: each shard job in a folder of
  its own with the result cache restored from ``--carried DIR`` (what actions/cache keeps between
  runs, per shard), its ``upgrade-gate`` commands timed, its cache saved back; then the report job.
  The jobs' times, the saved caches' and the shard folders' sizes. Run it again for an unchanged
  pull request, or after editing a model.
* ``worker-start`` — the export and runtime phases of ``--models`` (default: the default suite) run twice
  through both stacks, each time with a result cache of its own: with the fork servers
  (``worker-start = "fork"``) and with a fresh interpreter per phase (``"fresh"``). Each way's time,
  its workers' seconds outside their stages (the start and the imports: ``stages``' table), and every
  file the phases left in the two caches compared by SHA-256 (artifacts, eager and runtime outputs).
  Target: every file identical.
* ``noise`` — a stack against an identical copy of itself, five times, each
  time measured afresh. Target: no latency gate fails, whatever the load.
* ``sensitivity`` — a stack against a copy that is 20% slower (its adapter
  spins for a fifth of each call's time after the call), five times. Target:
  the latency gate fails in at least 4 of 5 runs of every model on a quiet
  machine and with one core taken; with every core taken, reported as it is.

``--load`` runs ``noise`` and ``sensitivity`` beside a background load the
benchmark starts itself — busy-looping processes, one per core taken
(``one-core``, ``all-cores``; ``all`` runs quiet and both in turn). A run first
makes sure the exports exist (a compare without the load, not counted); the
counted runs re-measure with the load on.

Each runs real stacks; the stack specs and configuration of ``noise`` and
``sensitivity`` are beside this file. Results go to ``--out`` (default
``benchmarks/<name>``) as JSON and Markdown; the figures in docs/ come from there.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import scripted
from upgrade_gate import layout
from upgrade_gate._atomic import sha256_file, write_json_atomic, write_text_atomic
from upgrade_gate._confined import remove_tree
from upgrade_gate.config import catalog
from upgrade_gate.config.plan import Shard, load_plan
from upgrade_gate.errors import EXIT_USAGE
from upgrade_gate.layout import NOXFILE, TOOL_ROOT
from upgrade_gate.measure import rounds
from upgrade_gate.pipeline import check_writable
from upgrade_gate.run import cache_folder, guard
from upgrade_gate.schema.measured import RoundsEnded, ratio_by_rounds
from upgrade_gate.schema.results import Results
from upgrade_gate.schema.verdict import GateStatus
from upgrade_gate.stages import RUNTIME_STAGES
from upgrade_gate.stats import (
    fewest_rounds,
    interval_confidence,
    median_interval,
    median_interval_rank,
    sequential_looks,
    sequential_rank,
)

BENCHMARKS = Path(__file__).resolve().parent  # noise/, sensitivity/: their stacks and configuration
NAMES = ("overhead", "noise", "sensitivity", "coverage", "gate", "looks", "stages", "stop-early", "most-rounds",
         "workflow", "worker-start")
# Real models with a middling and a slow call, the same in every benchmark.
MODELS = "mobilenet-v3-small,vit-ti16,minilm-l6"
# The harness's share is largest on the fastest call: a tiny ViT (≈ 0.1-0.3 ms) besides real models.
OVERHEAD_MODELS = "vit-smoke,mobilenet-v3-small,vit-ti16"
# Pairs of blocks (harness, bare loop) of ≈ 0.25 s each: a pair's ratio is noisy on a shared
# machine, the median of 40 much less so.
OVERHEAD_PAIRS = 40
OVERHEAD_BLOCK_S = 0.25
OVERHEAD_TARGET = 1.02


# Background loads: how many cores a busy-looping process each keeps taken.
LOADS = {"quiet": 0, "one-core": 1, "all-cores": os.cpu_count() or 1}
# The sensitivity target: runs (of ``--repeat``) in which a model's latency gate must fail, quiet or one core taken.
SENSITIVITY_FAILS = 4
SENSITIVITY_TARGET_LOADS = ("quiet", "one-core")


def main(argv: list[str], log: Any = print, invoked_from: Path | None = None) -> int:
    """`nox -s benchmark -- NAME ...`: 0 when the benchmark met its target. Relative paths are from
    ``invoked_from``, the folder the command ran in (nox runs sessions in the noxfile's)."""
    parser = argparse.ArgumentParser(prog="nox -s benchmark --")
    parser.add_argument("name", choices=NAMES)
    parser.add_argument("--repeat", type=int, default=5, help="compare runs for noise and sensitivity (default 5)")
    parser.add_argument("--load", choices=[*LOADS, "all"], default="quiet",
                        help="background load during noise and sensitivity: quiet (default), one-core, all-cores, "
                             "or all three in turn")
    parser.add_argument("--models", help=f"models to run (default {MODELS}; for overhead {OVERHEAD_MODELS})")
    parser.add_argument("--out", type=Path, help="where results go (default benchmarks/NAME)")
    parser.add_argument("--report", type=Path, default=Path("report"),
                        help="stages, stop-early, most-rounds: the report folder to read")
    parser.add_argument("--carried", type=Path,
                        help="workflow: the result caches carried between runs, one folder per shard "
                             "(default OUT/actions-cache)")
    args = parser.parse_args(argv)
    here = invoked_from or Path.cwd()
    out = (here / (args.out or Path("benchmarks") / args.name)).resolve()
    report = (here / args.report).resolve()
    check_writable(out, what="benchmark folder", fix="choose another with --out DIR")  # else exit 2, naming it
    if args.name == "overhead":
        return overhead(out, args.models or OVERHEAD_MODELS, log)
    if args.name == "coverage":
        return coverage(out, log)
    if args.name == "gate":
        return gate_coverage(out, log)
    if args.name == "looks":
        return looks(out, log)
    if args.name == "stages":
        return stages(report, out, log)
    if args.name == "stop-early":
        return stop_early(report, out, log)
    if args.name == "most-rounds":
        return past_planned(report, out, log)
    if args.name == "workflow":
        return workflow(out, (here / args.carried if args.carried else out / "actions-cache").resolve(), log)
    if args.name == "worker-start":
        return worker_start(out, args.models, log)
    loads = list(LOADS) if args.load == "all" else [args.load]
    missed = [load for load in loads
              if repeated_compare(args.name, out, args.models or MODELS, args.repeat, load, log)]
    return 1 if missed else 0


def compare(config: Path | None, out: Path, models: str, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **({"UPGRADE_GATE_CONFIG": str(config)} if config else {})}
    command = [sys.executable, "-m", "nox", "--noxfile", str(NOXFILE), "--no-color",
               "-s", "compare", "--", "--out", str(out), "--models", models, *extra]
    return subprocess.run(command, env=env, capture_output=True, text=True)


@contextlib.contextmanager
def background_load(cores: int) -> Iterator[None]:
    """``cores`` processes that keep a core busy each, as another job on the machine would."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def repeated_compare(name: str, out: Path, models: str, repeat: int, load: str, log: Any) -> int:
    """``repeat`` compares of two stacks that measure afresh, beside ``load``; 0 when the target is met."""
    config = BENCHMARKS / name / "pyproject.toml"
    folder = out / load
    prepared = compare(config, folder / "exports", models)  # the exports, made or reused: not counted
    if not (folder / "exports" / "verdict.json").is_file():
        log(prepared.stderr[-3000:])
        raise SystemExit(f"benchmark {name}: the exports' run wrote no verdict (exit {prepared.returncode})")
    runs: list[dict[str, Any]] = []
    with background_load(LOADS[load]):
        for index in range(1, repeat + 1):
            report = folder / f"run-{index}"
            start = time.monotonic()
            result = compare(config, report, models, "--remeasure")
            if not (report / "verdict.json").is_file():
                log(result.stderr[-3000:])
                raise SystemExit(f"benchmark {name}: run {index} wrote no verdict (exit {result.returncode})")
            runs.append(_run_summary(index, time.monotonic() - start, report))
            log(f"benchmark {name} ({load}): run {index}: "
                + ", ".join(f"{model} {g['status']}" for model, g in runs[-1]["latency_gates"].items()))
    summary = summarize_runs(name, load, models.split(","), runs)
    write_json_atomic(out / f"{name}-{load}.json", summary)
    write_text_atomic(out / f"{name}-{load}.md", _compare_markdown(summary))
    log((out / f"{name}-{load}.md").read_text())
    return 1 if summary["met"] is False else 0


def summarize_runs(name: str, load: str, models: list[str], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The runs' latency gates counted, and whether the benchmark's target was met (None: it has none)."""
    statuses = [g["status"] for run in runs for g in run["latency_gates"].values()]
    failed_runs = {model: sum(_gate_status(run, model) == GateStatus.FAILED for run in runs) for model in models}
    if name == "noise":
        met: bool | None = GateStatus.FAILED not in statuses
    else:  # with every core taken there is no target: what it gives is reported
        met = min(failed_runs.values()) >= SENSITIVITY_FAILS if load in SENSITIVITY_TARGET_LOADS else None
    return {
        "benchmark": name,
        "load": load,
        "background_processes": LOADS[load],
        "models": models,
        "runs": runs,
        "latency_gates": len(statuses),
        **{status.value: statuses.count(status) for status in GateStatus},
        "failed_runs_per_model": failed_runs,
        "run_to_run": _run_to_run(runs),
        "met": met,
    }


def _run_summary(index: int, seconds: float, report: Path) -> dict[str, Any]:
    """One run: its latency gates, its ratios, and how busy the machine was per model and thread count."""
    verdict = json.loads((report / "verdict.json").read_text())
    results = Results.load(report)
    return {
        "run": index,
        "seconds": round(seconds, 1),
        "latency_gates": {g["model"]: {"status": g["status"], "measured": g["measured"], "note": g["note"]}
                          for g in verdict["gates"] if g["gate"] == "latency"},
        "ratios": [{"model": m.name, "threads": r.threads, "method": r.method, **r.estimate.to_dict()}
                   for m in results.models for r in m.ratios],
        "machine": [{"model": m.name, "threads": c.threads, "rounds": len(c.rounds), "quiet": c.quiet,
                     "others_cores": c.typical_others, "oversubscribed": c.oversubscribed}
                    for m in results.models for c in m.contention.values()],
    }


def _run_to_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """How far one row's median ratio moved between runs: the spread upgrade_gate.report.diff calls noise."""
    medians: dict[tuple[str, int, str], list[float]] = {}
    for run in runs:
        for r in run["ratios"]:
            medians.setdefault((r["model"], r["threads"], r["method"]), []).append(r["median"])
    spreads = [max(values) / min(values) - 1 for values in medians.values() if len(values) > 1]
    return {"rows": len(spreads), "largest": max(spreads, default=None),
            "median": statistics.median(spreads) if spreads else None}


def _compare_markdown(summary: dict[str, Any]) -> str:
    target = {None: "no target", True: "target met", False: "target MISSED"}[summary["met"]]
    spread = summary["run_to_run"]
    lines = [f"# {summary['benchmark']}, {summary['load']} ({summary['background_processes']} busy background "
             f"processes): {summary['failed']} failed, {summary['incomplete']} incomplete, "
             f"{summary['inconclusive']} inconclusive, {summary['passed']} passed of {summary['latency_gates']} "
             f"latency gates; {target}", "",
             "Latency gates failed per model: " + ", ".join(f"{m} {n}/{len(summary['runs'])}"
                                                            for m, n in summary["failed_runs_per_model"].items()),
             ""]
    if spread["rows"]:
        lines += [f"Run to run, one row's median ratio moved by up to {spread['largest']:.1%} (median over the "
                  f"{spread['rows']} rows: {spread['median']:.1%}).", ""]
    lines += ["| run | time | model | threads | method | ratio | interval | coverage | rounds quiet | others (cores) "
              "| gate |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for run in summary["runs"]:
        machine = {(m["model"], m["threads"]): m for m in run["machine"]}
        for r in run["ratios"]:
            gate = _gate_status(run, r["model"])
            m = machine.get((r["model"], r["threads"]), {})
            others = "—" if m.get("others_cores") is None else f"{m['others_cores']:.2f}"
            lines.append(f"| {run['run']} | {run['seconds']:.0f} s | {r['model']} | {r['threads']} | {r['method']} | "
                         f"{r['median']:.3f} | [{r['low']:.3f}, {r['high']:.3f}] | {r['level']:.1%} | "
                         f"{m.get('quiet', '—')}/{m.get('rounds', '—')} | {others} | {gate} |")
        for (model, threads), m in machine.items():  # a thread count with no ratio: the machine was too busy
            if not any(r["model"] == model and r["threads"] == threads for r in run["ratios"]):
                others = "—" if m.get("others_cores") is None else f"{m['others_cores']:.2f}"
                lines.append(f"| {run['run']} | {run['seconds']:.0f} s | {model} | {threads} | — | — | — | — | "
                             f"{m['quiet']}/{m['rounds']} | {others} | {_gate_status(run, model)} |")
    return "\n".join(lines) + "\n"


def _gate_status(run: dict[str, Any], model: str) -> str:
    """A model's latency gate in one run; none where only one stack ran it (a variant the slow copy lacks)."""
    return run["latency_gates"].get(model, {}).get("status", "no gate (one stack)")


# Simulated experiments per number of rounds, and the numbers of rounds shown.
COVERAGE_TRIALS = 20_000
COVERAGE_RAW_TRIALS = 5_000
COVERAGE_ROUNDS = (5, 6, 7, 8, 9, 10, 12, 15, 20)
COVERAGE_STOP_TRIALS = 5_000  # through the measure session's loop: a few milliseconds each


def coverage(out: Path, log: Any) -> int:
    """How often the interval holds a known true ratio (1.1), per number of rounds: per-round ratios
    with log-normal and heavy-tailed (Student t, 2 degrees of freedom) noise, and whole experiments
    from raw samples (each round a machine factor both stacks share, 20 samples a side, through
    ratio_by_rounds). Met when no simulated coverage lies below the stated one by more than three
    standard errors."""
    rng = np.random.default_rng(17)
    true_ratio, met = 1.1, True
    rows: list[dict[str, Any]] = []
    for n in COVERAGE_ROUNDS:
        k, level = median_interval_rank(n)
        observed = {}
        for noise in ("lognormal", "student-t2"):
            spread = rng.standard_t(2, size=(COVERAGE_TRIALS, n)) if noise == "student-t2" else \
                rng.standard_normal((COVERAGE_TRIALS, n))
            intervals = [median_interval(r) for r in (true_ratio * np.exp(0.1 * spread)).tolist()]
            observed[noise] = sum(low <= true_ratio <= high for _, low, high, _ in intervals) / COVERAGE_TRIALS
        covered = 0
        for _ in range(COVERAGE_RAW_TRIALS):
            machine = np.exp(0.15 * rng.standard_normal(n))
            base = [(10 * m * np.exp(0.05 * rng.standard_normal(20))).tolist() for m in machine]
            cand = [(10 * true_ratio * m * np.exp(0.05 * rng.standard_normal(20))).tolist() for m in machine]
            estimate = ratio_by_rounds(cand, base)
            covered += estimate is not None and estimate.low <= true_ratio <= estimate.high
        observed["raw samples"] = covered / COVERAGE_RAW_TRIALS
        for name, value in observed.items():
            trials = COVERAGE_RAW_TRIALS if name == "raw samples" else COVERAGE_TRIALS
            met = met and value >= level - 3 * math.sqrt(level * (1 - level) / trials)
        # Rounds that stop early at the sequential design's looks, as the measure session runs them (its loop,
        # in-process servers), the threshold at the true ratio (the worst case: every early stop is a miss),
        # log-normal rounds.
        sequential: dict[str, Any] = {}
        if n >= fewest_rounds():
            _, stated = sequential_rank(n, n)
            held = 0
            for row in (true_ratio * np.exp(0.1 * rng.standard_normal((COVERAGE_STOP_TRIALS, n)))).tolist():
                (_, estimate), = scripted.measure([row], threshold=true_ratio, planned=n, stop_early=True,
                                                   intervals=1).outcomes
                held += estimate.low <= true_ratio <= estimate.high
            held_share = held / COVERAGE_STOP_TRIALS
            met = met and held_share >= stated - 3 * math.sqrt(stated * (1 - stated) / COVERAGE_STOP_TRIALS)
            sequential = {"looks": sequential_looks(n), "stated_sequential": stated, "sequential": held_share}
        rows.append({"rounds": n, "k": k, "stated": level, **observed, **sequential})
    write_json_atomic(out / "coverage.json", {"benchmark": "coverage", "true_ratio": true_ratio, "met": met,
                                              "trials": COVERAGE_TRIALS, "raw_trials": COVERAGE_RAW_TRIALS,
                                              "stop_trials": COVERAGE_STOP_TRIALS, "rows": rows})
    lines = [f"# coverage: the interval holds the true ratio as often as it says: {'met' if met else 'MISSED'}",
             "", "| rounds | interval | stated coverage | log-normal | heavy-tailed (t₂) | from raw samples | "
             "stop-early: looks (rank) | stated | simulated, threshold at the true ratio |",
             "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['rounds']} | x({r['k']})…x({r['rounds'] - r['k'] + 1}) | {r['stated']:.1%} | "
              f"{r['lognormal']:.1%} | {r['student-t2']:.1%} | {r['raw samples']:.1%} | "
              + (f"{', '.join(f'{n} ({k})' for n, k in r['looks'].items())} | {r['stated_sequential']:.1%} | "
                 f"{r['sequential']:.1%} |" if "looks" in r else "— | — | — |") for r in rows]
    write_text_atomic(out / "coverage.md", "\n".join(lines) + "\n")
    log((out / "coverage.md").read_text())
    return 0 if met else 1


# Gates by their thread counts × methods: one interval; the audit's 2 and 3 (as thread counts, and as methods of one
# measurement, whose rounds stop together); SmolLM2's 2 × 2; nanoVLM's 2 × 6, the most the default 9 rounds hold.
GATE_SHAPES = ((1, 1), (2, 1), (1, 2), (3, 1), (1, 3), (2, 2), (2, 6))
GATE_ROUNDS = 9  # the default
GATE_TRIALS = 4_000  # simulated gates per shape and design, through the measure session's loop
GATE_SPREAD = 0.1  # per-round ratios log-normal with this σ, as in ``coverage``
GATE_TARGET = 0.05
GATE_THRESHOLD = 1.05  # the latency gate's default max-ratio: the simulations' threshold


def exact_gate_errors(threads: int, methods: int, planned: int, stop_early: bool,
                      confidence: float, most: int = 0) -> tuple[float, float]:
    """A latency gate of ``threads`` × ``methods`` intervals, every true ratio exactly at the threshold, each
    interval's rounds independent, each interval at ``confidence``: the chance that the gate fails (an interval
    wholly above) and that it calls any interval clear (wholly above or within) — both wrong there — counted
    exactly. A round's ratio falls below its median as a fair coin: every sign sequence of the rounds (``planned``,
    or up to ``most`` with stop-early where looks past them fit) gives one interval's state at each look (with
    stop-early; else at the last round); a measurement's methods stop together, at the first look where every one
    is clear or one has failed (the gate is then decided); thread counts are measurements of their own."""
    looks = sequential_looks(planned, confidence, most) if stop_early else {planned: median_interval_rank(planned,
                                                                                                          confidence)[0]}
    length = max(looks)
    paths: dict[tuple[str, ...], float] = {}  # one interval: its state at each look → probability
    for bits in range(2**length):
        below = [bits >> i & 1 for i in range(length)]
        states = tuple("failed" if sum(below[:n]) < k else "passed" if n - sum(below[:n]) < k else "inconclusive"
                       for n, k in looks.items())
        paths[states] = paths.get(states, 0.0) + 2.0**-length
    # One measurement's methods: per look, whether every interval is clear, any failed, any clear.
    joint: dict[tuple[tuple[bool, bool, bool], ...], float] = {tuple((True, False, False) for _ in looks): 1.0}
    for _ in range(methods):
        step: dict[tuple[tuple[bool, bool, bool], ...], float] = {}
        for flags, p in joint.items():
            for states, q in paths.items():
                after = tuple((every and state != "inconclusive", failed or state == "failed",
                               clear or state != "inconclusive")
                              for (every, failed, clear), state in zip(flags, states, strict=True))
                step[after] = step.get(after, 0.0) + p * q
        joint = step
    failed = clear = 0.0
    for flags, p in joint.items():
        stop = next((index for index, (every, failed_here, _) in enumerate(flags) if every or failed_here),
                    len(flags) - 1)
        failed += p * flags[stop][1]
        clear += p * flags[stop][2]
    return 1 - (1 - failed) ** threads, 1 - (1 - clear) ** threads


def simulated_gate(threads: int, methods: int, true_ratio: float, threshold: float, intervals: int,
                   stop_early: bool, rng: np.random.Generator, trials: int = GATE_TRIALS,
                   planned: int = GATE_ROUNDS, most: int = 0) -> dict[str, float]:
    """``trials`` gates measured and judged by the code that runs (scripted.measure: rounds.run_rounds, the gate's
    rule), every interval's true ratio ``true_ratio``, each at its share of a gate of ``intervals``: the share
    that failed, that called any interval clear, that passed, and the rounds each measurement took on average."""
    failed = clear = passed = taken = 0
    for _ in range(trials):
        measured = [scripted.measure(
            (true_ratio * np.exp(GATE_SPREAD * rng.standard_normal((methods, max(planned, most))))).tolist(),
            threshold=threshold, planned=planned, stop_early=stop_early, intervals=intervals, most=most)
            for _ in range(threads)]
        outcome = scripted.gate(measured)
        failed += outcome == "failed"
        passed += outcome == "passed"
        clear += any(o != "inconclusive" for m in measured for o, _ in m.outcomes)
        taken += sum(len(m.tried) for m in measured)
    return {"failed": failed / trials, "clear": clear / trials, "passed": passed / trials,
            "rounds": taken / trials / threads}


def gate_coverage(out: Path, log: Any) -> int:
    """The latency gate's own error rate, per shape (thread counts × methods), at the threshold: exact and
    simulated, every interval at 95% (before) and at its share of the gate's 95% (now); and the cost of the
    shares: the fewest rounds per number of intervals, and how often a gate decides 20% from the threshold."""
    rng = np.random.default_rng(37)
    threshold = GATE_THRESHOLD
    rows: list[dict[str, Any]] = []
    met = True
    for threads, methods in GATE_SHAPES:
        m = threads * methods
        row: dict[str, Any] = {"threads": threads, "methods": methods, "intervals": m,
                               "fewest_rounds": fewest_rounds(interval_confidence(m))}
        for design, intervals in (("before", 1), ("now", m)):
            confidence = interval_confidence(intervals)
            row[design] = {
                "looks": sequential_looks(GATE_ROUNDS, confidence),
                "exact_fixed": exact_gate_errors(threads, methods, GATE_ROUNDS, False, confidence),
                "exact_stop_early": exact_gate_errors(threads, methods, GATE_ROUNDS, True, confidence),
                "at_threshold": simulated_gate(threads, methods, threshold, threshold, intervals, True, rng),
                "slower": simulated_gate(threads, methods, threshold * 1.2, threshold, intervals, True, rng,
                                         GATE_TRIALS // 4),
                "faster": simulated_gate(threads, methods, threshold / 1.2, threshold, intervals, True, rng,
                                         GATE_TRIALS // 4),
            }
        now = row["now"]
        error = math.sqrt(GATE_TARGET * (1 - GATE_TARGET) / GATE_TRIALS)
        met = met and max(*now["exact_fixed"], *now["exact_stop_early"]) <= GATE_TARGET \
            and now["at_threshold"]["clear"] <= GATE_TARGET + 3 * error
        rows.append(row)
        log(f"benchmark gate: {threads} thread count(s) × {methods} method(s) done")
    write_json_atomic(out / "gate.json", {"benchmark": "gate", "rounds": GATE_ROUNDS, "threshold": threshold,
                                          "spread": GATE_SPREAD, "trials": GATE_TRIALS, "target": GATE_TARGET,
                                          "met": met, "rows": rows})

    def pair(figures: tuple[float, float]) -> str:
        return f"{figures[0]:.2%} / {figures[1]:.2%}"

    lines = [f"# gate: a latency gate's own error rate at the threshold, {GATE_ROUNDS} rounds at most: "
             f"{'met' if met else 'MISSED'} (target: ≤ {GATE_TARGET:.0%} wrongly clear, now)", "",
             "Every true ratio at the threshold: wrongly failed / wrongly clear (any interval wholly above or "
             "within). Exact: every sign sequence, intervals independent; simulated: "
             f"{GATE_TRIALS} gates through the measure session's loop and the gate's rule, log-normal rounds.", "",
             "| thread counts × methods | fewest rounds now | before: exact, fixed rounds | before: exact, stop-early "
             "| before: simulated | now: looks (rank) | now: exact, fixed rounds | now: exact, stop-early | "
             "now: simulated |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        before, now = r["before"], r["now"]
        lines.append(f"| {r['threads']} × {r['methods']} | {r['fewest_rounds']} | {pair(before['exact_fixed'])} | "
                     f"{pair(before['exact_stop_early'])} | "
                     f"{pair((before['at_threshold']['failed'], before['at_threshold']['clear']))} | "
                     f"{', '.join(f'{n} ({k})' for n, k in now['looks'].items())} | {pair(now['exact_fixed'])} | "
                     f"{pair(now['exact_stop_early'])} | "
                     f"{pair((now['at_threshold']['failed'], now['at_threshold']['clear']))} |")
    lines += ["", f"The cost: every true ratio 20% beyond the threshold ({threshold * 1.2:.2f}, "
                  f"{threshold / 1.2:.3f}), {GATE_TRIALS // 4} gates each: how often the gate decides, and the "
                  "rounds a measurement took.", "",
              "| thread counts × methods | slower: failed before | now | rounds before | now | faster: passed before "
              "| now | rounds before | now |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        before, now = r["before"], r["now"]
        lines.append(f"| {r['threads']} × {r['methods']} | {before['slower']['failed']:.1%} | "
                     f"{now['slower']['failed']:.1%} | {before['slower']['rounds']:.2f} | "
                     f"{now['slower']['rounds']:.2f} | {before['faster']['passed']:.1%} | "
                     f"{now['faster']['passed']:.1%} | "
                     f"{before['faster']['rounds']:.2f} | {now['faster']['rounds']:.2f} |")
    write_text_atomic(out / "gate.md", "\n".join(lines) + "\n")
    log((out / "gate.md").read_text())
    return 0 if met else 1


# Issue 40 item 4: rounds that go on past the default's 9 only while an interval straddles the threshold. The
# designs compared, (rounds, most-rounds): 9 and none past them (before); 9, then up to 15 with the 9 rounds'
# looks kept (stats.looks_past: the default now); 15 planned (its looks from 7 up, each of its parts shorter).
LOOKS_DESIGNS = ((9, 9), (9, 15), (15, 15))
# True ratios near the threshold, as a multiple of it: where today's 9 rounds leave the gate inconclusive.
LOOKS_DISTANCES = (1.03, 1.05, 1.08, 1 / 1.03, 1 / 1.05, 1 / 1.08)
LOOKS_SHAPES = ((1, 1), (2, 1), (2, 2), (2, 6))
LOOKS_TRIALS = 1_000


def looks(out: Path, log: Any) -> int:
    """Decide the near-threshold gates: each design's looks, its exact error rate at the threshold (it must stay
    within 5%: every sign sequence, as ``gate``), and, simulated through the measure session's loop and the gate's
    rule, how often a gate whose true ratio is near the threshold decides (rightly) and the rounds it takes."""
    rng = np.random.default_rng(41)
    threshold = GATE_THRESHOLD
    rows: list[dict[str, Any]] = []
    met = True
    for threads, methods in LOOKS_SHAPES:
        intervals = threads * methods
        confidence = interval_confidence(intervals)
        for planned, most in LOOKS_DESIGNS:
            wrong = exact_gate_errors(threads, methods, planned, True, confidence, most)
            met = met and max(wrong) <= GATE_TARGET
            near = {f"{d:.3f}": simulated_gate(threads, methods, threshold * d, threshold, intervals, True, rng,
                                               LOOKS_TRIALS, planned, most) for d in LOOKS_DISTANCES}
            rows.append({"threads": threads, "methods": methods, "planned": planned, "most": most,
                         "looks": sequential_looks(planned, confidence, most), "exact_at_threshold": wrong,
                         "near": near})
        log(f"benchmark looks: {threads} thread count(s) × {methods} method(s) done")
    write_json_atomic(out / "looks.json", {"benchmark": "looks", "threshold": threshold, "spread": GATE_SPREAD,
                                           "trials": LOOKS_TRIALS, "target": GATE_TARGET, "met": met, "rows": rows})
    heads = " | ".join(f"×{d:.3f}" for d in LOOKS_DISTANCES)
    lines = [f"# looks: rounds past 9 only while an interval straddles — coverage {'kept' if met else 'MISSED'} "
             f"(exact error at the threshold ≤ {GATE_TARGET:.0%})", "",
             f"Per-round ratios log-normal, σ = {GATE_SPREAD}; threshold {threshold}; a cell: the share of "
             f"{LOOKS_TRIALS} gates that decided rightly (failed above the threshold, passed below) · mean rounds.", "",
             f"| thread counts × methods | rounds, most-rounds | looks (rank) | exact: wrongly failed / clear | {heads} |",
             "|---|---|---|---|" + "---|" * len(LOOKS_DISTANCES)]
    for r in rows:
        cells = []
        for d in LOOKS_DISTANCES:
            sim = r["near"][f"{d:.3f}"]
            cells.append(f"{sim['failed' if d > 1 else 'passed']:.1%} · {sim['rounds']:.1f}")
        lines.append(f"| {r['threads']} × {r['methods']} | {r['planned']}, {r['most']} | "
                     f"{', '.join(f'{n} ({k})' for n, k in r['looks'].items())} | "
                     f"{r['exact_at_threshold'][0]:.2%} / {r['exact_at_threshold'][1]:.2%} | {' | '.join(cells)} |")
    write_text_atomic(out / "looks.md", "\n".join(lines) + "\n")
    log((out / "looks.md").read_text())
    return 0 if met else 1


# Runs in a stack's interpreter: compat/measure_server.py's time_runs against a bare loop, on a call that does
# nothing. compat/ is loaded as the worker loads it, as a package of its own.
HARNESS_COST = """
import importlib, importlib.util, json, statistics, sys, time
spec = importlib.util.spec_from_file_location("upgrade_gate_compat", sys.argv[1] + "/__init__.py",
                                              submodule_search_locations=[sys.argv[1]])
sys.modules[spec.name] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sys.modules[spec.name])
worker = importlib.import_module("upgrade_gate_compat.measure_server")

def nothing(program, inputs):
    return None

calls, extra = 200_000, []
for _ in range(15):
    start = time.perf_counter_ns()
    worker.time_runs(nothing, None, None, calls)
    harness = time.perf_counter_ns() - start
    start = time.perf_counter_ns()
    for _ in range(calls):
        nothing(None, None)
    extra.append((harness - (time.perf_counter_ns() - start)) / calls)
print(json.dumps(statistics.median(extra)))
"""


def harness_cost_ns(bin_dir: Path) -> float:
    """What time_runs adds to each call, in nanoseconds, in this stack's interpreter."""
    result = subprocess.run([str(bin_dir / "python"), "-P", "-c", HARNESS_COST, str(TOOL_ROOT / "compat")],
                            capture_output=True, text=True, check=True)
    return max(0.0, float(json.loads(result.stdout)))


def overhead(out: Path, models: str, log: Any) -> int:
    """The harness against a bare loop, in every stack of the default configuration."""
    report = out / "report"
    result = compare(None, report, models)
    if not (report / "results.json").is_file():
        log(result.stderr[-3000:])
        raise SystemExit(f"benchmark overhead: the compare wrote no results (exit {result.returncode})")
    plan = load_plan(["--out", str(report), "--models", models], invoked_from=Path.cwd())
    rows = []
    for model in plan.models:
        runnable, _ = rounds.runnable_stacks(plan, model)
        for spec, bin_dir in runnable:
            for threads in plan.settings.threads:
                folder = layout.measurement_dir(out, model.name)
                folder.mkdir(parents=True, exist_ok=True)
                server, record = rounds.start_server(plan, model, rounds.Side(spec.name, spec, bin_dir), threads,
                                                      folder / f"threads-{threads}.json")
                if server is None:
                    raise SystemExit(f"benchmark overhead: {model.name} in {spec.name}: {record.get('error')}")
                try:
                    event = server.request({"command": "overhead", "pairs": OVERHEAD_PAIRS,
                                            "block_s": OVERHEAD_BLOCK_S}, "overhead")
                finally:
                    server.close()
                for method, blocks in event["blocks"].items():
                    # A pair is a round: the harness's block over the bare loop's, measured back to back.
                    estimate = ratio_by_rounds([[b["harness_ms"]] for b in blocks], [[b["bare_ms"]] for b in blocks])
                    assert estimate is not None
                    rows.append({"model": model.name, "stack": spec.name, "threads": threads, "method": method,
                                 "calls_per_block": blocks[0]["calls"],
                                 "bare_ms": statistics.median(b["bare_ms"] for b in blocks),
                                 "harness_ms": statistics.median(b["harness_ms"] for b in blocks),
                                 "extra_us": statistics.median((b["harness_ms"] - b["bare_ms"]) * 1000 for b in blocks),
                                 **estimate.to_dict()})
    # On a shared machine the block pairs' noise is larger than the harness's cost, which
    # is fixed per call (two clock reads, a list store): it is measured apart, on a call
    # that does nothing, in each stack's interpreter, and added to every row's bare call.
    runnable, _ = rounds.runnable_stacks(plan, plan.models[0])
    cost_ns = {spec.name: harness_cost_ns(bin_dir) for spec, bin_dir in runnable}
    for row in rows:
        row["harness_cost_ns"] = cost_ns[row["stack"]]
        row["implied_ratio"] = 1 + cost_ns[row["stack"]] / 1e6 / row["bare_ms"]
    # Met when the cost is within the target on every call, and no pair's interval lies
    # wholly above it (the latency gate's rule).
    met = all(r["implied_ratio"] <= OVERHEAD_TARGET and r["low"] <= OVERHEAD_TARGET for r in rows)
    worst = max(rows, key=lambda r: r["implied_ratio"])
    write_json_atomic(out / "overhead.json", {"benchmark": "overhead", "pairs": OVERHEAD_PAIRS,
                                              "block_s": OVERHEAD_BLOCK_S, "target": OVERHEAD_TARGET,
                                              "harness_cost_ns": cost_ns, "met": met, "rows": rows})
    lines = [f"# overhead: the harness costs {', '.join(f'{n} {c:.0f} ns' for n, c in cost_ns.items())} per call: "
             f"{worst['implied_ratio']:.5f} on the shortest call ({worst['model']}, {worst['stack']}, "
             f"{worst['bare_ms']:.3f} ms); target ≤ {OVERHEAD_TARGET} {'met' if met else 'MISSED'}", "",
             "| model | stack | threads | method | calls per block | bare loop | through the harness | "
             f"ratio (median of {OVERHEAD_PAIRS} pairs) | interval (coverage) | bare + harness cost |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['stack']} | {r['threads']} | {r['method']} | {r['calls_per_block']} | "
              f"{r['bare_ms']:.4f} ms | {r['harness_ms']:.4f} ms | {r['median']:.4f} | "
              f"[{r['low']:.4f}, {r['high']:.4f}] ({r['level']:.1%}) | {r['implied_ratio']:.5f} |" for r in rows]
    write_text_atomic(out / "overhead.md", "\n".join(lines) + "\n")
    log((out / "overhead.md").read_text())
    return 0 if met else 1


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


def stop_early(report: Path, out: Path, log: Any) -> int:
    """Each measurement of ``report`` made with fixed rounds, replayed with stop-early on its own
    rounds: the quiet round it would have stopped after (the rule the measure session applies, with
    the report's latency threshold), and the seconds of the rounds tried after it (every stack's
    part, as the contention record timed it) against the seconds of all its rounds."""
    results = Results.load(report)
    rows: list[dict[str, Any]] = []
    for path, data in _measurements(report):
        replayed, tried = _replay(results, data, past_planned=False), data.get("rounds") or []
        seconds = _round_seconds(tried)
        decided = replayed.ended is RoundsEnded.DECIDED
        rows.append({"measurement": path.relative_to(report).as_posix(), "rounds": len(tried),
                     "stopped_after": sum(not entry["disturbed"] for entry in replayed.tried) if decided else None,
                     "rounds_s": sum(seconds), "saved_s": sum(seconds[len(replayed.tried):]) if decided else 0.0})
    total, saved = sum(r["rounds_s"] for r in rows), sum(r["saved_s"] for r in rows)
    lines = [f"# stop-early replayed on {report}: {saved:.0f} s of {total:.0f} s of rounds saved "
             f"({saved / total if total else 0:.1%}), {sum(r['stopped_after'] is not None for r in rows)} of "
             f"{len(rows)} measurements stopped early", "",
             "| measurement | rounds tried | stopped after | rounds s | saved s |", "|---|---|---|---|---|"]
    lines += [f"| {r['measurement']} | {r['rounds']} | {r['stopped_after'] or '—'} | {r['rounds_s']:.1f} | "
              f"{r['saved_s']:.1f} |" for r in rows]
    write_json_atomic(out / "stop-early.json", {"benchmark": "stop-early", "report": str(report), "rows": rows,
                                                "rounds_s": total, "saved_s": saved})
    write_text_atomic(out / "stop-early.md", "\n".join(lines) + "\n")
    log("\n".join(lines))
    return 0


NO_RATIO = "no ratio"  # most-rounds: a model's gate the run could not judge, whatever its rounds


def past_planned(report: Path, out: Path, log: Any) -> int:
    """The latency gates a finished run (``report``, made with ``most-rounds`` past ``rounds``) decided with the
    rounds past the planned ones, counted on its own rounds: each measurement replayed (scripted.replay) with the
    planned rounds only and with the most-rounds it was made with. The looks up to the planned rounds are the
    same in both designs (stats.looks_past), so the first replay is how this run would have ended without the
    rounds past them: the same samples, one run, no run-to-run noise. The second must stop where the run did
    (else exit 1: the replay is not the run's) and judge each gate as verdict.json does."""
    results = Results.load(report)
    verdict = json.loads((report / "verdict.json").read_text(encoding="utf-8"))
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    rounds_s: dict[Path, float] = {}  # each measurement's rounds, whichever candidate is judged
    for candidate in [stack.name for stack in results.candidates]:
        judged = {g["model"]: g["status"] for g in verdict["gates"]
                  if g["gate"] == "latency" and g["stack"] == candidate}
        for path, data in _measurements(report):
            planned_only, as_run = (_replay(results, data, past_planned=past, candidate=candidate)
                                    for past in (False, True))
            model, tried = path.parent.name, data.get("rounds") or []
            seconds = _round_seconds(tried)
            rounds_s[path] = sum(seconds)
            row = rows.setdefault((model, candidate), {
                "model": model, "candidate": candidate, "verdict": judged.get(model, "no gate"),
                "planned": int(data["settings"]["rounds"]), "rounds": {}, "past_planned_s": 0.0, "replayed_as_run": True,
                "measurements": {"planned": [], "as_run": []}})
            row["rounds"][int(data["threads"])] = len(tried)
            row["past_planned_s"] += sum(seconds[len(planned_only.tried):])
            row["replayed_as_run"] &= len(as_run.tried) == len(tried)
            row["measurements"]["planned"].append(planned_only)
            row["measurements"]["as_run"].append(as_run)
    for row in rows.values():
        measurements = row.pop("measurements")
        # A variant one stack has, or a stack whose artifact did not load: no ratio, no gate to count.
        ratio = any(m.outcomes for m in measurements["as_run"])
        row["at_planned"], row["as_run"] = (scripted.gate(measurements[design]) if ratio else NO_RATIO
                                            for design in ("planned", "as_run"))
    table = sorted(rows.values(), key=lambda r: (r["model"], r["candidate"]))
    inconclusive = {design: sum(r[design] == "inconclusive" for r in table) for design in ("at_planned", "as_run")}
    past_s, all_s = sum(r["past_planned_s"] for r in table), sum(rounds_s.values())
    decided = [r for r in table if r["at_planned"] == "inconclusive" != r["as_run"]]
    mismatched = [r for r in table
                  if not r["replayed_as_run"] or (r["as_run"] != NO_RATIO and r["as_run"] != r["verdict"])]
    lines = [f"# rounds past the planned ones, replayed on {report}: latency gates inconclusive "
             f"{inconclusive['at_planned']} at the planned rounds, {inconclusive['as_run']} as run "
             f"({len(decided)} decided by the rounds past them: "
             f"{', '.join(r['model'] + ' ' + r['as_run'] for r in decided) or 'none'}); "
             f"{past_s:.0f} s of {all_s:.0f} s of rounds were past them", "",
             "| model | candidate | at the planned rounds | as run | rounds tried per thread count | s past planned | "
             "verdict.json |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['candidate']} | {r['at_planned']} | {r['as_run']} | "
              f"{', '.join(f'{t}: {n}' for t, n in sorted(r['rounds'].items()))} | {r['past_planned_s']:.1f} | "
              f"{r['verdict']}{'' if r['replayed_as_run'] else ' (the replay did not stop where the run did)'} |"
              for r in table]
    if mismatched:
        lines += ["", f"The replay is not this run's for {', '.join(r['model'] for r in mismatched)}: its rounds or "
                      f"its gate differ from what the run recorded."]
    write_json_atomic(out / "most-rounds.json", {"benchmark": "most-rounds", "report": str(report), "rows": table,
                                                 "inconclusive": inconclusive, "past_planned_s": past_s,
                                                 "rounds_s": all_s})
    write_text_atomic(out / "most-rounds.md", "\n".join(lines) + "\n")
    log("\n".join(lines))
    return 1 if mismatched else 0


def _round_seconds(tried: list[dict[str, Any]]) -> list[float]:
    """Each round's seconds, as tried: every stack's part, as the contention record timed it."""
    return [sum(load["seconds"] for load in entry["load"].values() if load) for entry in tried]


def _measurements(report: Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    """Each measurement file of ``report``, read."""
    for path in sorted((report / "measurements").glob("*/threads-*.json")):
        yield path, json.loads(path.read_text(encoding="utf-8"))


def _replay(results: Results, data: dict[str, Any], *, past_planned: bool,
            candidate: str | None = None) -> scripted.Measurement:
    """A measurement file's rounds replayed with stop-early (scripted.replay), the report's latency threshold and
    the file's planned rounds; ``past_planned``: up to the most-rounds it was made with, else never past the
    planned ones. Judged for ``candidate`` (default: the first)."""
    gate = results.settings.gates["latency"]
    baseline, stacks = results.baseline.name, [stack.name for stack in results.candidates]
    how = data["settings"]
    planned = int(how["rounds"])
    methods = {method for stack in data["stacks"].values() if stack.get("status") == "ok"
               for entry in stack.get("rounds") or () for method in entry["samples_ms"]}
    confidence = interval_confidence(int(how.get("intervals") or len(results.settings.threads) * len(methods)))
    # The rounds went on until the remedied sides were decided too (rounds.measure_model).
    candidates = [*stacks, *(data.get("remedied") or {})]
    return scripted.replay(data, baseline=baseline, candidates=candidates, candidate=candidate or stacks[0],
                           threshold=gate.threshold, min_delta_ms=gate["min-delta-ms"], confidence=confidence,
                           planned=planned, most=int(how.get("most_rounds") or planned) if past_planned else planned)


SAMPLE_WORKFLOW = layout.TOOL_ROOT / "docs" / "ci" / "upgrade-gate.yml"


def workflow_commands() -> tuple[list[int], list[str], str]:
    """The sample workflow's shards, its shard job's upgrade-gate commands in order, and the report job's."""
    lines = [line.strip() for line in SAMPLE_WORKFLOW.read_text().splitlines()]
    shards = next(json.loads(line.split(":", 1)[1]) for line in lines if line.startswith("shard: ["))
    commands = [line.split("run: ", 1)[1] for line in lines if line.startswith("run: upgrade-gate ")]
    shard_job = [c for c in commands if "${{ matrix.shard }}" in c]
    merge = next(c for c in commands if c.startswith("upgrade-gate report "))
    return shards, shard_job, merge


def workflow(out: Path, carried: Path, log: Any) -> int:
    shards, shard_job, merge = workflow_commands()
    run = out / time.strftime("run-%Y%m%d-%H%M%S")
    (run / "shards").mkdir(parents=True)
    rows: list[dict[str, Any]] = []
    for k in shards:
        job = run / f"shard-job-{k}"
        job.mkdir()
        results, saved = job / "upgrade-gate-cache", carried / f"shard{k}"
        if saved.is_dir():
            link_tree(saved, results)
        seconds: dict[str, float] = {}
        for command in shard_job:
            command = command.replace("${{ matrix.shard }}", str(k))
            start = time.monotonic()
            done = run_workflow_command(command, job, {"UPGRADE_GATE_CACHE": str(results)})
            seconds[command.split(" -- ")[0]] = time.monotonic() - start
            (job / f"step-{len(seconds)}.log").write_text(done.stdout + done.stderr)
            log(f"shard {k}: {command}: exit {done.returncode} in {seconds[command.split(' -- ')[0]]:.0f} s")
            if done.returncode == EXIT_USAGE:  # configured wrong: nothing of the run is worth timing
                refusal = next((line for line in reversed((done.stdout + done.stderr).splitlines())
                                if line.startswith("upgrade-gate: error:")), "see its log")
                guard.fail_usage(f"the workflow's `{command}` was refused ({job / f'step-{len(seconds)}.log'}): "
                                 + refusal.removeprefix("upgrade-gate: error: "))
        shutil.rmtree(saved, ignore_errors=True)
        if results.is_dir():  # a job that stored nothing saves nothing
            link_tree(results, saved)
        folder = job / f"shard-{k}"
        folder.rename(run / "shards" / folder.name)
        rows.append({"shard": k, "seconds": seconds, "cache_bytes": cache_folder.tree_bytes(saved),
                     "folder_bytes": cache_folder.tree_bytes(run / "shards" / folder.name)})
    start = time.monotonic()
    merged = run_workflow_command(merge, run, {})
    report = {"seconds": time.monotonic() - start, "exit": merged.returncode,
              "folder_bytes": cache_folder.tree_bytes(run / "report")}
    write_json_atomic(run / "workflow.json", {"benchmark": "workflow", "jobs": rows, "report": report})
    lines = [f"# workflow run {run.name}: report job exit {merged.returncode} in {report['seconds']:.0f} s, "
             f"merged folder {report['folder_bytes'] / 2**30:.2f} GiB", "",
             "| shard job | " + " | ".join(rows[0]["seconds"]) + " | saved cache | shard folder |",
             "|---|" + "---|" * (len(rows[0]["seconds"]) + 2)]
    lines += [f"| {r['shard']} | " + " | ".join(f"{v:.0f} s" for v in r["seconds"].values())
              + f" | {r['cache_bytes'] / 2**30:.2f} GiB | {r['folder_bytes'] / 2**30:.2f} GiB |" for r in rows]
    write_text_atomic(run / "workflow.md", "\n".join(lines) + "\n")
    log("\n".join(lines))
    return 0


def run_workflow_command(command: str, cwd: Path, env: dict[str, str], envdir: Path | None = None,
                         timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    """A workflow's ``upgrade-gate`` command as the job's shell runs it, with this checkout's package (the
    installed command is tests/test_installed.py's); its venvs in ``envdir`` (default: the job's .nox/)."""
    sessions, _, arguments = command.partition(" -- ")
    here = sessions.replace("upgrade-gate ", f"{sys.executable} -m upgrade_gate ", 1)
    venvs = f" --envdir {envdir}" if envdir else ""
    return subprocess.run(["bash", "-c", f"{here} --no-color{venvs} -- {arguments}"], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(layout.PACKAGE_DIR.parent), **env})


def link_tree(source: Path, target: Path) -> None:
    """A copy of a cache folder, as actions/cache makes one, in hard links where the disk allows: entries are
    written whole under a new name, never changed in place, so the copies cannot reach each other."""
    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(source, target, copy_function=link)
