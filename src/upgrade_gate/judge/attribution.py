"""Whether a quantized variant's lowering, not its quantization, departs: each output of a method's artifact
against the same stack's quantized model run eagerly, weighed against that quantized model against the float
model (docs/report.md, "Quantized variants: the lowering or the quantization").

The lowering departs where, for some output, the artifact is further from its own eager quantized model than
``LOWERING_FACTOR`` times that output's quantization error — its SNR more than 20·log10(LOWERING_FACTOR) ≈ 6 dB
below the quantization's — and further than the float numerics gate's threshold (an output the recipe leaves
untouched is held to the float model's rule). Per output: one output the recipe quantizes badly (an LLM's value
cache at 6 dB) must not hide another the lowering zeroes. A backend's quantized kernels round otherwise than the
eager reference (XNNPACK quantizes a dynamic input per row, PT2E per tensor), which adds noise of the
quantization's own order; a lowering that departs by more changed what the program computes. Measures only the
comparisons judge/gather.py made; thresholds come from the caller.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from upgrade_gate.judge.numerics import method_of
from upgrade_gate.schema.comparison import OutputMetrics

LOWERING_FACTOR = 2.0  # the lowering may add up to this times the quantization's own error (6 dB)


@dataclass(frozen=True, kw_only=True, slots=True)
class Attribution:
    """One output of a quantized variant's method: what its quantization and its lowering each depart by."""

    method: str
    output: str = ""
    quantization_rel_l2: float  # the quantized model run eagerly, against the float model
    lowering_rel_l2: float  # the artifact, against the quantized model run eagerly
    floor: float  # the float numerics gate's max-rel-l2: what any lowering may add
    method_threshold: float = 0.0  # the largest any output of the method allows (attributions)
    # What each output of the method may depart by, by its name after the method's (``output_1``): the search
    # holds each to its own, so that one output's lenient allowance does not pass another that departs.
    allowances: tuple[tuple[str, float], ...] = ()

    @property
    def threshold(self) -> float:
        """What the lowering may depart by: the quantization's own error times the factor, or the float floor."""
        return max(LOWERING_FACTOR * self.quantization_rel_l2, self.floor)

    @property
    def search_threshold(self) -> float:
        """The most any output of the method allows: the scale the search's figures are said in, each output's
        error weighed by it over the output's own allowance (``allowances``; compat/diagnose_phase.py)."""
        return max(self.method_threshold, self.threshold)

    @property
    def lowering_departs(self) -> bool:
        return not self.lowering_rel_l2 <= self.threshold  # NaN departs: it never passes silently

    @staticmethod
    def snr_db(rel_l2: float) -> float:
        return -20 * math.log10(rel_l2) + 0.0 if rel_l2 > 0 else math.inf  # + 0.0: never "-0.0 dB"

    def said(self) -> str:
        """The rule's figures, as the report and the job say them."""
        where = f"{self.output} " if self.output else ""
        return (f"the artifact's {where}is at SNR {self.snr_db(self.lowering_rel_l2):.1f} dB against its own quantized "
                f"model run eagerly, whose quantization is at SNR {self.snr_db(self.quantization_rel_l2):.1f} dB "
                "against the float model")


def attributions(quantization: list[OutputMetrics], lowering: list[OutputMetrics],
                 floor: float) -> dict[str, Attribution]:
    """Per method found in both comparisons, the output that departs most for what it may (an output that does
    not compare counts as infinitely far), its threshold the method's most lenient: what the search on the
    method may leave of the lowering's error."""
    quantized = {o.name: _rel_l2(o) for o in quantization}
    found: dict[str, Attribution] = {}
    allowed: dict[str, dict[str, float]] = {}
    for output in lowering:
        if output.name not in quantized:
            continue
        one = Attribution(method=method_of(output.name), output=output.name, quantization_rel_l2=quantized[output.name],
                          lowering_rel_l2=_rel_l2(output), floor=floor)
        allowed.setdefault(one.method, {})[output.name.partition(".")[2]] = one.threshold
        kept = found.get(one.method)
        if kept is None or _over(one) > _over(kept):
            found[one.method] = one
    return {method: replace(one, method_threshold=max(allowed[method].values()),
                            allowances=tuple(allowed[method].items())) for method, one in found.items()}


def _rel_l2(output: OutputMetrics) -> float:
    return output.rel_l2 if output.comparable and output.rel_l2 is not None else math.inf


def _over(one: Attribution) -> float:
    """How far past its threshold an output's lowering is (NaN counts as furthest)."""
    ratio = one.lowering_rel_l2 / one.threshold if one.threshold else math.inf
    return math.inf if math.isnan(ratio) else ratio
