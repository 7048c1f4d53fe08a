"""The diagnose phase in a stack's worker, run where an artifact's outputs departed from the same stack's eager
outputs: the operators behind it (culprit.py), a reproducer to file upstream, and the remedies a team would try,
expected cheapest first, each checked on the same real inputs until one passes at no more latency than the gate
allows, the cheapest that passes chosen, then a reproducer whose --with-remedy is that one — one method per stage:
build → eager → parts → alone → search → remedy → task → reproducer, for each method that failed (task: a
generator's loop on the remedied artifact)."""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..common import flat, flatten_outputs, load_case, load_methods
from ..contract import Adapter, Diagnoses, SearchesBlocks, require_whole
from ..phases import PhaseLog, StageSkipped, run_task
from ..search import culprit
from . import blocks, remedy_trial
from .diagnose_reproducer import Reproducers
from .remedy_choice import cheapest, why_not_tried

# The stages of a search over the whole model (the precision, export-remedy and latency phases: no parts, no
# operator alone, no reproducer).
WHOLE_MODEL_STAGES = (("build", ()), ("eager", ("build",)), ("search", ("eager",)), ("remedy", ("search",)),
                      ("task", ("remedy",)))
FOUND = ("found", "combination")  # a search's statuses that name culprits
REMEDY_TASK = "remedy-task.npz"  # a generator's loop run on it: tokens and step logits, as the runtime's task stage


class DiagnosePhase(Reproducers):
    """The diagnose phase: build → eager → parts → alone → search → remedy → task → reproducer."""

    def __init__(self, job: dict[str, Any], adapter: Adapter, log: PhaseLog) -> None:
        # Diagnoses' members, once run_stages has checked the adapter has them.
        self.adapter: Any = adapter
        self.job, self.log = job, log
        self.model_dir = Path(job["model_dir"])
        self.threshold = float(job.get("threshold", "nan"))  # the numerics gate's; a variant's search has its own
        # A quantized program's lowering: each method's own (upgrade_gate.run.diagnosis), from its quantization's error.
        self.thresholds: dict[str, float] = {m: float(v) for m, v in (job.get("thresholds") or {}).items()}
        # ... and each of its outputs' own (``output_1`` → its allowance), where they differ output by output.
        self.output_thresholds: dict[str, dict[str, float]] = job.get("output_thresholds") or {}
        self.methods: list[str] = list(job["methods"])
        self.remedies: dict[str, str] = {}  # method → the code of the remedy chosen (or the last option, unjudged)
        self.fusions: dict[str, dict[str, Any]] = {}  # method → the fused pair that fails alone (code, tensors, error)
        # method → the block the search runs on, where it does not run on the method
        self.blocks: dict[str, blocks.Block] = {}
        self.whole: dict[str, Any] = {}  # method → what its lowering starts from: the remedies are judged on it

    # What the adapter must offer, what the report says when it does not, and the stages in order with the
    # stages each needs: the subclasses (precision_phase.py, export_remedy_phase.py: each its own entry, which
    # worker.py picks by the job's search) set their own.
    CAPABILITY: Any = Diagnoses
    PROGRAM, MADE = "float32", ""  # what ISSUE.md says was lowered, and how it was made
    NOT_OFFERED = "this stack's adapter has no culprit search (compat/contract.py Diagnoses)"
    STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
        ("build", ()), ("eager", ("build",)), ("parts", ("eager",)), ("alone", ("parts",)),
        ("search", ("alone",)), ("remedy", ("search",)), ("task", ("remedy",)), ("reproducer", ("search",)))

    def run_stages(self) -> None:
        self.adapter.set_threads(self.job["threads"])  # torch's and the runtime's, before any load: the remedy is timed
        require_whole(self.adapter, self.CAPABILITY, self.job["adapter"])
        if not isinstance(self.adapter, self.CAPABILITY):
            self.log.stage("build", (), self.not_offered)
        else:
            for stage, needs in self.STAGES:
                self.log.stage(stage, needs, getattr(self, stage))
        self.log.finish()

    def threshold_of(self, method: str) -> float:
        """The relative L2 error against eager the method's lowering may have."""
        return self.thresholds.get(method, self.threshold)

    def limits_of(self, method: str, outputs: int) -> list[float]:
        """What each of the method's ``outputs`` (in order) may depart by: its own allowance where the job gives
        one (output ``output_<i>``), else the method's threshold."""
        own = {int(m.group(1)): float(v) for name, v in self.output_thresholds.get(method, {}).items()
               if (m := re.match(r"output_(\d+)", name))}
        return [own.get(i, self.threshold_of(method)) for i in range(outputs)]

    def not_offered(self):
        raise StageSkipped(self.NOT_OFFERED)

    def build(self):
        case, inputs, _ = load_case(self.job)
        self.case = case  # its task's loop, for the remedy's (``task``)
        methods = case.entry_points()
        return (methods, inputs), {"methods": self.methods}

    def eager(self):
        import torch

        methods, inputs = self.log.results["build"]
        with torch.no_grad():
            return {name: flat(methods[name].module(*inputs[name])) for name in self.methods}, None

    def error_of(self, lowered: Any, method: str) -> float:
        """The worst relative L2 error of a lowering's outputs against eager, as the gate measures it. Where the
        outputs have allowances of their own (a quantized program's), each is weighed by the method's threshold
        over its own, so that the figure is within the method's threshold exactly when every output is within
        its own allowance (the most lenient output's figure is its relative L2 as it is)."""
        inputs, eager = self.searched(method)
        outputs = flat(self.adapter.run_lowered(lowered, inputs))
        if method in self.blocks:  # a block's outputs are no method's outputs: held to the method's threshold
            return max(culprit.rel_l2(a, e) for a, e in zip(outputs, eager))
        return self.error_against_eager(outputs, method)

    def searched(self, method: str) -> tuple[tuple[Any, ...], list[Any]]:
        """The real inputs and eager outputs of what the search lowers: the method's block, or the method."""
        block = self.blocks.get(method)
        if block is not None:
            return block.inputs, block.eager
        _, inputs = self.log.results["build"]
        return inputs[method], self.log.results["eager"][method]

    def error_against_eager(self, outputs: list[Any], method: str) -> float:
        """The worst relative L2 error of the whole method's outputs against eager (a remedy's), as the gate
        measures it."""
        errors = [culprit.rel_l2(a, e) for a, e in zip(outputs, self.log.results["eager"][method])]
        if method not in self.output_thresholds:
            return max(errors)
        threshold = self.threshold_of(method)
        # An allowance is never 0: the float rule's threshold is its floor (judge/attribution.py).
        return max(error * threshold / limit for error, limit in zip(errors, self.limits_of(method, len(errors))))

    def parts(self):
        """What the lowering takes of each method, or of its first block where that block, lowered alone, departs
        from the block run eagerly (each try of the search then lowers the block, not the method)."""
        methods, inputs = self.log.results["build"]
        found, searched = {}, {}
        for name in self.methods:
            module = methods[name].module
            if isinstance(self.adapter, SearchesBlocks):
                self.whole[name] = self.adapter.lowering_start(module, inputs[name])
                searched[name] = self.departing_block(name)
            block = self.blocks.get(name)
            found[name] = (self.adapter.lowering_parts(block.module, block.inputs) if block
                           else self.adapter.lowering_parts(module, inputs[name], self.whole.get(name)))
            self.whole.setdefault(name, found[name][0])
        return found, {"parts": {name: len(parts) for name, (_, parts) in found.items()}, "blocks": searched}

    def departing_block(self, method: str) -> dict[str, Any]:
        """The method's first repeated block, where it departs lowered alone, as the search's program from here on
        (``self.blocks``; blocks.departing); the record says what was found either way."""
        _, inputs = self.log.results["build"]
        # A method that shipped no artifact did not lower: its block stands for it only where it fails to lower too.
        lowers = method in (self.job.get("artifacts") or {})
        found, block = blocks.departing(self.adapter, self.whole[method], inputs[method], self.threshold_of(method),
                                        lowers)
        if block is not None:
            self.blocks[method] = block
        return found

    def search_threshold(self, method: str) -> float:
        """What the search holds its program to: the block's share of the method's threshold, or the method's."""
        block = self.blocks.get(method)
        return block.threshold if block else self.threshold_of(method)

    def alone(self):
        """Each kind as a one-operator program on the real tensors of its first call."""
        found: dict[str, dict[str, Any]] = {}
        failures: dict[str, dict[str, str]] = {}
        for method, (exported, parts) in self.log.results["parts"].items():
            first: dict[str, str] = {}
            for part in parts:
                if part.get("runs_alone", True):  # a pass of the lowering is no operator to run alone
                    first.setdefault(part["kind"], part["key"])
            if not first:
                continue
            calls = culprit.capture_node_inputs(exported, self.searched(method)[0], set(first.values()))
            for kind, key in first.items():
                if key not in calls:
                    continue
                try:
                    found.setdefault(method, {})[kind] = self.one_op(*calls[key])
                except Exception as error:  # noqa: BLE001 - a kind that will not run alone is only unranked
                    failures.setdefault(method, {})[kind] = f"{type(error).__name__}: {str(error)[:300]}"
        errors = {m: {k: v["rel_l2"] for k, v in kinds.items()} for m, kinds in found.items()}
        return found, {"rel_l2": errors, "not_run_alone": failures}

    def one_op(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        return self.run_alone(*culprit.op_call_code(target, args, kwargs))

    def run_alone(self, code: str, tensors: list[Any]) -> dict[str, Any]:
        """``code`` (one operator, or a fused pair) as a program of its own on ``tensors``, lowered, run and
        compared with eager."""
        import torch

        if any(t.dim() == 0 for t in tensors):  # a lifted scalar: ExecuTorch's pybinding aborts on a 0-dim input
            raise ValueError("a 0-dim tensor argument (a lifted scalar): the runtime's Python binding cannot take one")
        module = culprit.one_op_module(code, len(tensors))
        with torch.no_grad():
            eager = module(*tensors)
        exported = torch.export.export(module, tuple(tensors))
        lowered = self.adapter.lower_keeping_out(exported, frozenset())
        actual = flat(self.adapter.run_lowered(lowered, tuple(tensors)))[0]
        return {"code": code, "tensors": tensors, "rel_l2": culprit.rel_l2(actual, eager)}

    def search(self):
        found = {}
        for method, (exported, parts) in self.log.results["parts"].items():
            alone = {kind: v["rel_l2"] for kind, v in self.log.results["alone"].get(method, {}).items()}
            found[method] = self.find(method, exported, parts, alone)
            block = self.blocks.get(method)
            if block is not None and found[method]["status"] in FOUND:
                found[method]["block"] = {"path": block.path, "of": block.of}
            elif block is not None:  # nothing pinned in the block: the method searched as it was before blocks
                found[method] = {**self.search_whole(method, alone),
                                 "block_searched": {"path": block.path, "status": found[method]["status"],
                                                    "lowerings": len(found[method]["tried"])}}
            self.fused_pair(method, found[method])
        return found, {"methods": found}

    def find(self, method: str, exported: Any, parts: list[dict[str, Any]], alone: dict[str, float]) -> dict[str, Any]:
        """One method's culprit search (culprit.find) on ``exported``: its block's, or the whole method's."""
        def error_of(keep_out: frozenset[str]) -> float:
            return self.error_of(self.adapter.lower_keeping_out(exported, keep_out), method)

        search = culprit.Search(error_of=error_of, threshold=self.search_threshold(method),
                                budget_s=self.job["budget_s"] / len(self.methods))
        return culprit.find(parts, search, alone)

    def search_whole(self, method: str, alone: dict[str, float]) -> dict[str, Any]:
        """The search on the whole method, where its block's found no culprit: the method's parts from here on."""
        methods, inputs = self.log.results["build"]
        del self.blocks[method]
        exported, parts = self.log.results["parts"][method] = self.adapter.lowering_parts(
            methods[method].module, inputs[method], self.whole.get(method))
        return self.find(method, exported, parts, alone)

    def fused_pair(self, method: str, finding: dict[str, Any]) -> None:
        """A culprit kind that passes alone yet fixes the method kept out is likely one the backend fuses with a
        neighbour (an activation folded into the operator before it): each pair it forms with a call the lowering
        delegates beside it, run alone on the real tensors that reached them; the first that fails names the
        fusion, and is the reproducer."""
        if finding.get("status") != "found":
            return
        threshold = self.search_threshold(method)
        found = finding["culprits"][0]
        if found.get("rel_l2_alone") is None or found["rel_l2_alone"] > threshold:  # it fails alone, or never ran so
            return
        exported, parts = self.log.results["parts"][method]
        kinds = {part["key"]: part["kind"] for part in parts}
        for position, producer, consumer in culprit.fused_neighbours(exported, found["calls"][0]["key"], set(kinds)):
            try:
                ran = self.run_alone(*culprit.chained_call_code(exported, self.searched(method)[0], producer,
                                                                consumer))
            except Exception:  # noqa: BLE001 - a pair that will not run alone names nothing
                continue
            if ran["rel_l2"] > threshold:
                other = kinds[consumer if position == "following" else producer]
                other_alone = self.log.results["alone"].get(method, {}).get(other)
                found["fused_with"] = {"operator": other, "position": position, "rel_l2_fused": ran["rel_l2"],
                                       "rel_l2_alone": other_alone["rel_l2"] if other_alone else None}
                self.fusions[method] = ran
                return

    def remedy_options(self, method: str) -> list[tuple[str, str, bool]]:
        finding = self.log.results["search"][method]
        culprits = finding.get("culprits") or []
        found = [(c["operator"], c["calls"][0]["key"]) for c in culprits]
        fused = [kind for c in culprits if "fused_with" in c for kind in (c["operator"], c["fused_with"]["operator"])]
        # The whole method's: a team's export script lowers the method (a culprit found in a block is named by its
        # kind there).
        return self.adapter.remedy_options(self.whole[method], found, fused=fused)

    def remedy_code(self, method: str) -> str:
        """The chosen remedy's lines; where the remedy stage did not run, the last option's (it keeps the culprits
        out), which the reproducer prints unjudged."""
        if method not in self.remedies:
            self.remedies[method] = self.remedy_options(method)[-1][1]
        return self.remedies[method]

    def remedy(self):
        """Each remedy a team would try, run as its lines are written: the whole method lowered with them, saved,
        loaded from its file and run as the artifact is, against eager; each that passes timed against the shipped
        artifact; once one passes, not clearly slower than the latency gate's ratio, the options after it are
        listed, not tried (why_not_tried). The one chosen — of those that pass, the least slowdown (the first where
        none is timed); where none passes, the closest — keeps its outputs for the parent to judge against the
        reference as the gate does; the others stay as rows of what was tried. A method whose search found nothing
        to keep out (the budget stopped it, or no part was pinned) is then tried with the remedy that passes for
        another method (culprit.carried_over): its lines rewrite or partition the whole program, kind by kind."""
        remedies = remedy_trial.Remedies(self.model_dir, self.REMEDY_REPLACES)

        def keep(method: str, tried: list[dict[str, Any]], not_tried: Sequence[dict[str, str]] = (),
                 **found_in: str) -> None:
            chosen = cheapest(tried)
            self.remedies[method] = chosen["code"]
            remedies.add(method, chosen, **found_in, tried=[{k: v for k, v in t.items() if k != "outputs"}
                                                            for t in tried], not_tried=list(not_tried))

        search = self.log.results["search"]
        for method, finding in search.items():
            if not finding.get("culprits"):
                continue
            tried: list[dict[str, Any]] = []
            not_tried: list[dict[str, str]] = []
            for number, (what, code, fallback) in enumerate(self.remedy_options(method)):
                if reason := why_not_tried(tried, fallback, self.job.get("max_slowdown")):
                    not_tried.append({"remedy": what, "reason": reason})
                else:
                    tried.append(self.try_remedy(method, number, what, code))
            keep(method, tried, not_tried)
        checked = remedies.rows
        for method, source in culprit.carried_over(search, checked).items():
            keep(method, [self.try_remedy(method, 0, checked[source]["remedy"], checked[source]["code"])],
                 found_in=source)
        return remedies.record("no culprit found")

    def task(self):
        """A generator's end-to-end loop (its greedy decode, models/case.py) run as the runtime phase runs the
        artifact's, with the chosen remedies' files in place of the shipped methods' and the others as shipped:
        the parent judges the remedy's token agreement with it as it judges the stack's (judge/_remedies.py)."""
        if self.case.task.drive is None:
            raise StageSkipped("no generation loop: the task is judged from the remedied artifact's outputs")
        chosen = {method: checked["file"] for method, checked in self.log.results["remedy"].items()
                  if checked.get("passes") and checked.get("file")}
        if not chosen:
            raise StageSkipped("no remedy passes against eager")
        shipped = {m: file for m, file in (self.job.get("artifacts") or {}).items() if m not in chosen}
        missing = sorted(set(self.case.entry_points()) - set(chosen) - set(shipped))
        if missing:
            raise StageSkipped(f"no artifact of {', '.join(missing)} to run the loop with")
        calls = load_methods(self.adapter, self.model_dir.parent, shipped)
        calls.update({m: (self.adapter.run, self.adapter.load(self.model_dir / file)) for m, file in chosen.items()})

        def call(name: str, *args: Any) -> list[Any]:
            run, program = calls[name]
            return flatten_outputs(run(program, args))

        return run_task(self.case, call, self.model_dir / REMEDY_TASK)

    def try_remedy(self, method: str, number: int, what: str, code: str) -> dict[str, Any]:
        """One remedy's lines run on the program as exported, then lowered, saved, loaded and run (``tried``)."""

        def its_code(_: None) -> dict[str, Any]:
            # A copy: a remedy's lines may rewrite the program in place, and the next remedy and the reproducer
            # start from the program as exported.
            scope: dict[str, Any] = {"program": self.remedy_start(method)}
            exec(compile(code, f"<remedy for {method}>", "exec"), scope)  # noqa: S102 - code we generated
            return scope

        # The first option where the report has always had it; the others beside it, numbered.
        return self.tried(method, [("its code", its_code), ("lowering", self.adapter.lower_with_remedy)],
                          name=f"{method}{f'-{number}' if number else ''}", remedy=what, code=code)

    def remedy_start(self, method: str) -> Any:
        """What a remedy's lines start from: a copy of the program as exported."""
        return copy.deepcopy(self.whole[method])

    TIMES_FAILING = False  # whether a remedy that does not pass against eager is timed all the same
    REMEDY_REPLACES = "lowering"  # its remedies bind the partitioner (remedy_trial.REPLACED_STEPS)
    UNTIMED = ""  # why no remedy of the phase is timed against the shipped artifact (there is none that runs)

    def tried(self, method: str, steps: Sequence[remedy_trial.Step], name: str = "", made: Any = None,
              untimed: str = "", **row: Any) -> dict[str, Any]:
        """``row`` (the remedy's lines, what they do) with how the program ``steps`` make from ``made`` fared, saved
        as ``name`` (else the method's), loaded and run (remedy_trial.run_trial): against eager (``judged``), timed
        against the shipped artifact where it passes or the phase times every remedy (``untimed``: why not at all),
        and its outputs; or the step it failed at, and the error."""
        _, inputs = self.log.results["build"]
        untimed = untimed or self.UNTIMED
        ran = remedy_trial.run_trial(self.adapter, steps, self.model_dir, name or method, inputs[method], made)
        if isinstance(ran, str):
            return {**row, "passes": False, "error": ran}
        judged = self.judged(method, ran.outputs)
        latency = ({"status": "not timed", "reason": untimed or "it does not pass against eager"}
                   if untimed or not (judged["passes"] or self.TIMES_FAILING) else
                   remedy_trial.timed_against_shipped(self.adapter, self.job, method, inputs[method], ran.program))
        return {**row, **judged, "outputs": ran.outputs, "file": ran.file, "bytes": ran.bytes,
                "sha256": ran.sha256, "latency": latency}

    def judged(self, method: str, outputs: Any) -> dict[str, Any]:
        """A remedy's outputs against eager, as the gate measures them."""
        error = self.error_against_eager(flat(outputs), method)
        return {"rel_l2": error, "passes": error <= self.threshold_of(method)}


def run_diagnose_phase(job: dict[str, Any], adapter: Adapter, log: PhaseLog) -> None:
    """The operators behind an artifact that departs from eager (the worker's ``diagnose`` with no ``search``)."""
    DiagnosePhase(job, adapter, log).run_stages()
