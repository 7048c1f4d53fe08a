"""The measurement server behind upgrade_gate.measure.rounds: one process per stack, model
and thread count, timing rounds when the parent asks.

It starts the runtime, notes its resident memory, loads the artifacts and runs
each method once (the cold start), warms up, then times one round per request.
The parent talks to it over two pipes of its own (file descriptors named in
UPGRADE_GATE_CONTROL_FDS), one JSON object per line, so a model or runtime that
prints cannot break the protocol; stdout and stderr stay the log. Every step
announces itself ("stage" events), so the parent can hold each to its deadline.
"""

from __future__ import annotations

import functools
import json
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .common import MethodCall, export_stages, fixture_inputs, jsonable, load_methods, saved_files
from .contract import Adapter, require

# Shared with the device bundle's runner, which times a target's rounds the same way (and is copied alone).
from .device_runner import NO_DEADLINE_NS, memory_status, part_limit_s, timed_part, warm_up

# upgrade_gate.measure.rounds names the same variable: the parent cannot be imported here.
CONTROL_FDS_ENV = "UPGRADE_GATE_CONTROL_FDS"


def time_runs(run: Callable[[Any, Any], Any], program: Any, inputs: Any, runs: int,
              deadline_ns: int = NO_DEADLINE_NS) -> list[float]:
    """The harness: ``run(program, inputs)`` as a bare loop would call it, with
    one clock read before and after (its cost against the bare loop is
    benchmarked: docs/benchmarks.md); fewer calls where one ends past ``deadline_ns``
    (``time.perf_counter_ns``), checked between a call's clock reads and the next's, an int to an int."""
    clock = time.perf_counter_ns
    samples = [0.0] * runs
    for index in range(runs):
        start = clock()
        run(program, inputs)
        end = clock()
        samples[index] = (end - start) / 1e6
        if end > deadline_ns:
            return samples[:index + 1]
    return samples


def untimed_then_timed(run: Callable[[Any, Any], Any], program: Any, inputs: Any, runs: int,
                       deadline_ns: int) -> list[float]:
    """A method's share of a round's part: one call untimed (the other stack ran since this method's last call),
    then ``runs`` timed (time_runs)."""
    run(program, inputs)
    return time_runs(run, program, inputs, runs, deadline_ns)


class Channel:
    """Requests in, events out, one JSON object per line."""

    def __init__(self) -> None:
        read_fd, write_fd = (int(fd) for fd in os.environ[CONTROL_FDS_ENV].split(","))
        self.requests = os.fdopen(read_fd, "r", encoding="utf-8")
        self.events = os.fdopen(write_fd, "w", encoding="utf-8")

    def send(self, event: str, **data: Any) -> None:
        self.events.write(json.dumps(jsonable({"event": event, **data})) + "\n")
        self.events.flush()

    def receive(self) -> dict[str, Any]:
        line = self.requests.readline()
        return json.loads(line) if line else {"command": "exit"}


def serve(job: dict[str, Any], adapter: Adapter, channel: Channel) -> None:
    """Start, wait for the word to load, then load, warm up and answer the parent's requests until it says
    exit. What raises (an adapter without part of the contract too) is the worker's to send as an "error" event."""
    require(adapter, job["adapter"])
    model_dir, methods = Path(job["model_dir"]), job["methods"]
    adapter.set_threads(job["threads"])
    args = fixture_inputs(Path(job["fixtures_dir"]), methods)
    # "The same process doing nothing but starting the runtime": imports done,
    # threads set, inputs in memory; what loading and running adds is the model's.
    idle = memory_status()
    # The parent starts every side's server at once, so that their imports run side by side, and tells each to
    # load when the others wait idle: a cold start timed beside another server's start would time both.
    channel.send("started")
    if channel.receive()["command"] != "load":
        channel.send("exit", memory=memory_status())
        return

    channel.send("stage", stage="load")
    start = time.perf_counter_ns()
    # A remedied side's: the remedied methods' files (relative to the model's folder) in place of the shipped ones.
    files = {**saved_files(export_stages(model_dir)), **(job.get("artifacts") or {})}
    # Each method's call and its loaded artifact (a multi-method program is loaded once).
    calls = load_methods(adapter, model_dir, {name: files[name] for name in methods})
    load_ms = (time.perf_counter_ns() - start) / 1e6
    first_ms = {}
    for name in methods:
        first_ms[name] = time_runs(*calls[name], args[name], 1)[0]
    after_first = memory_status()

    channel.send("stage", stage="warm-up")
    warm_mean_ms, runs = warm_up({name: functools.partial(time_runs, *calls[name], args[name]) for name in methods},
                                 job["warmup"], rounds=job["rounds"], iterations=job["iterations"],
                                 time_budget_s=job["time_budget_s"], shortest_part_s=job["shortest_part_s"])
    channel.send("ready", cold={"load_ms": load_ms, "first_ms": first_ms}, idle=idle, after_first_run=after_first,
                 warm_mean_ms=warm_mean_ms, runs_per_round=runs,
                 input_shapes={name: [list(t.shape) for t in args[name]] for name in methods})
    limit_s = part_limit_s(warm_mean_ms, rounds=job["rounds"], iterations=job["iterations"],
                           time_budget_s=job["time_budget_s"], shortest_part_s=job["shortest_part_s"])

    part_calls = {name: functools.partial(untimed_then_timed, *calls[name], args[name]) for name in methods}
    while (request := channel.receive())["command"] in ("round", "overhead"):
        channel.send("stage", stage="round")
        if request["command"] == "overhead":
            channel.send("overhead", blocks=harness_overhead(calls, args, warm_mean_ms, request["pairs"],
                                                             request["block_s"]))
            continue
        samples, runs, short = timed_part(part_calls, runs, shortest_part_s=job["shortest_part_s"], limit_s=limit_s)
        if short:  # the log's: the round's samples are the try that lasted
            print(f"round {request['round']}: a part shorter than {job['shortest_part_s']} s timed again {short} "
                  f"time(s); its calls now {runs}", file=sys.stderr, flush=True)
        cut = any(len(samples[name]) < runs[name] for name in methods)
        channel.send("round", round=request["round"], samples_ms=samples, **({"cut_after_s": limit_s} if cut else {}))
    channel.send("exit", memory=memory_status())


def harness_overhead(calls: dict[str, tuple[MethodCall, Any]], args: dict[str, Any], warm_mean_ms: dict[str, float],
                     pairs: int, block_s: float) -> dict[str, list[dict[str, float]]]:
    """The benchmark of time_runs itself: pairs of blocks of the same calls,
    one through the harness and one in a bare loop, in alternating order;
    each block's wall time per call."""
    found: dict[str, list[dict[str, float]]] = {}
    for name, (run, program) in calls.items():
        count = max(5, math.ceil(block_s * 1000.0 / max(warm_mean_ms[name], 1e-3)))
        through_harness = functools.partial(time_runs, run, program, args[name], count)
        bare = functools.partial(_bare_loop, run, program, args[name], count)
        for index in range(pairs):
            if index % 2:
                bare_ms, harness_ms = _per_call_ms(bare, count), _per_call_ms(through_harness, count)
            else:
                harness_ms, bare_ms = _per_call_ms(through_harness, count), _per_call_ms(bare, count)
            found.setdefault(name, []).append({"harness_ms": harness_ms, "bare_ms": bare_ms, "calls": count})
    return found


def _bare_loop(run: Callable[[Any, Any], Any], program: Any, inputs: Any, count: int) -> None:
    for _ in range(count):
        run(program, inputs)


def _per_call_ms(block: Callable[[], Any], count: int) -> float:
    """One block's wall time per call."""
    start = time.perf_counter_ns()
    block()
    return (time.perf_counter_ns() - start) / 1e6 / count
