"""The diagnose phase of a program that lowers and then fails when the runtime loads or runs it (upgrade_gate.run.
diagnosis decides): the method lowered again as the artifact was and loaded, the runtime's own words caught
(compat/common.py runtime_said), the node they name matched to the calls of the program that make it (the adapter's
load_culprits: operator, module, line, and how its inputs' quantization departs), that call alone on the real tensors
that reached it as the reproducer (exit 1 while it fails to load as found; the whole method where the call alone
loads), and the remedies the runtime's words point at, each lowered, saved, loaded, run and judged against eager as
every remedy is (diagnose_phase.py). A quantized variant is searched on its program quantized again by the stack's
recipe, as quantized_lowering_phase.py searches it; the parent judges its remedy by the quantized gates.

Stages: build → eager → program → search → remedy → task → reproducer.
"""

from __future__ import annotations

from typing import Any

from ..common import runtime_said
from ..contract import Adapter, AnswersLoadFailures
from ..phases import PhaseLog, StageSkipped
from ..search import culprit, issue_text, program_source
from ..search.quoting import markdown_code
from .diagnose_phase import DiagnosePhase
from .diagnose_reproducer import REPRO_DIR, where
from .quantized_lowering_phase import quantized_methods

SEARCH = "load"  # the job's and the build stage's "search"


class LoadFailurePhase(DiagnosePhase):
    """The node behind a lowered program that fails to load, its reproducer and its remedies."""

    CAPABILITY: Any = AnswersLoadFailures
    NOT_OFFERED = "this stack's adapter reads no runtime's load failure (compat/contract.py AnswersLoadFailures)"
    FAILS_AT = "load"
    UNTIMED = "the shipped artifact does not load: nothing to time it against"
    STAGES = (("build", ()), ("eager", ("build",)), ("program", ("eager",)), ("search", ("program",)),
              ("remedy", ("search",)), ("task", ("remedy",)), ("reproducer", ("search",)))

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.variant: str = self.job.get("variant") or ""
        if self.variant:
            self.PROGRAM, self.MADE = f"the {self.variant} quantized program", ", as the stack's recipe converts it"

    def build(self):
        """Each method as the export phase made it: quantized by the stack's recipe, for a variant."""
        (methods, inputs), details = super().build()
        if self.variant:
            methods = quantized_methods(self, methods, inputs)
        return (methods, inputs), {**details, "search": SEARCH, "variant": self.variant,
                                   "failed_at": self.job.get("failed_at", "load"),
                                   "thresholds": {m: self.threshold_of(m) for m in self.methods}}

    def program(self):
        """What the lowering starts from, for each method: the remedies run on it."""
        methods, inputs = self.log.results["build"]
        self.whole = {name: self.adapter.lowering_start(methods[name].module, inputs[name]) for name in self.methods}
        return self.whole, None

    def search(self):
        """Each method lowered again as the artifact was, loaded and run here: the runtime's words where it fails,
        and the calls they name."""
        _, inputs = self.log.results["build"]
        found = {}
        for method in self.methods:
            try:
                runtime_said(self.adapter.run_lowered, self.adapter.lower_keeping_out(self.whole[method], frozenset()),
                             inputs[method])
            except Exception as failure:  # noqa: BLE001 - the failure searched: its words say which node
                said = " · ".join(getattr(failure, "__notes__", []))
                fails_with = (str(failure).strip().splitlines() or [type(failure).__name__])[0][:160]
                found[method] = {**self.adapter.load_culprits(self.whole[method], said), "fails_with": fails_with}
            else:
                found[method] = {"status": "does not reproduce",
                                 "reason": "lowered again as the artifact was, the program loads and runs here"}
        return found, {"methods": found}

    def remedy_start(self, method: str) -> Any:
        """The method exported again for each remedy: a copy of a quantized program shares its symbolic shapes with
        the program it was copied from, which a remedy that exports its module again leaves unusable to the next
        (yolov8n int8: "PendingUnbackedSymbolNotFound" where the same lines lowered alone)."""
        methods, inputs = self.log.results["build"]
        return self.adapter.lowering_start(methods[method].module, inputs[method])

    def remedy_options(self, method: str) -> list[tuple[str, str, bool]]:
        return self.adapter.load_remedy_options(self.whole[method], self.log.results["search"][method])

    def reproducer(self):
        """For each method's first culprit call: the call alone on the real tensors that reached it, where its
        program fails to load as the method's did; else the whole method as the lowering starts from it."""
        _, inputs = self.log.results["build"]
        written = {}
        for method, finding in self.log.results["search"].items():
            culprits = finding.get("culprits") or []
            if not culprits:
                continue
            found, fails_with = culprits[0], finding["fails_with"]
            folder = self.model_dir / REPRO_DIR / method
            folder.mkdir(parents=True, exist_ok=True)
            found_in = f"{self.job['model']}'s {method}:\n{where(found)}. {finding['reason']}."
            remedy, key = self.remedy_code(method), found["calls"][0]["key"]
            (_, arguments, _), = culprit.capture_node_inputs(self.whole[method], inputs[method], {key}).values()
            call, tensors = self.adapter.load_call_code(self.whole[method], key, tuple(arguments))
            culprit.write_reproducer(folder, tuple(tensors), self.adapter.load_reproducer_source(
                kind=found["operator"], call=call, arguments=len(tensors), threshold=self.threshold_of(method),
                remedy=remedy, found_in=found_in, fails_with=fails_with))
            # The call alone may abort in the runtime (mobileone's add): in a Python of its own, not this worker.
            runs, scope, note = [issue_text.run_reproducer(folder, isolated=True)], "operator", ""
            if runs[0]["exit"] != 1:  # the call alone loads: the smallest program known to fail is the method
                note = f"the call alone {runs[0]['said'] or 'does not fail as found'}: the reproducer is the method"
                self.method_reproducer(method, self.whole[method], folder, kind=found["operator"], remedy=remedy,
                                       found_in=found_in, fails_with=fails_with)
                runs, scope = [issue_text.run_reproducer(folder)], "method"
                runs += program_source.checked(folder, runs[0])
            runs.insert(1, issue_text.run_reproducer(folder, "--with-remedy"))
            self.write_issue(folder, method, markdown_code(found["operator"]), found["backend"], scope, runs,
                             fails_with)
            written[method] = self.written(folder, runs, operator=found["operator"], scope=scope, reason=note,
                                           rel_l2=None)
        if not written:
            raise StageSkipped("no call named by the runtime's words")
        return written, {"methods": written}

    def load_failure_said(self, method: str) -> str:
        """The runtime's own words for the method, as the search caught them."""
        return str((self.log.results["search"][method].get("runtime") or {}).get("said", ""))


def run_load_phase(job: dict[str, Any], adapter: Adapter, log: PhaseLog) -> None:
    """The node behind a program that lowers and fails to load (the worker's ``diagnose``, ``search = "load"``)."""
    LoadFailurePhase(job, adapter, log).run_stages()
