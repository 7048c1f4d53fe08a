"""What a GO hands the team (issue 64): for every model the verdict judged passing, as configured or with a remedy,
``migrate/<model>/`` in the
report folder —

    export.py      the team's own export script: the factory, the weights and inputs every stack was judged with,
                   the candidate's recipe as its adapter writes it, and the remedy the verdict judged passing (its
                   lines at the step they replace); it rebuilds the judged artifact and checks its SHA-256 against
                   verdict.json's — a multi-method program whose remedied methods were judged one by one: those
                   methods' SHA-256 lowered alone, and the program's outputs on the judged inputs
    weights.npz    the weights every stack loaded (a model whose factory draws random ones)
    inputs.npz     the inputs the artifact was exported, run and judged with
    outputs.npz    the outputs the verdict judged, where the program is checked by them
    MIGRATION.md   what changes in the export and in the app (Python, C++, Android, iOS), filled with the artifact's
                   own method metadata; the verdict's conditions; the device check to run

and ``migrate/README.md``: every model, handed over or why not; with ``[tool.upgrade-gate.project]``,
``migrate/project.diff``: the project's calls the move changes, written for the candidate, never applied
(``_project``), and what its tests said with it. Written from the report folder's records and the
result cache's fixtures: nothing runs again (``compare`` writes it after the report; ``migrate`` refreshes it).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from upgrade_gate import layout
from upgrade_gate._atomic import write_text_atomic
from upgrade_gate._confined import remove_tree
from upgrade_gate.config.plan import Plan
from upgrade_gate.config.specs import StackSpec
from upgrade_gate.measure.rounds import artifacts_job
from upgrade_gate.migrate._guide import guide
from upgrade_gate.migrate._project import FILE as PROJECT_DIFF
from upgrade_gate.migrate._project import project_diff
from upgrade_gate.migrate._script import RemedyLines, Written, export_script
from upgrade_gate.schema.project import ProjectResults
from upgrade_gate.schema.results import ModelResults, Results
from upgrade_gate.schema.stack import StackResults
from upgrade_gate.schema.verdict import GateResult, GateStatus, Remedy, Severity

FOLDER = "migrate"

def keeps_it_back(gate: GateResult) -> bool:
    """A failed hard gate (or one a failure blocked): the artifact is not what should ship as configured. A soft
    gate's failure is a condition, on MIGRATION.md's checklist."""
    return gate.status is GateStatus.BLOCKED or (gate.status is GateStatus.FAILED and gate.severity is Severity.HARD)


@dataclass(frozen=True, kw_only=True, slots=True)
class Handover:
    """One model's migration: written to ``folder``, or ``why`` not."""

    model: str
    folder: Path | None
    why: str = ""


def write_project_diff(out: Path, project: ProjectResults, candidate: str) -> Path | None:
    """migrate/project.diff alone, for `compat` (whose report has no models); its path, None (and none left) where
    nothing is rewritten."""
    target = out / FOLDER / PROJECT_DIFF
    diff, _ = project_diff(project, candidate)
    if diff is None:
        target.unlink(missing_ok=True)
        return None
    target.parent.mkdir(exist_ok=True)
    write_text_atomic(target, diff)
    return target


def write_migration(plan: Plan, results: Results, log: Callable[[str], Any] = print) -> Path | None:
    """``migrate/`` of the report folder, written whole (staged, then put in place); its path (None: no candidate)."""
    out = plan.settings.out_dir
    if not plan.candidates:
        return None
    staging = out / f".{FOLDER}.partial"
    if staging.exists():
        remove_tree(staging, within=out)
    staging.mkdir()
    candidate = plan.candidates[0]  # the built-in candidate's, or the first configured
    wanted = {entry.name for entry in plan.models}  # --models: those only
    try:
        handed = [_handover(plan, results, candidate, model, staging) for model in results.models
                  if model.name in wanted]
        diff, said = project_diff(results.project, candidate.name) if results.project else (None, [])
        if diff is not None:
            write_text_atomic(staging / PROJECT_DIFF, diff)
        write_text_atomic(staging / "README.md", _index(results, candidate, handed, said))
    except BaseException:  # a full disk, Ctrl-C: no half folder left behind
        remove_tree(staging, within=out)
        raise
    target = out / FOLDER
    if target.exists():
        remove_tree(target, within=out)
    staging.rename(target)
    done = [h.model for h in handed if h.folder is not None]
    log(f"migrate: {target}: export scripts for {', '.join(done) or 'no model'}"
        + (f"; not handed over: {len(handed) - len(done)} (migrate/README.md says why)" if len(done) < len(handed)
           else ""))
    return target


def _handover(plan: Plan, results: Results, spec: StackSpec, model: ModelResults, staging: Path) -> Handover:
    """The model's folder, or why it gets none."""
    stack = model.stacks.get(spec.name)
    if stack is None:
        return Handover(model=model.name, folder=None, why=f"{spec.name} did not run it")
    failed = [g for g in results.verdict.gates if (g.stack, g.model) == (spec.name, model.name) and keeps_it_back(g)]
    remedy = next((r for r in results.verdict.remedies if (r.stack, r.model) == (spec.name, model.name)
                   and r.passes and not r.provisional), None)
    # The remedy answers the gate it was judged for; the gates a failed export blocked, it measured (its gates).
    if remedy is not None and any(g.gate != remedy.gate and g.status is not GateStatus.BLOCKED for g in failed):
        remedy = None
    problem = stack.first_problem()
    if problem is not None and remedy is None:  # what failed first, not the gates it blocked: nothing was judged
        return Handover(model=model.name, folder=None, why=f"{problem.explain()}; no remedy the verdict judged passes")
    if failed and remedy is None:
        why = ", ".join(f"{g.gate} {g.status.value}" for g in failed)
        return Handover(model=model.name, folder=None, why=f"{why}: its artifact is not what should ship as "
                                                           "configured, and no remedy the verdict judged passes")
    built = stack.details_of("build")
    script = built.get("export_script")
    if not script:
        why = built.get("export_script_error") or f"{spec.name}'s adapter ({spec.adapter}) writes no export script"
        return Handover(model=model.name, folder=None, why=why)
    lines = _remedy_lines(stack, remedy) if remedy is not None else None
    written = _written(results, spec, model, remedy)
    if isinstance(written, str):
        return Handover(model=model.name, folder=None, why=written)
    entry = next(m for m in plan.models if m.name == model.name)
    fixtures = Path(artifacts_job(plan, entry, spec)["fixtures_dir"])
    if not (fixtures / "inputs.npz").is_file():
        # A merged report's shards ran with caches of their own, or the cache was cleared since: the folder an earlier
        # migrate wrote holds the same weights and inputs (copied from the cache), so a refresh loses nothing — for a
        # team's own model: a built-in one's script reads the cache's converted assets too.
        earlier = layout.entry(plan.settings.out_dir / FOLDER, model.name)
        if not (entry.project_root and (earlier / "inputs.npz").is_file()):
            why = f"its weights and inputs are not in this machine's result cache ({fixtures}): run `migrate` there"
            return Handover(model=model.name, folder=None, why=why)
        fixtures = earlier
    folder = layout.entry(staging, model.name)
    folder.mkdir()
    methods = [m for methods, _ in written.files.values() for m in methods]
    if (fixtures / "weights.npz").is_file():
        shutil.copyfile(fixtures / "weights.npz", folder / "weights.npz")
    with np.load(fixtures / "inputs.npz", allow_pickle=False) as arrays:
        np.savez(folder / "inputs.npz", **{key: arrays[key] for key in arrays.files
                                           if key.partition(".")[0] in methods})
    if written.checked_by_outputs:
        np.savez(folder / "outputs.npz", **_judged_outputs(plan.settings.out_dir, stack, remedy, methods))
    installed = results.stacks[spec.name].installed if spec.name in results.stacks else None
    python = installed.executable if installed is not None else None
    signatures = stack.details_of("load").get("signatures") or {}
    write_text_atomic(folder / "export.py", export_script(
        entry=entry, spec=spec, recipe=script, written=written, remedy=lines, python=python,
        weights=(folder / "weights.npz").is_file(), report=plan.settings.out_dir))
    write_text_atomic(folder / "MIGRATION.md", guide(
        results=results, model=model, spec=spec, written=written, remedy=lines, signatures=signatures,
        python=python, report=plan.settings.out_dir))
    return Handover(model=model.name, folder=folder)


def _remedy_lines(stack: StackResults, remedy: Remedy) -> RemedyLines:
    """The remedy's lines per method, as the diagnose phase lowered and judged them."""
    assert stack.diagnosis is not None  # a remedy is its diagnosis's
    findings = {f.method: f for f in stack.diagnosis.findings if f.method in remedy.methods and f.remedy_code}
    replaces = stack.diagnosis.remedy_replaces or "lowering"
    unnamed = "layers kept in float" if replaces == "quantization" else "its lines"  # the precision search names none
    return RemedyLines(what="; ".join(dict.fromkeys(f.remedy_kind or unnamed for f in findings.values())),
                       replaces=replaces, code={method: str(f.remedy_code) for method, f in findings.items()})


def _written(results: Results, spec: StackSpec, model: ModelResults, remedy: Remedy | None) -> Written | str:
    """The files the script writes, each with the SHA-256 it is checked by (or why there is no script)."""
    stack = model.stacks[spec.name]
    remedied = {a.method: a for a in (remedy.artifacts if remedy is not None else ())}
    # A program draft_export made, specializing data-dependent decisions to the example inputs, is not the same
    # bytes in every process: the judged data-dependent-branch was 3,264 bytes after the export options that failed
    # before it, 3,136 made alone (torch._dynamo.reset() between them made it 3,136 in one run, not in another).
    assumed = {f.method for f in (stack.diagnosis.findings if stack.diagnosis is not None else ()) if f.assumed}
    unstable = {method: remedied.pop(method) for method in list(remedied) if method in assumed}
    shipped = {a.file: a.sha256 for a in results.verdict.artifacts if (a.stack, a.model) == (spec.name, model.name)}
    saved = ((stack.artifact or {}).get("methods") or {})
    files: dict[str, list[str]] = {}
    for method, record in saved.items():
        files.setdefault(str(record["file"]), []).append(method)
    if not files:  # the export failed: each remedied method's file, named as the save stage names it
        if remedy is None or len({**remedied, **unstable}) != 1:
            return "its export failed and no single remedied file was judged to rebuild"
        ((method, artifact),) = {**remedied, **unstable}.items()
        files = {f"{method}{Path(artifact.file).suffix}": [method]}
    found: dict[str, tuple[tuple[str, ...], str | None]] = {}
    for file, methods in files.items():
        if len(methods) == 1 and methods[0] in remedied:
            found[file] = (tuple(methods), remedied[methods[0]].sha256)
        elif not set(methods) & {*remedied, *unstable}:
            if file not in shipped:
                return f"{file} was not judged (verdict.json has no SHA-256 of it)"
            found[file] = (tuple(methods), shipped[file])
        else:
            found[file] = (tuple(methods), None)
    why = ("draft_export specialized what the program decides from its data to the example inputs, and the program "
           "it makes (its bytes, even which way it decides) depends on what the process exported before it"
           if unstable else "")
    return Written(files=found, remedied_sha256={m: a.sha256 for m, a in remedied.items()},
                   **({"by_outputs": why} if why else {}))


def _judged_outputs(report: Path, stack: StackResults, remedy: Remedy | None, methods: list[str]) -> dict[str, Any]:
    """The outputs the verdict judged, each method's: its remedied file's (the remedy's outputs), else the shipped
    artifact's, as ``<method>.output_<i>`` in the artifact's order."""
    remedied = set(remedy.methods) if remedy is not None else set()
    sources = {"artifact": report / stack.record_dir / "artifact.npz"}
    if stack.diagnosis is not None and stack.diagnosis.remedy_outputs_file:
        sources["remedy"] = report / stack.diagnosis.remedy_outputs_file
    found: dict[str, Any] = {}
    for method in methods:
        with np.load(sources["remedy" if method in remedied else "artifact"], allow_pickle=False) as data:
            keys = [key for key in data.files if key.startswith(f"{method}.")]
            found.update({f"{method}.output_{index}": data[key] for index, key in enumerate(keys)})
    return found


def _index(results: Results, spec: StackSpec, handed: list[Handover], project: list[str]) -> str:
    lines = [f"# The migration to {spec.name} ({spec.description})", "",
             f"Verdict: **{results.verdict.verdict}** ({results.verdict.generated_at}). Each folder rebuilds the "
             "judged artifact with the team's own export script and says what changes in the app "
             "(`<model>/MIGRATION.md`).", ""]
    lines += [f"- `{h.model}/`" if h.folder is not None else f"- {h.model}: not handed over — {h.why}"
              for h in handed]
    if project:
        lines += ["", "## The project's own code", "", *project]
    return "\n".join(lines) + "\n"
