"""Which of a model's outputs are compared with which, and the comparisons made: the shipped artifacts', the
remedied candidate's, and a quantized variant's two departures weighed one against the other."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np

from upgrade_gate._atomic import sha256_file
from upgrade_gate.config.catalog import ModelEntry
from upgrade_gate.config.plan import Plan
from upgrade_gate.invocation import command
from upgrade_gate.judge import agreement
from upgrade_gate.judge.attribution import attributions, lowering_floor
from upgrade_gate.judge.numerics import compare_outputs, method_of, worst_rel_l2_by_method
from upgrade_gate.schema.comparison import Attribution, Comparison, Side, TaskAgreement
from upgrade_gate.schema.diagnosis import Diagnosis
from upgrade_gate.schema.measured import remedied
from upgrade_gate.schema.records import (
    DamagedFile,
    StackModelRecord,
    TaskResult,
    read_arrays,
    read_task_result,
    released,
)

# A quantized variant's two departures, apart (judge/attribution.py weighs one against the other).
QUANTIZATION, QUANTIZED_LOWERING = "candidate quantization (eager)", "candidate lowering of the quantized model"


def reference_side(plan: Plan) -> Side:
    """What every artifact is judged against: the baseline's eager outputs, what the team validates today."""
    return Side(stack=plan.baseline.name, kind="eager")


def comparison_pairs(plan: Plan, model: ModelEntry) -> list[tuple[str, Side, Side]]:
    """Which outputs are compared with which, and why. A candidate's quantized variant also apart: its quantization
    run eagerly against the float model, and its artifact against that (what the lowering alone changed)."""
    base = plan.baseline.name
    pairs = [("baseline export fidelity", Side(stack=base, kind="artifact"), Side(stack=base, kind="eager"))]
    for spec in plan.candidates:
        cand = spec.name
        pairs += [
            ("torch upgrade drift (eager)", Side(stack=cand, kind="eager"), Side(stack=base, kind="eager")),
            ("candidate export fidelity", Side(stack=cand, kind="artifact"), Side(stack=cand, kind="eager")),
            ("artifact vs artifact", Side(stack=cand, kind="artifact"), Side(stack=base, kind="artifact")),
            ("candidate artifact vs reference", Side(stack=cand, kind="artifact"), reference_side(plan)),
        ]
        if model.quantized:
            pairs += [
                (QUANTIZATION, Side(stack=cand, kind="quantized"), Side(stack=cand, kind="eager")),
                (QUANTIZED_LOWERING, Side(stack=cand, kind="artifact"), Side(stack=cand, kind="quantized")),
            ]
    return pairs


def compare_sides(plan: Plan, model: ModelEntry, records: dict[str, StackModelRecord], kind: str,
                  extents: dict[str, tuple[int, int]]) -> list[Comparison]:
    """Each pair of ``comparison_pairs``: its outputs and its task compared, or what is missing or damaged."""
    out = plan.settings.out_dir
    comparisons = []
    for purpose, actual, reference in comparison_pairs(plan, model):
        try:
            actual_out = records[actual.stack].outputs(actual.kind)
            reference_out = records[reference.stack].outputs(reference.kind)
        except DamagedFile as damage:
            comparisons.append(Comparison(purpose=purpose, actual=actual, reference=reference, outputs=None,
                                          missing=damage_note(out, damage), damaged=damage_note(out, damage)))
            continue
        if actual_out is None or reference_out is None:
            absent = tuple(side for side, data in ((actual, actual_out), (reference, reference_out)) if data is None)
            comparisons.append(Comparison(purpose=purpose, actual=actual, reference=reference, outputs=None,
                                          missing=f"no outputs from {' and '.join(map(str, absent))}", absent=absent))
            continue
        try:
            task, task_missing = _task_agreement(kind, actual, reference, actual_out, reference_out,
                                                 lambda side: records[side.stack].task_result(side.kind))
            damaged = None
        except DamagedFile as damage:
            task, task_missing = None, damage_note(out, damage)
            damaged = task_missing
        comparisons.append(Comparison(purpose=purpose, actual=actual, reference=reference, task=task,
                                      outputs=tuple(compare_outputs(actual_out, reference_out, extents)),
                                      task_missing=task_missing, damaged=damaged))
    return comparisons


def attributions_of(plan: Plan, model: ModelEntry, comparisons: list[Comparison]) -> tuple[Attribution, ...]:
    """Each candidate's quantized variant, per method: its lowering weighed against its quantization, as the
    diagnose phase chose its search (the same rule, the same floor), kept for the report to say."""
    if not model.quantized:
        return ()
    outputs = {(c.actual, c.reference): list(c.outputs) for c in comparisons if c.outputs}
    found: list[Attribution] = []
    for spec in plan.candidates:
        eager, quantized, artifact = (Side(stack=spec.name, kind=kind) for kind in ("eager", "quantized", "artifact"))
        quantization, lowering = outputs.get((quantized, eager)), outputs.get((artifact, quantized))
        if quantization is not None and lowering is not None:
            found += attributions(quantization, lowering, floor=lowering_floor(plan, model.base),
                                  stack=spec.name).values()
    return tuple(found)


REMEDIED = "candidate with its remedy vs reference"


def remedy_compared(diagnosis: Diagnosis, out: Path, kind: str, stack: str, records: dict[str, StackModelRecord],
                     reference: Side, extents: dict[str, tuple[int, int]]) -> Diagnosis:
    """The candidate as the team would ship it remedied — the remedied methods' outputs (the diagnose phase's
    remedy.npz), the others' as shipped, a generator's loop run with the remedy (its ``task`` stage) — against
    the reference, as the shipped artifact's comparison is made: the comparison the remedy's gates judge
    (judge/_remedies.py), and each remedied method's worst relative L2 and cosine for its rows."""
    remedied_file = diagnosis.remedy_outputs_file
    if remedied_file is None or not (out / remedied_file).is_file():
        return diagnosis
    actual = Side(stack=remedied(stack), kind="artifact")
    try:
        remedy_out = read_arrays(out / remedied_file)
        shipped, expected = records[stack].outputs("artifact") or {}, records[reference.stack].outputs(reference.kind)
    except DamagedFile as damage:
        return replace(diagnosis, remedy_comparison=Comparison(
            purpose=REMEDIED, actual=actual, reference=reference, outputs=None, missing=damage_note(out, damage),
            damaged=damage_note(out, damage)))
    if expected is None:
        return replace(diagnosis, remedy_comparison=Comparison(
            purpose=REMEDIED, actual=actual, reference=reference, outputs=None, absent=(reference,),
            missing=f"no outputs from {reference}"))
    methods = {method_of(name) for name in remedy_out}
    outputs = {**{name: array for name, array in shipped.items() if method_of(name) not in methods}, **remedy_out}
    task_stage = diagnosis.stage("task")
    task_file = out / diagnosis.record_dir / str((task_stage.details if task_stage else {}).get("file", ""))
    try:
        task, task_missing = _task_agreement(
            kind, actual, reference, outputs, expected,
            lambda side: read_task_result(task_stage, task_file) if side == actual
            else records[side.stack].task_result(side.kind))
        damaged = None
    except DamagedFile as damage:
        task, task_missing = None, damage_note(out, damage)
        damaged = task_missing
    if kind == "generation" and (task_stage is None or not task_stage.ok):
        task_missing = ("the remedy's loop did not run ("
                        f"{task_stage.explain() if task_stage else 'the diagnose phase recorded none'})")
    compared = compare_outputs(outputs, expected, extents)
    own = [output for output in compared if method_of(output.name) in methods]
    cosine: dict[str, float] = {}
    for output in own:  # a kept-float remedy is judged by the quantized gate's cosine too
        method = method_of(output.name)
        cosine[method] = min(cosine.get(method, 1.0), output.cosine if output.cosine is not None else -1.0)
    return replace(diagnosis, remedy_against=str(reference),
                   remedy_rel_l2=worst_rel_l2_by_method(own, incomparable=math.inf), remedy_cosine=cosine,
                   remedy_comparison=Comparison(purpose=REMEDIED, actual=actual, reference=reference,
                                                outputs=tuple(compared), task=task, task_missing=task_missing,
                                                damaged=damaged))


def damaged_artifacts(record: StackModelRecord) -> list[DamagedFile]:
    """The artifacts whose file is not the one the save stage recorded (size and SHA-256)."""
    found = []
    left_in_cache = released(record.directory)
    for method in record.saved_files.values():
        path = record.directory / str(method.get("file"))
        if path.name in left_in_cache and not path.is_file():
            continue  # in the result cache by digest (run/artifacts.py), as the key record says
        if not path.is_file():
            found.append(DamagedFile(path, "missing"))
        elif path.stat().st_size != method.get("bytes"):
            found.append(DamagedFile(path, f"{path.stat().st_size} bytes, the export wrote {method.get('bytes')}"))
        elif method.get("sha256") and sha256_file(path) != method["sha256"]:
            found.append(DamagedFile(path, "its SHA-256 is not the one the export recorded"))
    return found


def damage_note(out: Path, damage: DamagedFile) -> str:
    """What is damaged, and how to make it again: the cache holds the finished phase, or the phase runs again."""
    where = damage.path.relative_to(out) if damage.path.is_relative_to(out) else damage.path
    return (f"{where} is damaged ({damage.why}); run `{command('compare', f'--out {out}')}` again (the result cache "
            "copies the phase back, or the phase runs again)")


def _task_agreement(
    kind: str, actual: Side, reference: Side, actual_out: dict[str, np.ndarray], reference_out: dict[str, np.ndarray],
    task_of: Callable[[Side], TaskResult | None],
) -> tuple[TaskAgreement | None, str | None]:
    """The task metric for one comparison; the first output carries logits or embeddings, a generator's loop
    (``task_of`` each side) its tokens and logits."""
    if kind in ("classification", "embedding"):
        first = sorted(reference_out)[0]
        a, r = actual_out.get(first), reference_out.get(first)
        if a is None or r is None or a.shape != r.shape or not (np.isfinite(a).all() and np.isfinite(r).all()):
            return None, f"{first}: missing, shape mismatch or NaN/Inf"
        return (agreement.classification(a, r) if kind == "classification" else agreement.embedding(a, r)), None
    if kind == "generation":
        if "quantized" in (actual.kind, reference.kind):
            return None, "the quantized model is run on the method's inputs, not through a generation loop"
        a_task, r_task = task_of(actual), task_of(reference)
        if a_task is None or r_task is None:
            absent = [str(side) for side, t in ((actual, a_task), (reference, r_task)) if t is None]
            return None, f"no generation from {' and '.join(absent)}"
        if a_task.step_logits.shape != r_task.step_logits.shape:
            return None, f"step logits shape {a_task.step_logits.shape} vs {r_task.step_logits.shape}"
        return agreement.generation(a_task.tokens, r_task.tokens, a_task.step_logits, r_task.step_logits), None
    return None, None
