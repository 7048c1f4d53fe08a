"""When a stack's diagnose phase runs (compat/diagnose_phase.py): for the methods whose artifact departs
from the same stack's eager model beyond the numerics threshold.

Against its own eager model, not the reference: what the exporter and its backend changed, the part a
different lowering can undo (a drift of eager torch between the stacks is not the artifact's). A quantized
variant departs by design and has gates of its own; it is not searched.
"""

from __future__ import annotations

from typing import Any

from upgrade_gate.config.catalog import ModelEntry
from upgrade_gate.config.plan import Plan
from upgrade_gate.judge.numerics import compare_outputs, worst_rel_l2_by_method
from upgrade_gate.judge.records import DamagedFile, RecordError, load_stack_model


def departed_methods(plan: Plan, stack: str, model: ModelEntry) -> dict[str, float]:
    """Each method whose artifact departs from its own eager outputs beyond the threshold: its worst
    relative L2 error (outputs that do not compare at all fail otherwise, and are not searched)."""
    threshold = plan.settings.gates.for_model(model.name, "max-rel-l2")
    try:
        record = load_stack_model(plan.settings.out_dir, stack, model.name)
        actual, eager = record.outputs("artifact"), record.outputs("eager")
    except (DamagedFile, RecordError):
        return {}  # the report names the damage; nothing here to search
    if actual is None or eager is None:
        return {}
    worst = worst_rel_l2_by_method(compare_outputs(actual, eager, record.read_extents), incomparable=None)
    return {method: value for method, value in worst.items() if value > threshold}


def diagnose_job(plan: Plan, stack: str, model: ModelEntry) -> dict[str, Any] | None:
    """What the diagnose phase's job adds for this model in this stack, or None when it does not run:
    nothing departs, the model is a quantized variant, the numerics gate is off, or so is the
    phase (``diagnose-budget = 0``: the report says so)."""
    settings = plan.settings
    if model.quantized or not settings.diagnose_budget_s or settings.gates["numerics"].severity == "off":
        return None
    methods = departed_methods(plan, stack, model)
    if not methods:
        return None
    saved = load_stack_model(settings.out_dir, stack, model.name).artifact or {}
    return {"threshold": settings.gates.for_model(model.name, "max-rel-l2"), "methods": sorted(methods),
            "budget_s": settings.diagnose_budget_s,
            # The shipped artifact's files, by name (the key holds no report folder's path): the remedy is
            # timed against them, in turns, over the measure session's rounds and budget.
            "artifacts": {m: str(d["file"]) for m, d in (saved.get("methods") or {}).items() if m in methods},
            "rounds": settings.rounds, "time_budget_s": settings.time_budget_s}
