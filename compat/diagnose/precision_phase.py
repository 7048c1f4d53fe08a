"""The diagnose phase of a quantized variant, in a stack's worker: run where the variant's artifact departs
from the float model beyond its quantized-numerics gate. Which layers to leave in float (precision.py),
and the lines of an export script that do, checked by lowering the method with them — one method per
stage: build → eager → search → remedy, for each method that failed.

Its records are the diagnose phase's (diagnose_phase.py): a culprit is a unit kept in float. Its reproducer is
for the team, not to file upstream (a quantization's rounding is the recipe's choice, not a bug): the float program
as the recipe captures it, quantized by the export script's own lines and measured by the gate, exit 1 / 0 with the
layers kept in float (``reproducer``, after ``remedy``: the lines it runs are the ones judged).
"""

from __future__ import annotations

import shutil
import time
from typing import Any

from ..common import flat
from ..contract import Adapter, KeepsFloat, ReproducesQuantizeFailures
from ..phases import PhaseLog, StageSkipped
from ..search import issue_text
from ..search.program_source import WEIGHTS_MAX_BYTES
from . import precision, remedy_trial
from .diagnose_phase import WHOLE_MODEL_STAGES, DiagnosePhase
from .diagnose_reproducer import REPRO_DIR

SEARCH = "keep-float"  # the job's and the build stage's "search"
# Units the sensitivity ranking may try: at most what half the method's budget buys at the time one
# quantization took, and never fewer than this (a coarser search would claim little).
MIN_UNITS = 4


class QuantizedGates:
    """How a quantized variant's search and remedies are judged: against the float model, by the quantized gates'
    SNR and cosine, on the parts of each output a later call reads (the job's ``min_snr_db``, ``min_cosine``; the
    build stage's ``extents``)."""

    job: dict[str, Any]
    log: Any
    methods: list[str]
    extents: dict[str, dict[int, tuple[int, int]]]

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)  # the phase's, next in the subclass's order
        self.variant: str = self.job["variant"]
        self.min_snr_db, self.min_cosine = float(self.job["min_snr_db"]), float(self.job["min_cosine"])

    def keep_extents(self, methods: dict[str, Any]) -> None:
        """The parts of each output a later call reads, from the build stage's methods."""
        self.extents = {name: dict(methods[name].read_extents) for name in self.methods}

    def departure(self, outputs: Any, method: str) -> precision.Departure:
        """The worst output's relative L2 and cosine against the float model, on the parts a later call reads."""
        import torch

        extents = self.extents
        rel_l2s, cosines = [], []
        for index, (actual, expected) in enumerate(zip(flat(outputs), self.log.results["eager"][method])):
            if index in extents[method]:
                axis, count = extents[method][index]
                actual, expected = actual.narrow(axis, 0, count), expected.narrow(axis, 0, count)
            a, e = actual.double().flatten(), expected.double().flatten()
            error, norm = torch.linalg.vector_norm(a - e).item(), torch.linalg.vector_norm(e).item()
            rel_l2s.append(error / norm if norm else (0.0 if not error else float("inf")))
            both = torch.linalg.vector_norm(a).item() * norm
            cosines.append(torch.dot(a, e).item() / both if both else 1.0)
        return precision.Departure(rel_l2=max(rel_l2s), cosine=min(cosines))

    def judged(self, method: str, outputs: Any) -> dict[str, Any]:
        """A remedy's outputs against the float model, as the quantized gates measure them."""
        found = self.departure(outputs, method)
        return {"rel_l2": found.rel_l2, "cosine": found.cosine,
                "passes": found.snr_db >= self.min_snr_db and found.cosine >= self.min_cosine}


class PrecisionPhase(QuantizedGates, DiagnosePhase):
    """build → eager → search → remedy: the layers of a quantized variant to keep in float."""

    CAPABILITY = KeepsFloat
    NOT_OFFERED = "this stack's adapter has no layer-precision search (compat/contract.py KeepsFloat)"
    STAGES = (*WHOLE_MODEL_STAGES, ("reproducer", ("search",)))
    TIMES_FAILING = True
    REMEDY_REPLACES = "quantization"  # its lines bind the recipe's quantizer, some layers kept in float

    def build(self):
        (methods, inputs), details = super().build()
        self.keep_extents(methods)
        return (methods, inputs), {**details, "search": SEARCH, "variant": self.variant}

    def quantized(self, method: str, code: str) -> Any:
        """The method quantized with the remedy's code, run as written."""
        _, inputs = self.log.results["build"]
        scope: dict[str, Any] = {}
        exec(compile(code, f"<keep-float remedy for {method}>", "exec"), scope)  # noqa: S102 - code we generated
        return self.adapter.quantize_with_remedy(self.starts[method], inputs[method], self.variant, scope)

    def search(self):
        import torch

        methods, inputs = self.log.results["build"]
        self.starts = {name: self.adapter.precision_start(methods[name].module, inputs[name], self.variant)
                       for name in self.methods}
        found = {}
        for method in self.methods:
            def departure_of(keep: frozenset[str], method: str = method,
                             cache: dict[frozenset[str], precision.Departure] = {}) -> precision.Departure:  # noqa: B006
                if keep not in cache:
                    module = self.quantized(method, self.adapter.keep_float_code(self.variant, sorted(keep)))
                    with torch.no_grad():
                        cache[keep] = self.departure(module(*inputs[method]), method)
                return cache[keep]

            budget = self.job["budget_s"] / len(self.methods)
            trials = precision.Trials(departure_of=departure_of, min_snr_db=self.min_snr_db,
                                      min_cosine=self.min_cosine, budget_s=budget)
            layers = self.adapter.quantizable_layers(methods[method].module, self.variant)
            trials.departure((), "nothing (every layer quantized)")  # the first pays for what loads once
            started = time.monotonic()
            trials.departure(layers, "every layer in float")  # what one quantization costs
            seconds = max(time.monotonic() - started, 1e-3)
            most = int(budget / 2 / seconds)
            units = precision.units_of(layers, max(most, MIN_UNITS))
            if len(units) > most or (units != layers and len(units) < MIN_UNITS):
                # Known from the first quantization: a ranking the budget cannot finish, or too coarse to
                # say anything (the whole decoder in float) — no time spent on either.
                found[method] = {
                    "status": "stopped at budget", "tried": list(trials.tried), "layers": len(layers), "units": units,
                    "reason": f"one quantization takes {seconds:.1f} s: half of this method's budget ({budget:g} s) "
                              f"ranks {most} units, and the {len(layers)} layers " + (
                                  f"group into no fewer than {len(units)}" if len(units) > most else
                                  f"then group into {len(units)} parent modules ({', '.join(units)}), too coarse to "
                                  "claim anything") + "; raise diagnose-budget"}
                continue
            trials.tried.clear()  # find() asks again (cached): its record starts there
            found[method] = {**precision.find(units, trials), "layers": len(layers)}
        return found, {"methods": found}

    def remedy(self):
        """The layers found left in float, as the export script's lines say: the method quantized and lowered
        with them, saved, loaded from its file and run as the artifact is; its outputs kept for the parent to
        judge against the reference as the gate does, its calls timed against the shipped artifact's."""
        unanswered = [f"{m} ({f.get('status')})" for m, f in self.log.results["search"].items()
                      if f.get("status") != "found"]
        if unanswered:  # the variant ships every method: the others' layers in float could not bring it over
            raise StageSkipped(f"no set of layers for {', '.join(unanswered)}: a remedy of the other methods alone "
                               "leaves the variant below its gate, so none is lowered")
        remedies = remedy_trial.Remedies(self.model_dir, self.REMEDY_REPLACES)
        for method, finding in self.log.results["search"].items():
            remedies.add(method, self.keeping_float(method, finding["kept_float"]))
        return remedies.record("no set of layers found")

    def keeping_float(self, method: str, layers: list[str]) -> dict[str, Any]:
        """The method quantized with ``layers`` left in float, then lowered, saved, loaded and run (``tried``)."""
        _, inputs = self.log.results["build"]
        code = self.adapter.keep_float_code(self.variant, layers)
        return self.tried(method, [("quantizing", lambda _: self.quantized(method, code)),
                                   ("lowering", lambda quantized: self.adapter.lower(quantized, inputs[method])[0])],
                          code=code)

    def reproducer(self):
        """For each method whose departure the search confirmed: the float program as the recipe captures it,
        quantized by the export script's lines and measured against the float model by the gate, run here as
        written — exit 1, and with ``--with-remedy`` (the layers found, the ones the remedy judged) exit 0. A search
        with no remedy (not pinned, spread, stopped) gets the departure alone; one that did not reproduce, none."""
        if not isinstance(self.adapter, ReproducesQuantizeFailures):
            raise StageSkipped("this stack's adapter writes no quantization reproducer "
                               "(compat/contract.py ReproducesQuantizeFailures)")
        methods, inputs = self.log.results["build"]
        written: dict[str, Any] = {}
        for method, finding in self.log.results["search"].items():
            if (status := finding.get("status")) == "does not reproduce":
                continue
            # The remedy's layers where one was found; else what the search last held in float: every unit, which
            # does not bring a "not pinned" variant within its gate, or the most of it a "spread" one needs.
            keep = finding.get("kept_float") or list(finding.get("units") or [])
            weights = sum(t.numel() * t.element_size() for t in methods[method].module.state_dict().values())
            if weights > WEIGHTS_MAX_BYTES:  # an LLM's float program: hundreds of MB in the folder a team hands on
                written[method] = {"status": "not written", "reason": (
                    f"its float weights are {weights / 2**20:.0f} MiB, more than the {WEIGHTS_MAX_BYTES // 2**20} MiB "
                    "a reproducer carries: the search's figures above are the evidence")}
                continue
            (folder := self.model_dir / REPRO_DIR / method).mkdir(parents=True, exist_ok=True)
            try:
                self.adapter.precision_reproducer(
                    methods[method].module, inputs[method], self.log.results["eager"][method], folder,
                    variant=self.variant, keep_float=keep, min_snr_db=self.min_snr_db, min_cosine=self.min_cosine,
                    extents=self.extents[method], found_in=f"{self.job['model']}'s {method} ({status})")
            except ValueError as why:  # a recipe with no program to hand on (8da4w's torchao)
                shutil.rmtree(folder)  # no empty or half-written reproducer beside a "not written"
                written[method] = {"status": "not written", "reason": str(why)}
                continue
            runs = [issue_text.run_reproducer(folder)]
            if status == "found":
                runs.append(issue_text.run_reproducer(folder, "--with-remedy"))
            written[method] = self.written(folder, runs, operator=None, scope="quantized", issue=None,
                                           rel_l2=finding.get("rel_l2"),
                                           reason=f"{status}: the layers kept in float by --with-remedy: "
                                                  f"{', '.join(keep) or 'none'}")
        if not written:
            raise StageSkipped("the search found no departure to reproduce")
        return written, {"methods": written}


def run_precision_phase(job: dict[str, Any], adapter: Adapter, log: PhaseLog) -> None:
    """Which layers of a quantized variant to leave in float (the worker's ``diagnose``, ``search = "keep-float"``)."""
    PrecisionPhase(job, adapter, log).run_stages()
