"""A device bundle's runner (``nox -s bundle``: upgrade_gate.measure.device): one stack's artifact of one model on
the machine it runs on, with the stack's Python runtime — ExecuTorch's bundled-program loader for a ``.bpte``, the
Lite Interpreter for a ``.ptl`` — loaded once and timed a round at a time as ``run-on-device.sh`` asks, one JSON
line per round on stdout for the script to append to its results.

It is copied into the bundle alone: standard library at the top, the runtime imported by the command that needs
it, nothing of upgrade-gate. compat/common.py takes the machine's description from here, so that the bundle and
the tool describe a CPU the same way.

    python3 device_runner.py target NAME             the machine, as a results line
    python3 device_runner.py serve --runtime … …     load, verify (.bpte), warm up; then a round per `round N`

With ``--measure`` the server is the measure session's on a target over ssh (upgrade_gate.measure.targets): it
says when it is ready, with its cold start and memory, spreads its calls over the rounds as the host's servers do,
and reads the machine's CPU accounting around each round's timed part, for the parent to tell a disturbed round
(upgrade_gate.measure._contention holds the rule; this only reads the counters it needs).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import resource
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

# The ISA extensions that change which kernels a CPU backend picks (XNNPACK dispatches on them): x86 and Arm names
# as /proc/cpuinfo gives them.
ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
             "avx_vnni", "amx_tile", "amx_int8", "amx_bf16", "asimd", "asimddp", "fphp", "asimdhp", "i8mm", "bf16",
             "sve", "sve2", "sme")
# The results file's format; upgrade_gate.schema.device reads it.
RESULTS_FORMAT = 1
# What a bundle's runtimes are, by the artifact's suffix as the bundle holds it.
RUNTIMES = {".bpte": "executorch-bundled", ".ptl": "lite-interpreter"}
# A latency reproducer's candidate (upgrade_gate.measure.latency_reproducer): the program as shipped, nothing bundled.
PROGRAM_RUNTIME = "executorch"
# The Lite Interpreter's quantized kernels, set before a quantized .ptl loads (compat/torchscript_mobile.py).
QUANTIZED_ENGINE = "qnnpack"
# A round of a call that takes microseconds would otherwise be millions of calls long.
MAX_RUNS_PER_ROUND = 100_000

# A round's part (the host's measure servers' and a target's) is its calls, or stops once it has lasted this many
# times its planned length (and at least PART_LIMIT_MIN_S): on a crowded machine a 2-thread call can be a thousand
# times slower than its fastest warm call (0.03 ms to 28-84 ms), and a part of the calls sized at that fastest call
# then lasted many seconds. A part cut short disturbs its round.
PART_LIMIT_FACTOR = 10
PART_LIMIT_MIN_S = 2.0
NO_DEADLINE_NS = 2**63 - 1
# A part timed again for being short asks for this much more than the floor at the calls just timed, so that the
# next try is not short again by the calls' own jitter.
RESIZE_MARGIN = 1.2


def warm_up(time_calls: Mapping[str, Callable[[int], list[float]]], count: int, *, rounds: int, iterations: int,
            time_budget_s: float, shortest_part_s: float) -> tuple[dict[str, float], dict[str, int]]:
    """Each method's warm-up (``time_calls[method](n)`` gives n calls' times in ms): ``count`` calls, and more until
    the method's share of ``shortest_part_s`` has passed (a part is every method's calls, and the floor is the
    part's), enough for their fastest to size a round even on a busy machine. Each method's mean warm call and its
    calls per round (runs_per_round): the measure server's and this one's."""
    shortest_s = shortest_part_s / max(1, len(time_calls))
    means, runs = {}, {}
    for method, timed in time_calls.items():
        samples = list(timed(count))
        while sum(samples) < shortest_s * 1000.0 and len(samples) < MAX_RUNS_PER_ROUND:
            samples += timed(max(1, len(samples)))
        means[method] = sum(samples) / len(samples) if samples else 1e-3
        runs[method] = runs_per_round(rounds, iterations, time_budget_s, shortest_s, samples, means[method])
    return means, runs


def runs_per_round(rounds: int, iterations: int, time_budget_s: float, shortest_part_s: float,
                   warm_ms: list[float], mean_ms: float) -> int:
    """``iterations`` spread over the rounds, or more when that is less than the time budget (a round's share of
    it), and never less than ``shortest_part_s`` (the method's share of the shortest part the parent can judge).
    The budget is reckoned at the warm-up's mean, as the setting means it; the floor at its fastest call, so that a
    part lasts it however fast the calls become: a warm-up slowed by other work (or by one slow call) had given a
    part of 0.03 s, where one clock tick read as a third of a core (measure/_contention.py)."""
    by_count = math.ceil(iterations / rounds)
    by_budget = math.ceil(time_budget_s / rounds * 1000.0 / max(mean_ms, 1e-3))
    by_floor = math.ceil(shortest_part_s * 1000.0 / max(min(warm_ms, default=1e-3), 1e-3))
    return int(min(max(by_count, by_budget, by_floor), MAX_RUNS_PER_ROUND))


def part_limit_s(warm_mean_ms: dict[str, float], *, rounds: int, iterations: int, time_budget_s: float,
                 shortest_part_s: float) -> float:
    """How long a round's part may last: PART_LIMIT_FACTOR times its planned length, each method's share of the
    time budget or of the iterations at the warm-up's mean call, whichever is longer, and at least the shortest
    part (runs_per_round's terms but its floor at the fastest call, which a crowded machine multiplies)."""
    planned_s = sum(max(time_budget_s / rounds, math.ceil(iterations / rounds) * mean_ms / 1000.0)
                    for mean_ms in warm_mean_ms.values())
    return max(PART_LIMIT_FACTOR * max(planned_s, shortest_part_s), PART_LIMIT_MIN_S)


def timed_part(time_calls: Mapping[str, Callable[[int, int], list[float]]], runs: Mapping[str, int], *,
               shortest_part_s: float, limit_s: float | None) -> tuple[dict[str, list[float]], dict[str, int], int]:
    """One round's part (the host's measure servers' and a target's), its length checked as it runs: each method's
    ``runs[method]`` calls (``time_calls[method](n, deadline_ns)``: its untimed call, then n calls' times in ms),
    cut at ``limit_s`` (part_limit_s; None: never). A part shorter than ``shortest_part_s`` — the shortest the
    contention check can judge (measure/_contention.py) — is not given back: the runs are re-sized to fill the floor
    at the calls just timed and the part is timed again (a warm-up slowed throughout had sized it; one clock tick
    read as 0.44 of a core over 0.0225 s). Where MAX_RUNS_PER_ROUND holds the calls, it is timed again until the
    tries have lasted the floor together, the span the parent reads the machine over. The last try's samples, the
    runs it took (the next round's), and how many tries were short."""
    sized, short = dict(runs), 0
    started = time.perf_counter_ns()
    deadline_ns = NO_DEADLINE_NS if limit_s is None else started + int(limit_s * 1e9)
    while True:
        begun = time.perf_counter_ns()
        samples = {method: timed(sized[method], deadline_ns) for method, timed in time_calls.items()}
        ended = time.perf_counter_ns()
        lasted_s = (ended - begun) / 1e9
        if lasted_s >= shortest_part_s or any(len(samples[m]) < sized[m] for m in time_calls):
            return samples, sized, short  # long enough, or cut short (its round is disturbed anyway)
        short += 1
        # At the timed calls' own time: in a try of a few calls the untimed ones are a good share of its length.
        grow = RESIZE_MARGIN * shortest_part_s / max(sum(map(sum, samples.values())) / 1000.0, 1e-9)
        resized = {m: min(MAX_RUNS_PER_ROUND, max(count, math.ceil(count * grow))) for m, count in sized.items()}
        if resized == sized and (ended - started) / 1e9 >= shortest_part_s:
            return samples, sized, short  # at the cap: the tries together lasted the floor
        sized = resized


def memory_status() -> dict[str, int]:
    """This process's resident memory now (VmRSS) and at its peak so far (VmHWM), in bytes; where there is no
    /proc (macOS), the peak alone, for both."""
    found = {}
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                found[key] = int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    # ru_maxrss is in KiB on Linux, in bytes on macOS.
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    return {"rss_bytes": found.get("VmRSS", found.get("VmHWM", peak)), "peak_rss_bytes": found.get("VmHWM", peak)}


def counters() -> dict[str, Any] | None:
    """The machine's CPU accounting now, this process's CPU time and its threads' run-queue wait, as
    upgrade_gate.measure._contention.Snapshot holds them (field for field); None without /proc."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
        fields = [int(v) for v in lines[0].split()[1:]]
        own = Path("/proc/self/stat").read_text().rpartition(")")[2].split()
    except (OSError, ValueError, IndexError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    waited = 0
    for task in Path("/proc/self/task").iterdir():
        try:
            waited += int((task / "schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return {"wall_s": time.monotonic(), "busy_ticks": user + nice + system + irq + softirq, "steal_ticks": steal,
            "total_ticks": sum(fields[:8]), "ours_ticks": int(own[11]) + int(own[12]),
            "runnable": next((int(line.split()[1]) for line in lines if line.startswith("procs_running")), 0),
            "waited_ns": waited}


def cpu_and_isa(cpuinfo: Path = Path("/proc/cpuinfo")) -> tuple[str, list[str]]:
    """This machine's CPU by model name, and the ISA extensions of ``ISA_FLAGS`` it has (/proc/cpuinfo, or a
    phone's as adb read it; on a machine without it, the platform's name for the processor and none)."""
    model, flags = platform.processor() or platform.machine() or "unknown", set()
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Hardware") and value.strip():
            model = value.strip()
        elif key.strip() in ("flags", "Features"):
            flags |= set(value.split())
    return model, [flag for flag in ISA_FLAGS if flag in flags]


def target(args: argparse.Namespace) -> dict[str, Any]:
    """The machine the rounds run on: this one, or (``--cpuinfo`` …) a phone as adb read it."""
    cpu, isa = cpu_and_isa(Path(args.cpuinfo))
    return {"record": "target", "name": args.name, "cpu": cpu, "architecture": args.machine or platform.machine(),
            "cores": args.cores or os.cpu_count(), "isa": isa, "runner": args.runner,
            "system": "android" if args.runner == "adb" else platform.system().lower()}


def executorch_binding() -> Any:
    """ExecuTorch's compiled module, imported directly: the public wrapper imports executorch.exir first, which
    costs ~20 s per process and which a phone app does not have (compat/executorch_runtime.py uses this too)."""
    import torch  # noqa: F401 - first: the extension links against torch's libraries

    # `import a.b as c`, not `from a import b`: only the first raises ModuleNotFoundError for a missing module.
    try:
        import executorch.extension.pybindings._portable_lib as binding
    except ModuleNotFoundError:  # executorch 1.5 renamed the compiled module _C
        import executorch.extension.pybindings._C as binding
    return binding


def _inputs(path: Path, method: str) -> tuple[Any, ...]:
    import numpy as np
    import torch

    with np.load(path) as arrays:
        count = sum(1 for key in arrays.files if key.startswith(f"{method}.input_"))
        return tuple(torch.from_numpy(arrays[f"{method}.input_{i}"].copy()) for i in range(count))


def _time(call: Any, warmup: int, calls: int, deadline_ns: int = NO_DEADLINE_NS) -> list[float]:
    """``calls`` calls' times in ms, after ``warmup`` untimed; fewer where one ends past ``deadline_ns``
    (``time.perf_counter_ns``, as compat/measure_server.py's time_runs)."""
    for _ in range(warmup):
        call()
    samples = []
    for _ in range(calls):
        start = time.perf_counter_ns()
        call()
        end = time.perf_counter_ns()
        samples.append((end - start) / 1e6)
        if end > deadline_ns:
            break
    return samples


_KEPT_ALIVE: list[Any] = []


def executorch_calls(args: argparse.Namespace, methods: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Load the bundled program and check every method against its bundled outputs (ExecuTorch's verification, in
    the bundle's order: a method may read what an earlier one wrote), or the plain program (PROGRAM_RUNTIME); each
    method's call on the fixture's inputs, and what the load said: its time, each method's first run, and the
    memory of the runtime alone, before the load."""
    binding = executorch_binding()
    binding._unsafe_reset_threadpool(args.threads)  # before any load (compat/executorch_xnnpack.py set_threads)
    idle = memory_status()
    bundled = args.runtime == RUNTIMES[".bpte"]
    start = time.perf_counter_ns()
    buffer = Path(args.artifact).read_bytes()
    bundle = binding._load_bundled_program_from_buffer(buffer) if bundled else None
    module = (binding._load_for_executorch_from_bundled_program(bundle) if bundled
              else binding._load_for_executorch_from_buffer(buffer))
    # The loaded program reads the bundle's bytes in place, not a copy: they live as long as the server (freed,
    # a later call read reused memory and crashed in Program::method_meta).
    _KEPT_ALIVE.extend((buffer, bundle))
    load_ms = (time.perf_counter_ns() - start) / 1e6
    inputs = {method: _inputs(Path(args.inputs), method) for method in methods}
    calls = {method: functools.partial(module.run_method, method, inputs[method]) for method in methods}
    first_ms = {} if bundled else {method: _time(call, 0, 1)[0] for method, call in calls.items()}
    for method in methods if bundled else ():
        module.load_bundled_input(bundle, method, 0)
        start = time.perf_counter_ns()
        module.plan_execute(method)
        first_ms[method] = (time.perf_counter_ns() - start) / 1e6
        module.verify_result_with_bundled_expected_output(bundle, method, 0, args.rtol, args.atol)
    return calls, {"load_ms": load_ms, "verified": True if bundled else None, "first_ms": first_ms, "idle": idle}


def lite_calls(args: argparse.Namespace, methods: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Load each method's ``.ptl`` in the Lite Interpreter; its call on the fixture's inputs, and what the load
    said (as executorch_calls)."""
    import torch
    from torch.jit.mobile import _load_for_lite_interpreter

    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    torch.backends.quantized.engine = QUANTIZED_ENGINE
    idle = memory_status()
    folder, load_ms, calls, first_ms = Path(args.artifact), 0.0, {}, {}
    for method in methods:
        start = time.perf_counter_ns()
        program = _load_for_lite_interpreter(str(folder / f"{method}.ptl"))
        load_ms += (time.perf_counter_ns() - start) / 1e6
        calls[method] = functools.partial(program, *_inputs(Path(args.inputs), method))
    for method, call in calls.items():
        first_ms[method] = _time(call, 0, 1)[0]
    return calls, {"load_ms": load_ms, "verified": None, "first_ms": first_ms, "idle": idle}


def _failed(line: dict[str, Any], error: Exception) -> dict[str, Any]:
    tail = traceback.format_exception(error)[-3:]
    return {**line, "record": "failed", "error": f"{type(error).__name__}: {error}"[:2000],
            "traceback_tail": [text.rstrip() for text in tail]}


def serve(args: argparse.Namespace, requests: Any, answer: Any) -> int:
    """Load once, warm up, then one round per request (``round N`` on stdin; anything else ends it), as the
    measure session's servers do: each round calls every method once untimed (the other stack ran since), then
    times ``--calls`` calls of it (``--measure``: as many as runs_per_round gives). One JSON line per round on
    stdout; a load or a round that fails is a ``failed`` line, and the server ends. With ``--measure``, a
    ``ready`` line (or the load's ``failed`` one) comes first and an ``exit`` line with the peak memory last."""
    methods = args.methods.split(",")
    line = {"record": "round", "model": args.model, "stack": args.stack, "threads": args.threads}

    def say(data: dict[str, Any]) -> None:
        answer.write(json.dumps(data) + "\n")
        answer.flush()

    try:
        calls, loaded = (lite_calls if args.runtime == RUNTIMES[".ptl"] else executorch_calls)(args, methods)
        after_first = memory_status()
        warm_calls = {method: functools.partial(_time, call, 0) for method, call in calls.items()}
        warm_mean_ms, sized_runs = warm_up(warm_calls, args.warmup, rounds=args.rounds, iterations=args.iterations,
                                           time_budget_s=args.time_budget, shortest_part_s=args.shortest_part)
    except Exception as error:  # noqa: BLE001 - a stack that cannot run says how, every round it was asked for
        failure = _failed({**line, "round": 0}, error)
        for number in [0] if args.measure else _rounds(requests):
            say({**failure, "round": number})
        return 1
    if args.measure:
        runs = sized_runs
        limit_s: float | None = part_limit_s(warm_mean_ms, rounds=args.rounds, iterations=args.iterations,
                                             time_budget_s=args.time_budget, shortest_part_s=args.shortest_part)
        say({**line, "record": "ready", "cold": {"load_ms": loaded["load_ms"], "first_ms": loaded["first_ms"]},
             "idle": loaded["idle"], "after_first_run": after_first, "warm_mean_ms": warm_mean_ms,
             "runs_per_round": runs, "verified": loaded["verified"]})
    else:
        runs, limit_s = {method: args.calls for method in calls}, None  # --calls as asked, however long
    # Each round calls every method once untimed (the other stack ran since), then times its calls.
    part_calls = {method: functools.partial(_time, call, 1) for method, call in calls.items()}
    for number in _rounds(requests):
        try:
            before = counters() if args.measure else None
            samples, runs, short = timed_part(part_calls, runs, shortest_part_s=args.shortest_part, limit_s=limit_s)
            timed: dict[str, Any] = {"counters": {"before": before, "after": counters()}} if args.measure else {}
            if short:
                print(f"round {number}: a part shorter than {args.shortest_part} s timed again {short} time(s); "
                      f"its calls now {runs}", file=sys.stderr, flush=True)
            if any(len(samples[method]) < runs[method] for method in calls):
                timed["cut_after_s"] = limit_s  # the part cut short: its round is disturbed (measure/rounds.py)
        except Exception as error:  # noqa: BLE001 - as above
            say(_failed({**line, "round": number}, error))
            return 1
        say({**line, "round": number, "calls": runs if args.measure else args.calls, "load_ms": loaded["load_ms"],
             "verified": loaded["verified"], "samples_ms": samples, **timed})
    if args.measure:
        say({**line, "record": "exit", "memory": memory_status()})
    return 0


def _rounds(requests: Any) -> Iterator[int]:
    """The number of each ``round N`` request, until a request that is none."""
    for request in requests:
        if not request.startswith("round "):
            return
        yield int(request.split()[1])


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.command == "serve":
        if not args.measure:
            return serve(args, sys.stdin, sys.stdout)
        # Answers on a copy of stdout; what the runtime or the model prints goes to stderr (the log), not among them.
        answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
        os.dup2(2, 1)
        return serve(args, sys.stdin, answers)
    sys.stdout.write(json.dumps(target(args)) + "\n")
    return 0


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python3 device_runner.py")
    commands = parser.add_subparsers(dest="command", required=True)
    machine = commands.add_parser("target")
    machine.add_argument("name")
    machine.add_argument("--cpuinfo", default="/proc/cpuinfo")
    machine.add_argument("--machine", default="")
    machine.add_argument("--cores", type=int, default=0)
    machine.add_argument("--runner", default="python", choices=("python", "adb"))
    rounds = commands.add_parser("serve")
    rounds.add_argument("--runtime", choices=sorted([*RUNTIMES.values(), PROGRAM_RUNTIME]), required=True)
    rounds.add_argument("--artifact", required=True, help="the .bpte, or the folder of a stack's .ptl files")
    rounds.add_argument("--inputs", required=True, help="the model's inputs.npz")
    rounds.add_argument("--methods", required=True)
    rounds.add_argument("--model", required=True)
    rounds.add_argument("--stack", required=True)
    rounds.add_argument("--threads", type=int, required=True)
    rounds.add_argument("--warmup", type=int, required=True)
    rounds.add_argument("--calls", type=int, default=0, help="timed calls a round (without --measure)")
    rounds.add_argument("--measure", action="store_true", help="the measure session's server over ssh: a ready line, "
                        "calls spread by --iterations/--rounds/--time-budget/--shortest-part, counters each round")
    rounds.add_argument("--iterations", type=int, default=0)
    rounds.add_argument("--rounds", type=int, default=1)
    rounds.add_argument("--time-budget", type=float, default=0.0)
    rounds.add_argument("--shortest-part", type=float, default=0.0)
    rounds.add_argument("--rtol", type=float, required=True)
    rounds.add_argument("--atol", type=float, required=True)
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
