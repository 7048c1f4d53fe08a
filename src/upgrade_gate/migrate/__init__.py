"""What a GO hands the team (issue 64): for every model the verdict judged passing, ``migrate/<model>/`` in the
report folder —

    export.py      the team's own export script: the factory, the weights and inputs every stack was judged with,
                   the candidate's recipe as its adapter writes it; it rebuilds the judged artifact and checks its
                   SHA-256 against verdict.json's
    weights.npz    the weights every stack loaded (a model whose factory draws random ones)
    inputs.npz     the inputs the artifact was exported, run and judged with
    MIGRATION.md   what changes in the export and in the app (Python, C++, Android, iOS), filled with the artifact's
                   own method metadata; the verdict's conditions; the device check to run

and ``migrate/README.md``: every model, handed over or why not. Written from the report folder's records and the
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
from upgrade_gate.migrate._script import export_script
from upgrade_gate.schema.results import ModelResults, Results
from upgrade_gate.schema.verdict import GateResult, GateStatus, Severity

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
        write_text_atomic(staging / "README.md", _index(results, candidate, handed))
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
    failed = [g for g in results.verdict.gates
              if (g.stack, g.model) == (spec.name, model.name) and keeps_it_back(g)]
    if stack is None or failed:
        why = ", ".join(f"{g.gate} {g.status.value}" for g in failed) or f"{spec.name} did not run it"
        return Handover(model=model.name, folder=None, why=f"{why}: its artifact is not what should ship as "
                                                           "configured (a passing remedy's script: not yet written)")
    export = stack.stage("export")
    script = (export.details if export is not None and export.ok else {}).get("export_script")
    judged = [a for a in results.verdict.artifacts if (a.stack, a.model) == (spec.name, model.name)]
    saved = (stack.artifact or {}).get("methods") or {}
    if not script:
        why = (export.details.get("export_script_error") if export is not None and export.ok else None) or (
            f"{spec.name}'s adapter ({spec.adapter}) writes no export script")
        return Handover(model=model.name, folder=None, why=why)
    if len(saved) != 1 or len(judged) != 1:
        return Handover(model=model.name, folder=None, why=f"{len(saved)} methods in {len(judged)} artifact(s): "
                                                            "a script per method, or for a multi-method program, "
                                                            "is not yet written")
    entry = next(m for m in plan.models if m.name == model.name)
    fixtures = Path(artifacts_job(plan, entry, spec)["fixtures_dir"])
    if not (fixtures / "inputs.npz").is_file():  # a merged report's shards ran with caches of their own
        why = f"its weights and inputs are not in this machine's result cache ({fixtures}): run `migrate` there"
        return Handover(model=model.name, folder=None, why=why)
    folder = layout.entry(staging, model.name)
    folder.mkdir()
    (method,) = saved
    if (fixtures / "weights.npz").is_file():
        shutil.copyfile(fixtures / "weights.npz", folder / "weights.npz")
    with np.load(fixtures / "inputs.npz", allow_pickle=False) as arrays:
        np.savez(folder / "inputs.npz", **{key: arrays[key] for key in arrays.files if key.startswith(f"{method}.")})
    installed = results.stacks[spec.name].installed if spec.name in results.stacks else None
    python = installed.executable if installed is not None else None
    loaded = stack.stage("load")
    signature = ((loaded.details if loaded is not None and loaded.ok else {}).get("signatures") or {}).get(method)
    (artifact,) = judged
    write_text_atomic(folder / "export.py", export_script(
        entry=entry, spec=spec, method=method, recipe=script, artifact=artifact, python=python,
        weights=(folder / "weights.npz").is_file(), report=plan.settings.out_dir))
    write_text_atomic(folder / "MIGRATION.md", guide(
        results=results, model=model, spec=spec, method=method, artifact=artifact, signature=signature,
        python=python, report=plan.settings.out_dir))
    return Handover(model=model.name, folder=folder)


def _index(results: Results, spec: StackSpec, handed: list[Handover]) -> str:
    lines = [f"# The migration to {spec.name} ({spec.description})", "",
             f"Verdict: **{results.verdict.verdict}** ({results.verdict.generated_at}). Each folder rebuilds the "
             "judged artifact with the team's own export script and says what changes in the app "
             "(`<model>/MIGRATION.md`).", ""]
    lines += [f"- `{h.model}/`" if h.folder is not None else f"- {h.model}: not handed over — {h.why}"
              for h in handed]
    return "\n".join(lines) + "\n"
