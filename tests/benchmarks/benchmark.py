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
* ``zoo`` — real architectures from the package index (timm, torchvision, transformers from their configs,
  ultralytics from its yamls; random seeded weights, real photos and sentences), fp32 and int8, through both
  stacks as a team runs its own models (``zoo/pyproject.toml``), and the table in docs/benchmarks.md: each
  stack's outcome per model, every candidate failure's class, and whether its Way out named the operator,
  reproduced and found a passing remedy. ``--models a,b`` runs part of it; run again, it resumes from the result
  cache; ``--report DIR`` writes the table of a finished report folder without running anything.
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
from pathlib import Path
from typing import Any

from benchmarks.gate_errors import coverage, gate_coverage, looks
from benchmarks.overhead import OVERHEAD_MODELS, overhead
from benchmarks.repeated_runs import LOADS, MODELS, repeated_compare
from benchmarks.replays import past_planned, stop_early
from benchmarks.run_times import stages, worker_start
from benchmarks.workflow import workflow
from benchmarks.zoo import zoo
from upgrade_gate.pipeline import check_writable

NAMES = ("overhead", "noise", "sensitivity", "coverage", "gate", "looks", "stages", "stop-early", "most-rounds",
         "workflow", "worker-start", "zoo")


def main(argv: list[str], log: Any = print, invoked_from: Path | None = None) -> int:
    """`nox -s benchmark -- NAME ...`: 0 when the benchmark met its target. Relative paths are from
    ``invoked_from``, the folder the command ran in (nox runs sessions in the noxfile's)."""
    parser = argparse.ArgumentParser(prog="nox -s benchmark --")
    parser.add_argument("name", choices=NAMES)
    parser.add_argument("--repeat", type=int, default=5, help="compare runs for noise and sensitivity (default 5)")
    parser.add_argument("--load", choices=[*LOADS, "all"], default="quiet",
                        help="background load during noise and sensitivity: quiet (default), one-core, all-cores, "
                             "or all three in turn")
    parser.add_argument("--models", help=f"models to run (default {MODELS}; for overhead {OVERHEAD_MODELS}; for zoo "
                                         "all of zoo/pyproject.toml)")
    parser.add_argument("--out", type=Path, help="where results go (default benchmarks/NAME)")
    parser.add_argument("--report", type=Path,
                        help="stages, stop-early, most-rounds: the report folder to read (default report); zoo: "
                             "write the table of this finished report folder, running nothing")
    parser.add_argument("--carried", type=Path,
                        help="workflow: the result caches carried between runs, one folder per shard "
                             "(default OUT/actions-cache)")
    args = parser.parse_args(argv)
    here = invoked_from or Path.cwd()
    out = (here / (args.out or Path("benchmarks") / args.name)).resolve()
    report = (here / (args.report or Path("report"))).resolve()
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
    if args.name == "zoo":
        return zoo(out, args.models, report if args.report else None, log)
    if args.name == "worker-start":
        return worker_start(out, args.models, log)
    loads = list(LOADS) if args.load == "all" else [args.load]
    missed = [load for load in loads
              if repeated_compare(args.name, out, args.models or MODELS, args.repeat, load, log)]
    return 1 if missed else 0
