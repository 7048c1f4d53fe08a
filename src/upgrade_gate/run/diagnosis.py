"""When a stack's diagnose phase runs (compat/diagnose/): for the methods whose artifact departs from the same
stack's eager model beyond the numerics threshold — against its own eager model, not the reference: what the
exporter and its backend changed is the part a different lowering can undo; for a candidate's float model whose
export failed; for a candidate's artifact that lowered and failed when the runtime loaded or ran it; for a
candidate's quantized variant below its quantized-numerics gate against the same stack's float model; and for an
exact float model whose profile has a portable batch norm taking PORTABLE_SHARE of a method's time.
"""

from __future__ import annotations

import math
from typing import Any

from upgrade_gate.config.catalog import ModelEntry
from upgrade_gate.config.plan import Plan
from upgrade_gate.judge.attribution import attributions, lowering_floor
from upgrade_gate.judge.numerics import compare_outputs, method_of, worst_rel_l2_by_method
from upgrade_gate.schema.comparison import Attribution, OutputMetrics
from upgrade_gate.schema.records import DamagedFile, RecordError, load_stack_model
from upgrade_gate.schema.stack import PORTABLE_SHARE, operator_profile


def compared(plan: Plan, stack: str, model: ModelEntry, *pairs: tuple[str, str]) -> list[list[OutputMetrics]] | None:
    """Each pair of the stack's outputs (``("artifact", "eager")``: kinds of StackModelRecord.outputs) compared
    where a later call reads them; None where a file does not read (the report names the damage: nothing here to
    search) or a stage did not write its outputs."""
    try:
        record = load_stack_model(plan.settings.out_dir, stack, model.name)
        read = {kind: record.outputs(kind) for pair in pairs for kind in pair}
    except (DamagedFile, RecordError):
        return None
    outputs = {kind: found for kind, found in read.items() if found is not None}
    if len(outputs) < len(read):
        return None
    return [compare_outputs(outputs[actual], outputs[reference], record.read_extents) for actual, reference in pairs]


def departed_methods(plan: Plan, stack: str, model: ModelEntry) -> dict[str, float]:
    """Each method whose artifact departs from its own eager outputs beyond the threshold: its worst
    relative L2 error (outputs that do not compare at all fail otherwise, and are not searched)."""
    threshold = plan.settings.gates.for_model(model.name, "max-rel-l2")
    found = compared(plan, stack, model, ("artifact", "eager"))
    if found is None:
        return {}
    worst = worst_rel_l2_by_method(found[0], incomparable=None)
    return {method: value for method, value in worst.items() if value > threshold}


def below_gate_methods(plan: Plan, stack: str, model: ModelEntry) -> dict[str, float]:
    """Each method of a quantized variant whose artifact is below the quantized-numerics gate's SNR or
    cosine against the float model (the variant's eager outputs are the float model's): its worst SNR."""
    gates = plan.settings.gates
    min_snr, min_cosine = gates.for_model(model.name, "min-snr-db"), gates.for_model(model.name, "min-cosine")
    found = compared(plan, stack, model, ("artifact", "eager"))
    if found is None:
        return {}
    below: dict[str, float] = {}
    for output in found[0]:
        if output.snr_db is None or output.cosine is None:
            continue  # does not compare: the gate says so
        if output.snr_db < min_snr or output.cosine < min_cosine:
            method = method_of(output.name)
            below[method] = min(below.get(method, math.inf), output.snr_db)
    return below


def quantization_thresholds(plan: Plan, stack: str, model: ModelEntry) -> dict[str, float]:
    """What each method's lowering may depart from its quantized model run eagerly (judge/attribution.py), from
    the quantization's own departure alone: for a variant whose artifact was never made."""
    found = compared(plan, stack, model, ("quantized", "eager"))
    if found is None:
        return {}
    floor = lowering_floor(plan, model.base)
    quantization = worst_rel_l2_by_method(found[0], incomparable=None)
    return {method: Attribution(method=method, quantization_rel_l2=value, lowering_rel_l2=math.nan,
                                floor=floor).threshold for method, value in quantization.items()}


def lowering_departures(plan: Plan, stack: str, model: ModelEntry) -> dict[str, Attribution]:
    """Each method of a quantized variant, its quantization and its lowering weighed (judge/attribution.py);
    none where the quantized model did not run eagerly or a file does not read."""
    found = compared(plan, stack, model, ("quantized", "eager"), ("artifact", "quantized"))
    if found is None:
        return {}
    quantization, lowering = found
    weighed = attributions(quantization, lowering, floor=lowering_floor(plan, model.base), stack=stack)
    return {method: a for method, a in weighed.items() if a.lowering_departs}


def failed_stage_methods(plan: Plan, stack: str, model: ModelEntry, stage: str = "export") -> list[str]:
    """Every method of a model whose ``stage`` (the export, or a variant's quantize) failed — the exporter or the
    recipe raised: not a crash, not a timeout, which another option would not answer: the remedy must export them
    all, as the artifact would have."""
    try:
        record = load_stack_model(plan.settings.out_dir, stack, model.name)
    except (DamagedFile, RecordError):
        return []
    failed, build = record.stage(stage), record.stage("build")
    if failed is None or failed.status != "failed" or build is None or not build.ok:
        return []
    return [str(m) for m in build.details.get("methods") or ()]


def failed_at_runtime(plan: Plan, stack: str, model: ModelEntry) -> tuple[str, list[str]]:
    """Where the artifact lowered and then failed when the runtime loaded or ran it (the stage raised: not a crash,
    not a timeout): that stage, and every method of the artifact (the remedy must lower them all); else nothing."""
    try:
        record = load_stack_model(plan.settings.out_dir, stack, model.name)
    except (DamagedFile, RecordError):
        return "", []
    failed = next((stage for stage in RUNTIME_STAGES if (found := record.stage(stage)) is not None
                   and found.status == "failed"), "")
    methods = ((record.artifact or {}).get("methods") or {}) if failed else {}
    return failed, sorted(str(m) for m in methods)


RUNTIME_STAGES = ("load", "run")  # the runtime phase's stages a lowered program can fail at (compat/runtime_phase.py)


def portable_heavy_methods(plan: Plan, stack: str, model: ModelEntry) -> dict[str, float]:
    """Each float method whose per-operator profile (the runtime phase's profile stage) has at least
    PORTABLE_SHARE of its time in a portable batch norm kernel: its share in portable kernels."""
    if model.quantized:
        return {}
    try:
        profiled = load_stack_model(plan.settings.out_dir, stack, model.name).stage("profile")
    except (DamagedFile, RecordError):
        return {}
    profile = operator_profile(profiled.details) if profiled is not None and profiled.ok else {}
    heavy = {}
    for method, operators in profile.items():
        portable = [op for op in operators if op.portable]
        if sum(op.share for op in portable if "batch_norm" in op.name) >= PORTABLE_SHARE:
            heavy[method] = round(sum(op.share for op in portable), 4)
    return heavy


def diagnose_job(plan: Plan, stack: str, model: ModelEntry) -> dict[str, Any] | None:
    """What the diagnose phase's job adds for this model in this stack, or None when it does not run (a quantized
    variant of the baseline's: its gates judge candidates only)."""
    settings = plan.settings
    if not settings.diagnose_budget_s:
        return None
    if model.quantized:
        if stack == plan.baseline.name or settings.gates["quantized"].severity == "off":
            return None
        methods, searched = _quantized_search(plan, stack, model)
    elif failed := failed_stage_methods(plan, stack, model):
        if stack == plan.baseline.name or settings.gates["export"].severity == "off":
            return None  # the baseline's export failures are what ships today, not gated
        methods = {method: math.nan for method in failed}
        searched = {"search": "export", "threshold": settings.gates.for_model(model.name, "max-rel-l2")}
    elif (runtime := failed_at_runtime(plan, stack, model))[0]:
        if stack == plan.baseline.name or settings.gates["export"].severity == "off":
            return None  # what ships today, not gated
        methods = {method: math.nan for method in runtime[1]}
        searched = {"search": "load", "failed_at": runtime[0],
                    "threshold": settings.gates.for_model(model.name, "max-rel-l2")}
    else:
        if settings.gates["numerics"].severity == "off":
            return None
        methods = departed_methods(plan, stack, model)
        searched = {"threshold": settings.gates.for_model(model.name, "max-rel-l2")}
        if not methods and stack != plan.baseline.name and settings.gates["latency"].severity != "off":
            # Exact, but its profile's time goes to portable kernels: the batch norms to fold before export.
            methods = portable_heavy_methods(plan, stack, model)
            searched = {**searched, "search": "latency", "portable_share": methods}
    if not methods:
        return None
    saved = load_stack_model(settings.out_dir, stack, model.name).artifact or {}
    return {**searched, "methods": sorted(methods),
            "budget_s": settings.diagnose_budget_s,
            # The shipped artifact's files, by name (the key holds no report folder's path): the remedy is
            # timed against them, in turns, over the measure session's rounds and budget; a generator's loop
            # runs the methods not remedied from them.
            "artifacts": {m: str(d["file"]) for m, d in (saved.get("methods") or {}).items()},
            "rounds": settings.rounds, "time_budget_s": settings.time_budget_s,
            # A remedy that passes, not clearly slower than the latency gate's ratio, ends the tries: the options
            # after it keep more out of the delegate (compat/diagnose/remedy_choice.py).
            "max_slowdown": (settings.gates["latency"].threshold if settings.gates["latency"].severity != "off"
                             else None)}


def _quantized_search(plan: Plan, stack: str, model: ModelEntry) -> tuple[dict[str, float], dict[str, Any]]:
    """A candidate's quantized variant: the methods to search and what its search is — the capture to quantize from
    where the recipe raised, the node behind a program that lowers and does not load, the operators behind one that
    does not lower or whose lowering departs, or the layers to keep in float."""
    gates = {"min_snr_db": plan.settings.gates.for_model(model.name, "min-snr-db"),
             "min_cosine": plan.settings.gates.for_model(model.name, "min-cosine")}
    if raised := failed_stage_methods(plan, stack, model, "quantize"):
        # The recipe raised: the capture's other options, judged by the quantized gates.
        return {method: math.nan for method in raised}, {"search": "quantize", "variant": model.variant, **gates}
    failed_at, loaded = failed_at_runtime(plan, stack, model)
    if failed_at and (thresholds := quantization_thresholds(plan, stack, model)):
        # It lowers and does not load: the node the runtime's words name, on the quantized program.
        methods = {method: math.nan for method in loaded if method in thresholds}
        return methods, {"search": "load", "failed_at": failed_at, "variant": model.variant, **gates,
                         "thresholds": {m: thresholds[m] for m in methods}}
    if failed := failed_stage_methods(plan, stack, model):
        # It does not lower at all: the operators behind the lowering's error, on the quantized program.
        thresholds = quantization_thresholds(plan, stack, model)
        methods = {method: math.nan for method in failed if method in thresholds}
        return methods, {"search": "quantized-lowering", "variant": model.variant, **gates,
                         "thresholds": {m: thresholds[m] for m in methods}}
    if lowered := lowering_departures(plan, stack, model):
        # It lowers, and the lowering is at fault: its operators (the layers' search answers the quantization).
        below = below_gate_methods(plan, stack, model)
        methods = {m: a.lowering_rel_l2 for m, a in lowered.items() if m in below}
        return methods, {"search": "quantized-lowering", "variant": model.variant, **gates,
                         "thresholds": {m: lowered[m].search_threshold for m in methods},
                         "output_thresholds": {m: dict(lowered[m].allowances) for m in methods}}
    return below_gate_methods(plan, stack, model), {"search": "keep-float", "variant": model.variant, **gates}
