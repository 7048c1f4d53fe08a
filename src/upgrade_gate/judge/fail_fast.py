"""``--fail-fast`` (docs/ci.md): a candidate's run stops at the first failed hard gate (run/runner.py), judged
mid-run as the report will judge it; latency and memory wait for the measure session, which a stopped run skips,
so they never stop it. Every gate not reached is then incomplete, said once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from upgrade_gate import layout
from upgrade_gate.config.catalog import ModelEntry
from upgrade_gate.config.plan import Plan
from upgrade_gate.config.specs import StackSpec
from upgrade_gate.judge._model_gates import model_gates
from upgrade_gate.judge.gather import gather_model
from upgrade_gate.schema.verdict import NOT_REACHED, GateStatus, Severity


def first_hard_failure(plan: Plan, spec: StackSpec, model: ModelEntry) -> dict[str, Any] | None:
    """The model's first failed hard gate in the candidate ``spec``, as ``stopped.json`` keeps it; else None."""
    for gate in model_gates(plan, spec, gather_model(plan, model)):
        if gate.severity is Severity.HARD and gate.status is GateStatus.FAILED:
            # The note says what it measured against what it allows: "rel_l2 = 1.00e-02 (rel_l2 ≤ 1.00e-04)".
            return {"model": gate.model, "gate": gate.gate, "stack": gate.stack,
                    "note": f"{gate.measured_text} ({gate.threshold_text})" if gate.threshold_text
                    else gate.measured_text}
    return None


def stopped_at(out: Path, stack: str) -> dict[str, Any] | None:
    """Where a candidate's ``--fail-fast`` run stopped, or None (it ran whole, or without the option)."""
    try:
        data = json.loads(layout.stopped_file(out, stack).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def not_reached_note(stop: dict[str, Any]) -> str:
    return f"{NOT_REACHED} stopped {stop.get('stack')}'s run at {stop.get('model')}'s failed {stop.get('gate')} gate"
