"""Whether a quantized variant's lowering, not its quantization, departs: per output, the artifact against the
same stack's quantized model run eagerly, weighed against that quantized model against the float model (the rule
and why it is per output: docs/report.md, "Quantized variants: the lowering or the quantization"). Measures only
the comparisons judge/_comparisons.py made; thresholds come from the caller.
"""

from __future__ import annotations

import math
from dataclasses import replace

from upgrade_gate.config.plan import Plan
from upgrade_gate.judge.numerics import method_of
from upgrade_gate.schema.comparison import Attribution, OutputMetrics


def lowering_floor(plan: Plan, base: str) -> float:
    """What any lowering may add, whatever the quantization's error: the float model's numerics threshold (the one
    floor the diagnose phase's choice and the stored attribution share)."""
    return plan.settings.gates.for_model(base, "max-rel-l2")


def attributions(quantization: list[OutputMetrics], lowering: list[OutputMetrics],
                 floor: float, stack: str = "") -> dict[str, Attribution]:
    """Per method found in both comparisons, the output that departs most for what it may (an output that does
    not compare counts as infinitely far), its threshold the method's most lenient: what the search on the
    method may leave of the lowering's error."""
    quantized = {o.name: _rel_l2(o) for o in quantization}
    found: dict[str, Attribution] = {}
    allowed: dict[str, dict[str, float]] = {}
    for output in lowering:
        if output.name not in quantized:
            continue
        one = Attribution(stack=stack, method=method_of(output.name), output=output.name,
                          quantization_rel_l2=quantized[output.name], lowering_rel_l2=_rel_l2(output), floor=floor)
        allowed.setdefault(one.method, {})[output.name.partition(".")[2]] = one.threshold
        kept = found.get(one.method)
        if kept is None or _over(one) > _over(kept):
            found[one.method] = one
    return {method: replace(one, method_threshold=max(allowed[method].values()), allowances=allowed[method])
            for method, one in found.items()}


def _rel_l2(output: OutputMetrics) -> float:
    return output.rel_l2 if output.comparable and output.rel_l2 is not None else math.inf


def _over(one: Attribution) -> float:
    """How far past its threshold an output's lowering is (NaN counts as furthest)."""
    ratio = one.lowering_rel_l2 / one.threshold if one.threshold else math.inf
    return math.inf if math.isnan(ratio) else ratio
