"""The diagnose phase of a float model whose export failed, in a stack's worker: each method exported again
with the export API's other options, in order (the adapter's EXPORT_REMEDIES: strict tracing, draft_export),
lowered, saved, loaded and run as an artifact is — one method per stage: build → eager → search → remedy → task.

Its records are the diagnose phase's (diagnose_phase.py): the search stage holds every try, the remedy stage
the lines that export each method and the artifact they make, compared with eager; the parent judges it
against the reference (judge/_remedies.py). Nothing is timed: no artifact shipped to time it against.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..contract import Adapter, ReExports
from ..phases import PhaseLog
from . import remedy_trial
from .diagnose_phase import WHOLE_MODEL_STAGES, DiagnosePhase

SEARCH = "export"  # the job's and the build stage's "search"
# Where draft_export writes its structured trace (torch.export._draft_export.CaptureStructuredTrace); without it,
# the system's temporary folder (/tmp/export_<user>): outside the report folder and the cache.
DTRACE_ENV = "TORCH_DTRACE"
TRACE_DIR = "export-trace"  # in the phase's folder, for the length of one export


@contextlib.contextmanager
def trace_inside(folder: Path) -> Iterator[None]:
    """torch's structured trace of one export written in ``folder`` (the phase's own), and removed after: the
    worker writes nothing outside the report folder and the cache, whatever the export API logs."""
    folder.mkdir(parents=True, exist_ok=True)
    before = os.environ.get(DTRACE_ENV)
    os.environ[DTRACE_ENV] = str(folder)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(DTRACE_ENV, None)
        else:
            os.environ[DTRACE_ENV] = before
        shutil.rmtree(folder, ignore_errors=True)


class ExportRemedyPhase(DiagnosePhase):
    """build → eager → search → remedy: an export option each method exports with."""

    CAPABILITY: Any = ReExports
    REMEDY_REPLACES = "export"  # an option of the export API: its line makes the program
    NOT_OFFERED = "this stack's adapter tries no other export options (compat/contract.py ReExports)"
    STAGES = WHOLE_MODEL_STAGES
    SEARCH = SEARCH
    NONE_WORKS, NO_REMEDY = "no option of the export API exports it", "no option of the export API exports any method"
    UNTIMED = "no artifact shipped to time it against: the export failed"

    def build(self):
        built, details = super().build()
        return built, {**details, "search": self.SEARCH}

    def options(self) -> Any:
        return self.adapter.EXPORT_REMEDIES

    def made(self, method: str, code: str) -> tuple[Any, list[str]]:
        """The program one option's ``code`` makes of the method, and what it assumed of the example inputs;
        ``self.step``, the step running, said where it fails."""
        methods, inputs = self.log.results["build"]
        self.step = "export"
        with trace_inside(self.model_dir / TRACE_DIR):
            return self.adapter.export_with(methods[method].module, inputs[method], code)

    def search(self):
        """Each method's options in order, until one makes a program that lowers: every try recorded."""
        self.programs: dict[str, Any] = {}
        found = {}
        for method in self.methods:
            tried: list[dict[str, Any]] = []
            for name, code in self.options():
                start = time.monotonic()
                try:
                    exported, assumed = self.made(method, code)
                    self.step = "lowering"
                    lowered = self.adapter.lower_keeping_out(exported, frozenset())
                except Exception as error:  # noqa: BLE001 - the option's outcome: the next one is tried
                    tried.append({"option": name, "ok": False, "step": self.step,
                                  "error": f"{type(error).__name__}: {str(error).strip().splitlines()[0][:300]}",
                                  "seconds": round(time.monotonic() - start, 2)})
                    continue
                tried.append({"option": name, "ok": True, "assumed": assumed,
                              "seconds": round(time.monotonic() - start, 2)})
                self.programs[method] = lowered
                found[method] = {"status": "found", "option": name, "code": code, "assumed": assumed, "tried": tried}
                break
            else:
                found[method] = {"status": "not pinned", "tried": tried,
                                 "reason": f"{self.NONE_WORKS}: "
                                           + "; ".join(f"{t['option']}: {t['error']}" for t in tried)}
        return found, {"methods": found}

    def remedy(self):
        """The lowered programs saved, loaded from their files and run as artifacts are (``tried``), compared
        with eager."""
        remedies = remedy_trial.Remedies(self.model_dir, self.REMEDY_REPLACES)
        for method, lowered in self.programs.items():
            remedies.add(method, self.tried(method, (), made=lowered, code=self.log.results["search"][method]["code"]))
        return remedies.record(self.NO_REMEDY)


def run_export_remedy_phase(job: dict[str, Any], adapter: Adapter, log: PhaseLog) -> None:
    """The export API's other options for a failed export (the worker's ``diagnose``, ``search = "export"``)."""
    ExportRemedyPhase(job, adapter, log).run_stages()
