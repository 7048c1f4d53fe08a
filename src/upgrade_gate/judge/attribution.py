"""Whether a quantized variant's lowering, not its quantization, departs: each method's artifact against the
same stack's quantized model run eagerly, weighed against that quantized model against the float model
(docs/report.md, "The lowering or the quantization").

The lowering departs where the artifact's worst output is further from its own eager quantized model than
``LOWERING_FACTOR`` times the quantization's own worst departure from float — its SNR more than
20·log10(LOWERING_FACTOR) ≈ 6 dB below the quantization's — and further than the float numerics gate's
threshold (a method the recipe leaves in float is held to the float model's rule). A backend's quantized
kernels round otherwise than the eager reference (XNNPACK quantizes a dynamic input per row, PT2E per
tensor), which adds noise of the quantization's own order; a lowering that departs by more changed what the
program computes. Measures only the comparisons judge/gather.py made; thresholds come from the caller.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from upgrade_gate.judge.numerics import worst_rel_l2_by_method
from upgrade_gate.schema.comparison import OutputMetrics

LOWERING_FACTOR = 2.0  # the lowering may add up to this times the quantization's own error (6 dB)


@dataclass(frozen=True, kw_only=True, slots=True)
class Attribution:
    """One method of a quantized variant: what its quantization and its lowering each depart by (worst outputs)."""

    method: str
    quantization_rel_l2: float  # the quantized model run eagerly, against the float model
    lowering_rel_l2: float  # the artifact, against the quantized model run eagerly
    floor: float  # the float numerics gate's max-rel-l2: what any lowering may add

    @property
    def threshold(self) -> float:
        """What the lowering may depart by: the quantization's own error times the factor, or the float floor."""
        return max(LOWERING_FACTOR * self.quantization_rel_l2, self.floor)

    @property
    def lowering_departs(self) -> bool:
        return not self.lowering_rel_l2 <= self.threshold  # NaN departs: it never passes silently

    @staticmethod
    def snr_db(rel_l2: float) -> float:
        return -20 * math.log10(rel_l2) if rel_l2 > 0 else math.inf

    def said(self) -> str:
        """The rule's figures, as the report and the job say them."""
        return (f"the artifact is at SNR {self.snr_db(self.lowering_rel_l2):.1f} dB against its own quantized model "
                f"run eagerly, whose quantization is at SNR {self.snr_db(self.quantization_rel_l2):.1f} dB against "
                f"the float model")


def attributions(quantization: list[OutputMetrics], lowering: list[OutputMetrics],
                 floor: float) -> dict[str, Attribution]:
    """Per method found in both comparisons (an output that does not compare counts as infinitely far)."""
    quantized = worst_rel_l2_by_method(quantization, incomparable=math.inf)
    lowered = worst_rel_l2_by_method(lowering, incomparable=math.inf)
    return {method: Attribution(method=method, quantization_rel_l2=quantized[method],
                                lowering_rel_l2=lowered[method], floor=floor)
            for method in quantized if method in lowered}
