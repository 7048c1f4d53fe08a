"""The diagnose phase of a quantized variant whose lowering, not its quantization, departs
(upgrade_gate.run.diagnosis decides, by the rule in docs/report.md): the culprit search of
diagnose_phase.py run on the quantized program — the method quantized by the stack's own recipe, as the
export phase quantized it, is the eager model the lowering is compared with — with its reproducer, its
ISSUE.md and the remedies a team would try, each lowered, saved, loaded, run and timed as the float
search's are. Each method's threshold is the job's: what its quantization alone departs from float, times
the rule's factor; the parent judges the chosen remedy by the quantized gates (SNR, cosine against the
float model's outputs).

Stages: build → eager → parts → alone → search → remedy → reproducer, as diagnose_phase.py.
"""

from __future__ import annotations

from typing import Any

from ..contract import Adapter, Quantizes
from ..phases import PhaseLog, StageSkipped
from .diagnose_phase import DiagnosePhase

SEARCH = "quantized-lowering"  # the job's and the build stage's "search"


class QuantizedLoweringPhase(DiagnosePhase):
    """The operators behind a quantized program's lowering that departs from the program run eagerly."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.variant: str = self.job["variant"]
        self.PROGRAM, self.MADE = f"the {self.variant} quantized program", ", as the stack's recipe converts it"

    def build(self):
        """Each method quantized as the export phase quantized it: the program whose lowering departs."""
        (methods, inputs), details = super().build()
        return (quantized_methods(self, methods, inputs), inputs), {
            **details, "search": SEARCH, "variant": self.variant,
            "thresholds": {m: self.threshold_of(m) for m in self.methods}}


def quantized_methods(phase: Any, methods: dict[str, Any], inputs: dict[str, Any]) -> dict[str, QuantizedMethod]:
    """Each of the ``phase``'s methods quantized as the export phase quantized it (its job's variant)."""
    if not isinstance(phase.adapter, Quantizes) or phase.variant not in phase.adapter.QUANTIZATIONS:
        raise StageSkipped(f"this stack has no {phase.variant} recipe to quantize the method with again")
    return {name: QuantizedMethod(phase.adapter.quantize(methods[name].module, inputs[name], phase.variant)[0])
            for name in phase.methods}


class QuantizedMethod:
    """A quantized method where the float search reads ``methods[name].module``."""

    def __init__(self, module: Any) -> None:
        self.module = module


def run_quantized_lowering_phase(job: dict[str, Any], adapter: Adapter, log: PhaseLog) -> None:
    """The operators behind a quantized program's lowering (the worker's ``diagnose``,
    ``search = "quantized-lowering"``)."""
    QuantizedLoweringPhase(job, adapter, log).run_stages()
