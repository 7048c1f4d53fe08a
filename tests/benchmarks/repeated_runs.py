"""``noise`` and ``sensitivity`` (benchmark.py says what each measures): compare runs repeated, beside a
background load or not, and what their latency gates said."""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from upgrade_gate._atomic import write_json_atomic, write_text_atomic
from upgrade_gate.layout import NOXFILE
from upgrade_gate.schema.results import Results
from upgrade_gate.schema.verdict import GateStatus

BENCHMARKS = Path(__file__).resolve().parent  # noise/, sensitivity/: their stacks and configuration

# Real models with a middling and a slow call, the same in every benchmark.
MODELS = "mobilenet-v3-small,vit-ti16,minilm-l6"


# Background loads: how many cores a busy-looping process each keeps taken.
LOADS = {"quiet": 0, "one-core": 1, "all-cores": os.cpu_count() or 1}


# The sensitivity target: runs (of ``--repeat``) in which a model's latency gate must fail, quiet or one core taken.
SENSITIVITY_FAILS = 4


SENSITIVITY_TARGET_LOADS = ("quiet", "one-core")


def compare(config: Path | None, out: Path, models: str, *extra: str,
            log_file: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`nox -s compare` on ``config``'s project; its output captured, or written to ``log_file`` as it comes (a
    long run's progress, to follow with tail -f)."""
    env = {**os.environ, **({"UPGRADE_GATE_CONFIG": str(config)} if config else {})}
    command = [sys.executable, "-m", "nox", "--noxfile", str(NOXFILE), "--no-color",
               "-s", "compare", "--", "--out", str(out), "--models", models, *extra]
    if log_file is None:
        return subprocess.run(command, env=env, capture_output=True, text=True)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with log_file.open("a", encoding="utf-8") as written:
        return subprocess.run(command, env=env, stdout=written, stderr=subprocess.STDOUT, text=True)


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
