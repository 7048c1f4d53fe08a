"""``zoo`` (benchmark.py): real architectures from the package index (zoo/pyproject.toml, zoo/zoo_models.py) run
through both stacks as a team runs its own models, and the table of what happened written into docs/benchmarks.md:
per model, each stack's outcome; every candidate failure's class; whether its Way out named the operator (or said
why not), wrote a reproducer that reproduces, and found a remedy that passes.

A failure's class is where the candidate stopped or which gate it failed: build (the factory, its eager run),
quantize, export (torch.export), lower (XNNPACK's partitioner and to_executorch: the export stage raised from
executorch's code, or the save stage failed), load, run, numerics (numerics, quantized-numerics and task gates),
latency, memory, size.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.repeated_runs import compare
from upgrade_gate._atomic import write_json_atomic, write_text_atomic
from upgrade_gate.schema.results import ModelResults, Results
from upgrade_gate.schema.stack import StackResults
from upgrade_gate.schema.verdict import GateResult, GateStatus

ZOO = Path(__file__).resolve().parent / "zoo"
CONFIG = ZOO / "pyproject.toml"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md"
COMMAND = "nox -s benchmark -- zoo"
# The table's section of docs/benchmarks.md, replaced whole on each run.
START, END = "<!-- zoo: written by `nox -s benchmark -- zoo`; replaced on each run -->", "<!-- zoo: end -->"
NOT_RUN = "not run"
RUNS = "zoo-runs.json"  # beside the report folder: each compare's wall time and machine (a resume adds one)

CLASSES = ("build", "quantize", "export", "lower", "load", "run", "numerics", "latency", "memory", "size")
STAGE_CLASS = {"build": "build", "eager": "build", "eager-task": "build", "quantize": "quantize",
               "export": "export", "save": "lower", "inputs": "load", "load": "load", "run": "run", "task": "run"}
GATE_CLASS = {"numerics": "numerics", "quantized-numerics": "numerics", "task": "numerics", "latency": "latency",
              "memory": "memory", "artifact-size": "size"}
ROOT_GATES = ("export", "quantized-export")  # their failure is the first stage that did not succeed


@dataclass(frozen=True, kw_only=True)
class Failure:
    """One candidate failure and what the Way out did about it."""

    model: str
    kind: str  # one of CLASSES
    said: str  # the gate's note or the stage's error, one line
    entry: str  # "named", "why not" (an entry that says why it names none) or "none"
    found: str  # the operators named, or why not
    reproduces: bool | None  # None: no reproducer written
    remedy: bool | None  # None: no remedy tried


@dataclass(frozen=True, kw_only=True)
class Row:
    model: str
    variant: str
    family: str
    baseline: str
    candidate: str
    failures: tuple[Failure, ...]
    seconds: float  # both stacks' phases' stage time, made or reused


def zoo(out: Path, models: str | None, report: Path | None, log: Any) -> int:
    """Run the zoo (or ``models`` of it) into ``out``/report and write its table; with ``report``, only the table of
    that finished report folder. 0 when a table was written."""
    if report is None:
        report = out / "report"
        started = time.time()
        log(f"benchmark zoo: compare → {report}; its output: {out / 'compare.log'}")
        exit_status: int | str = "stopped"  # a run stopped part-way still counts its wall time, which a resume adds to
        try:
            exit_status = compare(CONFIG, report, models or ",".join(zoo_models()), log_file=out / "compare.log").returncode
        finally:
            runs = [*_read_runs(report), {"seconds": round(time.time() - started, 1), "exit": exit_status,
                                          "models": models or "all", "finished": _now(), "commit": _commit(),
                                          **machine()}]
            write_json_atomic(report.parent / RUNS, runs)
        written = report / "results.json"
        if not written.is_file() or written.stat().st_mtime < started:  # an earlier run's is not this one's
            raise SystemExit(f"benchmark zoo: the compare wrote no report (exit {exit_status}); run the same "
                             f"command again to resume it, or write the report of what finished: "
                             f"UPGRADE_GATE_CONFIG={CONFIG} nox -s report -- --out {report}, then {COMMAND} --report "
                             f"{report}")
    rows = table_rows(Results.load(report))
    text = markdown(rows, _read_runs(report), Results.load(report))
    write_json_atomic(out / "zoo.json", {"rows": [asdict(row) for row in rows], "totals": totals(rows)})
    write_text_atomic(out / "zoo.md", text)
    write_text_atomic(DOCS, replace_section(DOCS.read_text(encoding="utf-8"), text))
    log(text)
    return 0


def zoo_models() -> list[str]:
    import tomllib

    return list(tomllib.loads(CONFIG.read_text(encoding="utf-8"))["tool"]["upgrade-gate"]["models"])


def machine() -> dict[str, Any]:
    memory = next((int(line.split()[1]) * 1024 for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemTotal:")), None) if Path("/proc/meminfo").is_file() else None
    return {"cores": os.cpu_count(), "memory_bytes": memory, "platform": platform.platform()}


def _commit() -> str:
    """The checkout the run used, "-dirty" where it had changes not committed."""
    found = subprocess.run(["git", "-C", str(ZOO), "describe", "--always", "--dirty"], capture_output=True, text=True)
    return found.stdout.strip() or "?"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


def _read_runs(report: Path) -> list[dict[str, Any]]:
    path = report.parent / RUNS
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else []


# -- what the report says, per model ----------------------------------------------------------------------------


def table_rows(results: Results) -> list[Row]:
    return [_row(results, model) for model in results.models]


def _row(results: Results, model: ModelResults) -> Row:
    baseline = results.baseline.name
    candidate = results.candidates[0].name  # the zoo judges one candidate, the built-in one
    gates = results.gates_of(model.name)
    family = model.description.partition(" — ")[0]  # a variant's description names its variant after the dash
    return Row(model=model.base, variant=model.variant, family=family, seconds=_seconds(model),
               baseline=outcome(model.stacks.get(baseline)), candidate=outcome(model.stacks.get(candidate)),
               failures=tuple(failures(results, model, candidate, [g for g in gates if g.stack == candidate])))


def _seconds(model: ModelResults) -> float:
    total = 0.0
    for stack in model.stacks.values():
        total += sum(stage.duration_s for stage in stack.stages)
        if stack.diagnosis is not None:
            total += sum(stage.duration_s for stage in stack.diagnosis.stages)
    return total


def stage_class(stack: StackResults) -> str | None:
    """The class of the first stage that did not succeed: an export stage raised from executorch's code is the
    lowering's (the candidate's export stage runs torch.export, then to_edge_transform_and_lower)."""
    problem = stack.first_problem()
    if problem is None:
        return None
    kind = STAGE_CLASS.get(problem.stage, problem.stage)
    if kind == "export" and problem.error is not None and any(
            "executorch" in line for line in (*problem.error.traceback_tail[-8:], problem.error.message)):
        return "lower"
    return kind


def outcome(stack: StackResults | None) -> str:
    """A stack's stages in a cell: ok, the class of the first that failed and its status, or not run (a run stopped
    before it: its stages unfinished)."""
    problem = stack.first_problem() if stack is not None else None
    if stack is None or not stack.stages or problem is not None and problem.unfinished:
        return NOT_RUN
    if problem is None:
        return "ok"
    return f"✗ {stage_class(stack)} ({problem.status})"


def failures(results: Results, model: ModelResults, stack: str, gates: list[GateResult]) -> list[Failure]:
    """The candidate's failed gates, each once per class: a failed root gate is its first failed stage."""
    found: dict[str, Failure] = {}
    for gate in gates:
        if gate.status is not GateStatus.FAILED:
            continue
        kind = stage_class(model.stacks[stack]) if gate.gate in ROOT_GATES else GATE_CLASS.get(gate.gate)
        if kind is None or kind in found:
            continue
        problem = model.stacks[stack].first_problem()
        said = problem.explain() if gate.gate in ROOT_GATES and problem else gate.measured_text
        found[kind] = way_out(results, model, stack, kind, said.splitlines()[0][:300] if said else "")
    return list(found.values())


def way_out(results: Results, model: ModelResults, stack: str, kind: str, said: str) -> Failure:
    """What the candidate's diagnose phase (and, for a failed export, the localization) found for this failure."""
    own = model.stacks[stack]
    if kind == "latency" and (own.diagnosis is None or own.diagnosis.search != "latency"):
        return latency_entry(model, stack, said, results.settings.gates["latency"].threshold)
    diagnosis = own.diagnosis if own.diagnosis is not None and _answers(own.diagnosis.search, kind) else None
    findings = diagnosis.findings if diagnosis is not None else []
    named = sorted({c.named for f in findings for c in f.culprits})
    localized = own.localized if kind in ("quantize", "export", "lower") else None
    # A localization whose one culprit is the whole model found no smaller part: it says why not, it names nothing.
    whole = localized is not None and [c.module for c in localized.culprits] == ["(root)"]
    if not named and localized is not None and not whole:
        named = sorted({c.operator or f"{c.module} ({c.class_name})" for c in localized.culprits})
    stopped = diagnosis.first_problem() if diagnosis is not None else None
    why = "; ".join(f"{f.method}: {f.status}" + (f" — {f.reason}" if f.reason else "") for f in findings) or (
        stopped.explain() if stopped else "") or (
        f"no submodule fails to {localized.attempt} alone ({localized.attempts} tried): the failure is in how the "
        "model puts them together" if localized is not None else "")
    if named:
        # A keep-float search names the layers left in float, not operators.
        entry = "named layers" if diagnosis is not None and diagnosis.keeps_float else "named"
        found = ", ".join(named)
    else:
        entry, found = ("why not", why) if why else ("none", "")
    runs = [code for f in findings for args, code, _ in f.reproducer_runs if not args]
    if localized is not None and not runs:  # the localization's reproducer (a recipe that raises, a block's lowering)
        runs = [code for args, code, _ in localized.reproducer_runs if not args]
    remedies = [r.passes for r in results.verdict.remedies if (r.model, r.stack) == (model.name, stack)]
    remedies += [bool(f.remedy_passes) for f in findings if f.remedy_passes is not None]
    return Failure(model=model.name, kind=kind, said=said, entry=entry, found=found[:300],
                   reproduces=(1 in runs) if runs else latency_reproduces(model, stack) if kind == "latency" else None,
                   remedy=any(remedies) if remedies else None)


def latency_entry(model: ModelResults, stack: str, said: str, threshold: float) -> Failure:
    """A latency failure: its entry as the report's Way out gives it (report/_way_out_section.py latency_blocks) —
    the portable kernels the profile names where they can account for the slowdown, or why it names none (its
    time is the delegate's, or there is no profile) — and the measure session's reproducer."""
    splits = [s for method in model.stacks[stack].profile if (s := model.slowdown_split(stack, method)) is not None]
    split = max(splits, key=lambda s: s.ratio, default=None)
    if split is not None and split.in_delegate(threshold):
        entry, found = "why not", (f"its time is the delegate's: ×{split.without_portable:.3g} were its portable "
                                   f"kernels free ({', '.join(f'{op.name} {op.share:.0%}' for op in split.delegates)})")
    elif split is not None and split.portable:
        entry, found = "named", ", ".join(f"{op.name} {op.share:.0%}" for op in split.portable[:LATENCY_TOP])
    elif model.stacks[stack].profile:
        entry, found = "why not", "no portable kernel in its profile: its time is the delegate's"
    else:
        entry, found = "why not", f"no per-operator profile of {stack} (profile = false): nothing says where its time goes"
    return Failure(model=model.name, kind="latency", said=said, entry=entry, found=found,
                   reproduces=latency_reproduces(model, stack), remedy=None)


def latency_reproduces(model: ModelResults, stack: str) -> bool | None:
    """Whether the measure session's latency reproducer of the stack answered exit 1 (None: none written)."""
    found = model.latency_reproducer
    return found.exit_code == 1 if found is not None and found.stack == stack and found.script else None


LATENCY_TOP = 5  # as the report names them


def _answers(search: str, kind: str) -> bool:
    """Whether a diagnose phase of this search is the Way out of a failure of this class."""
    if kind == "numerics":
        return search in ("operators", "keep-float", "quantized-lowering")
    if kind in ("export", "lower"):
        return search in ("export", "quantized-lowering")
    if kind in ("load", "run"):  # a program that lowers and fails to load or to run: the load search's (item 1)
        return search == "load"
    return search == kind


# -- the table ---------------------------------------------------------------------------------------------------


def totals(rows: list[Row]) -> dict[str, Any]:
    every = [f for row in rows for f in row.failures]
    return {
        "models": len({row.model for row in rows}),
        "rows": len(rows),
        "candidate_failures": len(every),
        "by_class": {kind: sum(f.kind == kind for f in every) for kind in CLASSES if any(f.kind == kind for f in every)},
        "entry_named": sum(f.entry.startswith("named") for f in every),
        "entry_why_not": sum(f.entry == "why not" for f in every),
        "no_entry": sum(f.entry == "none" for f in every),
        "reproducer_written": sum(f.reproduces is not None for f in every),
        "reproduces": sum(f.reproduces is True for f in every),
        # Issue 63's measure: an entry (the operator named, or why not) and a reproducer that reproduces, both.
        "answered": sum(f.entry != "none" and f.reproduces is True for f in every),
        "remedy_tried": sum(f.remedy is not None for f in every),
        "remedy_passes": sum(f.remedy is True for f in every),
        "finished": sum(NOT_RUN not in (row.baseline, row.candidate) for row in rows),
        "baseline_failed": sum(row.baseline.startswith("✗") for row in rows),
        "candidate_failed_a_stage": sum(row.candidate.startswith("✗") for row in rows),
    }


def _share(part: int, whole: int) -> str:
    return f"{part / whole:.0%}" if whole else "none to answer"


def _yes(value: bool | None) -> str:
    return "—" if value is None else "yes" if value else "no"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(rows: list[Row], runs: list[dict[str, Any]], results: Results) -> str:
    counted = totals(rows)
    wall = sum(run["seconds"] for run in runs)
    last = runs[-1] if runs else {}
    cpu = results.measured_on.cpu if results.measured_on else "?"
    memory = f", {last['memory_bytes'] / 2**30:.0f} GiB" if last.get("memory_bytes") else ""
    by_class = ", ".join(f"{kind} {n}" for kind, n in counted["by_class"].items()) or "none"
    stacks = " → ".join(f"{s.name} ({s.description})" for s in results.stacks.values())
    lines = [
        START, "",
        "## The zoo: real architectures through both stacks", "",
        f"`{COMMAND}` (a subset: `-- zoo --models a,b`; the table of a finished report folder: `-- zoo --report DIR`; "
        "a run stopped part-way resumes from the result cache when run again). Models and versions: "
        "tests/benchmarks/zoo/pyproject.toml; factories (random seeded weights, scikit-image's photos, real "
        "sentences): tests/benchmarks/zoo/zoo_models.py. Not in any suite, not in the tests.", "",
        f"Report of {results.generated_at}"
        + (f" (commit {', '.join(dict.fromkeys(str(r.get('commit', '?')) for r in runs))})" if runs else "")
        + f", {stacks}. Machine: {last.get('cores', '?')} cores{memory}, {cpu}. "
        f"Wall time: **{_duration(wall)}** over {len(runs)} compare run(s)"
        + (f" ({', '.join(_duration(r['seconds']) + ' exit ' + str(r['exit']) for r in runs)})" if runs else "")
        + f"; the models' stage time {_duration(sum(row.seconds for row in rows))} (both stacks, "
        "made or reused; the measure session apart).", "",
        f"**{counted['models']} models, {counted['rows']} rows** (fp32 and the quantized variant), "
        f"{counted['finished']} run through both stacks. Candidate failures: "
        f"**{counted['candidate_failures']}** ({by_class}). Their Way out: **{counted['entry_named']}** named the "
        f"operator (a quantized variant's: the layers to keep in float), **{counted['entry_why_not']}** said why not, "
        f"{counted['no_entry']} had no entry; reproducer "
        f"written for {counted['reproducer_written']}, **{counted['reproduces']}** reproduce; remedy tried for "
        f"{counted['remedy_tried']}, **{counted['remedy_passes']}** pass. **{counted['answered']} of "
        f"{counted['candidate_failures']}** ({_share(counted['answered'], counted['candidate_failures'])}) have "
        "both an entry and a reproducer that reproduces. The baseline failed a stage in "
        f"{counted['baseline_failed']} rows, the candidate in {counted['candidate_failed_a_stage']}.", "",
        "| model | variant | family | legacy | candidate | candidate failures (class: what it said) | Way out "
        "| reproduces | passing remedy | stage time |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        said = "<br>".join(f"**{f.kind}**: {_cell(f.said)}" for f in row.failures) or "—"
        found = "<br>".join(f"{f.entry}" + (f": {_cell(f.found)}" if f.found else "") for f in row.failures) or "—"
        lines.append(f"| {row.model} | {row.variant} | {row.family} | {row.baseline} | {row.candidate} | {said} | "
                     f"{found} | {'<br>'.join(_yes(f.reproduces) for f in row.failures) or '—'} | "
                     f"{'<br>'.join(_yes(f.remedy) for f in row.failures) or '—'} | {row.seconds:.0f} s |")
    return "\n".join([*lines, "", END]) + "\n"


def _duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"


def replace_section(document: str, section: str) -> str:
    """``document`` with its zoo section replaced by ``section`` (appended where it has none)."""
    if START in document and END in document:
        before, _, rest = document.partition(START)
        _, _, after = rest.partition(END)
        return before + section.rstrip("\n") + after
    return document.rstrip("\n") + "\n\n" + section
