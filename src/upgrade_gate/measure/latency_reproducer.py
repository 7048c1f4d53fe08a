"""A latency finding's reproducer (issue 63, item 6: "each with a reproducer"), written and run by the measure
session once a model's rounds are done: where a candidate's method took more than the latency gate's threshold
times the baseline's in the rounds (the median of their ratios: the gate's own figure, whatever its interval
later says), its folder ``measurements/<model>/repro/`` holds both stacks' artifacts of that method, the fixture's
inputs, compat/device_runner.py, and latency_repro_script.py (beside this module) as ``repro.py`` with its
settings (``repro.json``): the two timed in alternating rounds, each in its own stack's Python, exit 1 while the
candidate is slower than the gate allows. It is run once here, with the report's stacks;
``latency-reproducer.json`` beside it says what it answered (schema.measured.LatencyReproducer), and the report's
latency entry quotes it. The gate is judged from the rounds, never from this run.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from upgrade_gate import layout
from upgrade_gate._atomic import write_json_atomic
from upgrade_gate._confined import remove_file, remove_tree
from upgrade_gate.config.catalog import ModelEntry
from upgrade_gate.config.plan import Plan
from upgrade_gate.judge.gather import contention_of
from upgrade_gate.layout import TOOL_ROOT
from upgrade_gate.measure.rounds import artifacts_job, runnable_stacks
from upgrade_gate.run import cache
from upgrade_gate.schema.measured import NOT_RUN, LatencyReproducer, ratio_by_rounds
from upgrade_gate.schema.measurement import load_measurement
from upgrade_gate.schema.records import load_stack_model

# The script and the server it drives, copied beside the artifacts (standard library at their top).
SCRIPT, RUNNER = Path(__file__).with_name("latency_repro_script.py"), TOOL_ROOT / "compat" / "device_runner.py"
# Each stack's runtime by its artifact's suffix (compat/device_runner.py RUNTIMES, PROGRAM_RUNTIME).
RUNTIMES = {".ptl": "lite-interpreter", ".pte": "executorch"}
# A reproducer is handed on whole: artifacts beyond this are named, not copied (nanoVLM's are gigabytes).
MAX_BYTES = 256 * 1024 * 1024
ROUNDS = 5
WARMUP = 3
# Each side's part of a round: at least this long at the rounds' mean call, and of at least MIN_CALLS calls, so
# that its median is of more than one call.
PART_S, MIN_CALLS, MAX_CALLS = 0.5, 3, 10_000
TIMEOUT_S = 600


def write_latency_reproducer(plan: Plan, model: ModelEntry, log: Callable[[str], Any] = print) -> None:
    """The model's reproducer where a candidate was found slower than the gate allows; any earlier run's removed."""
    out = plan.settings.out_dir
    folder, record = layout.latency_reproducer_dir(out, model.name), layout.latency_reproducer_file(out, model.name)
    remove_tree(folder, within=out)
    remove_file(record, within=out)
    gate = plan.settings.gates["latency"]
    found = slowest(plan, model) if gate.severity != "off" else None
    if found is None or found["ratio"] <= gate.threshold:
        return
    reproducer = _written(plan, model, found, gate.threshold, folder)
    if reproducer.script and found["busy"]:
        # Its rounds found the machine too busy to time: so would its run, which would only add to the load.
        reproducer = reproducer.answered(None, f"{NOT_RUN}the machine was too busy in the rounds to time the stacks")
    elif reproducer.script:
        reproducer = ran(reproducer, out)
        log(f"measure: {model.name}: latency reproducer of {found['stack']} ({found['method']}): exit "
            f"{reproducer.exit_code}: {reproducer.said}")
    write_json_atomic(record, reproducer.to_dict())


def slowest(plan: Plan, model: ModelEntry) -> dict[str, Any] | None:
    """The candidate, thread count and method whose median ratio of the rounds (schema.measured.ratio_by_rounds,
    every round tried) is highest, with both sides' mean call and whether the machine was too busy in those rounds
    to time; None where no candidate was timed beside the baseline."""
    base, worst = plan.baseline.name, None
    for threads in plan.settings.threads:
        measured = load_measurement(plan.settings.out_dir, model.name, threads)
        theirs = measured.stacks.get(base) if measured is not None else None
        if measured is None or theirs is None or not theirs.rounds:
            continue
        baseline_rounds = {r.round: r.samples_ms for r in theirs.rounds}
        for spec in plan.candidates:
            own = measured.stacks.get(spec.name)
            if own is None or not own.rounds or not own.warm_mean_ms:
                continue
            for method in own.warm_mean_ms:
                paired = [(list(r.samples_ms[method]), list(baseline_rounds[r.round][method])) for r in own.rounds
                          if method in r.samples_ms and method in baseline_rounds.get(r.round, {})]
                estimate = ratio_by_rounds([c for c, _ in paired], [b for _, b in paired]) if paired else None
                if estimate is not None and (worst is None or estimate.median > worst["ratio"]):
                    worst = {"stack": spec.name, "threads": threads, "method": method, "ratio": estimate.median,
                             "busy": contention_of(measured).busy,
                             "mean_ms": {base: theirs.warm_mean_ms[method], spec.name: own.warm_mean_ms[method]}}
    return worst


def _written(plan: Plan, model: ModelEntry, found: dict[str, Any], threshold: float, folder: Path) -> LatencyReproducer:
    """The reproducer's folder, or the record of why it is not written."""
    out, base, method = plan.settings.out_dir, plan.baseline.name, found["method"]
    said = LatencyReproducer(stack=found["stack"], threads=found["threads"], method=method,
                             found_ratio=round(found["ratio"], 4), threshold=threshold)
    runnable = {spec.name: bin_dir for spec, bin_dir in runnable_stacks(plan, model)[0]}
    files = {}
    for stack in (base, found["stack"]):
        record = (load_stack_model(out, stack, model.name).artifact or {}).get("methods", {}).get(method) or {}
        file = layout.model_dir(out, stack, model.name) / str(record.get("file", ""))
        if stack not in runnable or not record or not file.is_file() or file.suffix not in RUNTIMES:
            return said.not_written(f"{stack}'s artifact of {method} is not in the report folder to copy")
        files[stack] = file
    size = sum(file.stat().st_size for file in files.values())
    if size > MAX_BYTES:
        return said.not_written(f"its artifacts are {size / 2**20:.0f} MiB, over the {MAX_BYTES // 2**20} MiB a "
                                "reproducer carries: the measurement's rounds are the evidence")
    folder.mkdir(parents=True)
    settings: dict[str, Any] = {"model": model.name, "method": method, "threads": found["threads"],
                                "rounds": ROUNDS, "warmup": WARMUP, "threshold": threshold}
    for side, stack in (("baseline", base), ("candidate", found["stack"])):
        file = files[stack]
        # The Lite Interpreter's runner reads a folder of <method>.ptl; ExecuTorch's, the program file.
        artifact = f"{side}/{method}{file.suffix}" if file.suffix == ".ptl" else f"{side}{file.suffix}"
        (folder / artifact).parent.mkdir(parents=True, exist_ok=True)
        cache.copy_file(file, folder / artifact)
        settings[side] = {"stack": stack, "python": str(runnable[stack] / "python"), "runtime": RUNTIMES[file.suffix],
                          "artifact": artifact.partition("/")[0] if file.suffix == ".ptl" else artifact,
                          "calls": min(MAX_CALLS, max(MIN_CALLS, math.ceil(PART_S * 1000 / found["mean_ms"][stack])))}
    cache.copy_file(Path(artifacts_job(plan, model, plan.baseline)["fixtures_dir"]) / "inputs.npz",
                    folder / "inputs.npz")
    cache.copy_file(RUNNER, folder / RUNNER.name)
    cache.copy_file(SCRIPT, folder / "repro.py")
    (folder / "repro.json").write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")
    return said.written((folder / "repro.py").relative_to(out).as_posix())


def ran(reproducer: LatencyReproducer, out: Path) -> LatencyReproducer:
    """The reproducer run once as a team runs it, with the report's stacks: what it answered."""
    script = out / reproducer.script
    try:
        done = subprocess.run([sys.executable, str(script)], cwd=script.parent, capture_output=True, text=True,
                              timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return reproducer.answered(None, f"did not finish in {TIMEOUT_S} s")
    lines = (done.stdout + done.stderr).strip().splitlines()
    return reproducer.answered(done.returncode, lines[-1] if lines else "")
