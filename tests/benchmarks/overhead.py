"""``overhead`` (benchmark.py says what it measures): the harness against a bare loop of the same call."""

from __future__ import annotations

import json
import statistics
import subprocess
from pathlib import Path
from typing import Any

from benchmarks.repeated_runs import compare
from upgrade_gate import layout
from upgrade_gate._atomic import write_json_atomic, write_text_atomic
from upgrade_gate.config.plan import load_plan
from upgrade_gate.layout import TOOL_ROOT
from upgrade_gate.measure import rounds
from upgrade_gate.schema.measured import ratio_by_rounds

# The harness's share is largest on the fastest call: a tiny ViT (≈ 0.1-0.3 ms) besides real models.
OVERHEAD_MODELS = "vit-smoke,mobilenet-v3-small,vit-ti16"


# Pairs of blocks (harness, bare loop) of ≈ 0.25 s each: a pair's ratio is noisy on a shared
# machine, the median of 40 much less so.
OVERHEAD_PAIRS = 40


OVERHEAD_BLOCK_S = 0.25


OVERHEAD_TARGET = 1.02


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
