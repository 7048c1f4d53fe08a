"""The diagnose phase of a quantized variant whose recipe raised, in a stack's worker: each method quantized again
with the capture's other options, in order (the adapter's CAPTURE_REMEDIES: under torch.no_grad()), exported,
lowered, saved, loaded and run as an artifact is, and judged against the float model by the quantized gates — one
method per stage: build → eager → search → remedy → task. The localization (compat/export_phase.py) has named the
submodule and written its reproducer; this phase finds what the team's export script can change.

Its records are the export-remedy phase's (export_remedy_phase.py), whose search it runs with its own options.
Nothing is timed: no artifact shipped to time it against.
"""

from __future__ import annotations

from typing import Any

from ..contract import Adapter, Recaptures
from ..phases import PhaseLog
from .export_remedy_phase import ExportRemedyPhase
from .precision_phase import QuantizedGates

SEARCH = "quantize"  # the job's and the build stage's "search"


class QuantizeRemedyPhase(QuantizedGates, ExportRemedyPhase):
    """build → eager → search → remedy: a capture each method quantizes from."""

    CAPABILITY = Recaptures
    REMEDY_REPLACES = "capture"  # its lines make the program the recipe quantizes
    NOT_OFFERED = "this stack's adapter tries no other capture (compat/contract.py Recaptures)"
    SEARCH = SEARCH
    NONE_WORKS = "no capture the recipe quantizes lowers"
    NO_REMEDY = "no capture the recipe quantizes lowers for any method"
    UNTIMED = "no artifact shipped to time it against: the quantization failed"

    def build(self):
        (methods, inputs), details = super().build()
        self.keep_extents(methods)
        return (methods, inputs), {**details, "variant": self.variant}

    def options(self) -> Any:
        return self.adapter.CAPTURE_REMEDIES

    def made(self, method: str, code: str) -> tuple[Any, list[str]]:
        """The method quantized from what the option's ``code`` captures, then exported as ``lower`` exports it."""
        import torch

        methods, inputs = self.log.results["build"]
        self.step = "quantize"
        quantized = self.adapter.quantize_with_capture(methods[method].module, inputs[method], self.variant, code)
        self.step = "export"
        with torch.no_grad():  # as the export stage exports
            return torch.export.export(quantized, inputs[method]), []


def run_quantize_remedy_phase(job: dict[str, Any], adapter: Adapter, log: PhaseLog) -> None:
    """The capture's other options for a recipe that raised (the worker's ``diagnose``, ``search = "quantize"``)."""
    QuantizeRemedyPhase(job, adapter, log).run_stages()
