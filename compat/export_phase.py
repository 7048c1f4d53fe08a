"""The export phase in a stack's worker: build the model, run it eagerly, quantize, export, save —
one method per stage (PhaseLog in phases.py records each)."""

from __future__ import annotations

import gc
import shutil
import time
from pathlib import Path
from typing import Any

from .common import (
    PROGRAM,
    artifact_path,
    flatten_outputs,
    load_case,
    named_like_reference,
    named_outputs,
)
from .contract import (
    Adapter,
    Diagnoses,
    MultiMethod,
    OtherBackends,
    Quantizes,
    ReExports,
    ReproducesQuantizeFailures,
    WritesExportLines,
    WritesExportScript,
    claims,
    require,
    require_whole,
)
from .phases import (
    FP32,
    PhaseLog,
    StageSkipped,
    failed,
    method_outputs,
    partial_file,
    run_task,
    save_arrays,
    written_artifact,
)
from .search.export_errors import own_words

LOCALIZE = "localize"  # the phase's own folder (upgrade_gate.layout.LOCALIZE): a failed quantization's reproducer
NOTHING_QUANTIZED = "quantized nothing"  # the quantize stage's words where the recipe took no module
QUANTIZED_OUTPUTS = "quantized.npz"  # a variant's quantized methods run eagerly (schema/records.py reads it)


class ExportPhase:
    """The export phase, one method per stage: build → eager [→ eager-task] [→ quantize] → export
    [→ localize] → save [→ backends]. A stage reads what an earlier one returned from the phase log
    (``self.log.results``); ``run_stages`` decides which stages run."""

    def __init__(self, job: dict[str, Any], adapter: Adapter, log: PhaseLog) -> None:
        self.job, self.adapter, self.log = job, adapter, log
        self.model_dir, self.adapter_name = Path(job["model_dir"]), job["adapter"]
        self.variant = job.get("variant", FP32)
        self.working_on = ""  # the method being quantized or exported, for localize
        self.fell_back = ""  # why a recipe fell back to another before it quantized nothing

    def run_stages(self) -> None:
        import torch

        torch.set_num_threads(self.job["threads"])
        built = self.log.stage("build", (), self.build)
        self.log.stage("eager", ("build",), self.eager)
        if built is not None and built[0].task.drive is not None:
            self.log.stage("eager-task", ("build",), self.eager_task)
        if self.variant != FP32:
            quantized = self.log.stage("quantize", ("build",), self.quantize)
            # A variant whose recipe fails: find the submodules that fail to quantize alone.
            if quantized is None and built is not None and failed(self.log, "quantize"):
                self.log.stage("localize", ("build",), self.localize)
        exported = self.log.stage("export", ("build",) if self.variant == FP32 else ("quantize",), self.export)
        # A float model that does not export: find the submodules that fail alone.
        # (A quantized variant's export failure is its recipe's; its float model is localized.)
        if exported is None and self.variant == FP32 and built is not None and failed(self.log, "export"):
            self.log.stage("localize", ("build",), self.localize)
        self.log.stage("save", ("export",), self.save)
        if self.variant == FP32 and claims(self.adapter, OtherBackends):
            self.log.stage("backends", ("build",), self.backends)
        self.log.finish(torch_threads=torch.get_num_threads())

    def build(self):
        case, inputs, hashes = load_case(self.job)
        return (case, inputs), {
            "fixtures": hashes,
            "parameters": sum(p.numel() for p in case.module.parameters()),
            "methods": list(inputs),
            "task": case.task.kind,
            # The recipe as the team's export script writes it: recorded whether or not the export succeeds (a
            # failed one's script applies the export remedy the verdict judged).
            **self.export_script(list(inputs)),
            # The part of an output a later call reads, where it is not all of it (models/case.py Method).
            "read_extents": {f"{name}.output_{index}": list(extent) for name, method in case.entry_points().items()
                             for index, extent in method.read_extents.items()},
        }

    def eager(self):
        import torch

        case, inputs = self.log.results["build"]
        methods = case.entry_points()
        with torch.no_grad():
            outputs = {name: named_outputs(methods[name].module(*inputs[name])) for name in methods}
        return outputs, save_arrays(self.model_dir / "eager.npz", method_outputs(outputs))

    def eager_task(self):
        import torch

        case, _ = self.log.results["build"]
        methods = case.entry_points()

        def call(name: str, *args: Any) -> list[Any]:
            with torch.no_grad():
                return flatten_outputs(methods[name].module(*args))

        return run_task(case, call, self.model_dir / "eager-task.npz")

    def quantize(self):
        # Every method calibrated on its own inputs: the same in every stack.
        case, inputs = self.log.results["build"]
        require_whole(self.adapter, Quantizes, self.adapter_name)
        recipes = self.adapter.QUANTIZATIONS if isinstance(self.adapter, Quantizes) else {}
        if self.variant not in recipes:
            raise StageSkipped(f"this stack has no {self.variant} recipe (it offers: {', '.join(recipes) or 'none'})")
        assert isinstance(self.adapter, Quantizes)
        quantized, details = {}, {}
        for name, method in case.entry_points().items():
            self.working_on = name
            start = time.perf_counter()
            quantized[name], details[name] = self.adapter.quantize(method.module, inputs[name], self.variant)
            details[name]["seconds"] = round(time.perf_counter() - start, 3)
        # A variant whose recipe found nothing to quantize would be judged as the float model.
        counts = [d.get("quantized_modules", d.get("quantize_nodes")) for d in details.values()]
        if counts and all(c == 0 for c in counts):
            why = "; ".join(dict.fromkeys(d["static_failed"] for d in details.values() if d.get("static_failed")))
            self.fell_back = why  # the recipe's own path failed first (FX static): localize searches that
            raise ValueError(f"{recipes[self.variant]}: {NOTHING_QUANTIZED} in any method (no module or operator it "
                             "takes); the artifact would be the float model" + (f" — {why}" if why else ""))
        return quantized, {"variant": self.variant, "recipe": recipes[self.variant], "methods": details,
                           **self.quantized_outputs(quantized)}

    def quantized_outputs(self, quantized: dict[str, Any]) -> dict[str, Any]:
        """The quantized methods run eagerly, named as the eager outputs are: what the artifact's lowering is
        judged against (upgrade_gate.run.diagnosis), apart from what the quantization itself changes. A module
        that does not run eagerly is said, and the variant goes on (its artifact is what ships)."""
        import torch

        _, inputs = self.log.results["build"]
        names = {f"{method}.{name}": None for method, named in self.log.results.get("eager", {}).items()
                 for name, _ in named}
        try:
            with torch.no_grad():
                ran = {name: named_like_reference(name, named_outputs(module(*inputs[name])), names)
                       for name, module in quantized.items()}
        except Exception as failure:  # noqa: BLE001 - recorded: no attribution, the export goes on
            return {"outputs_error": f"{type(failure).__name__}: {' '.join(str(failure).split())[:300]}"}
        return {"outputs": save_arrays(self.model_dir / QUANTIZED_OUTPUTS, method_outputs(ran))["file"]}

    def export(self):
        import torch

        require(self.adapter, self.adapter_name)
        case, inputs = self.log.results["build"]
        modules = (self.log.results["quantize"] if self.variant != FP32
                   else {n: m.module for n, m in case.entry_points().items()})
        one_program = self.one_program(case)
        lowered, details = {}, {}
        for name, module in modules.items():
            self.working_on = name
            start = time.perf_counter()
            with torch.no_grad():
                program, details[name] = self.adapter.lower(module, inputs[name])
            if one_program:
                lowered[name] = program  # saved together below: the shared weights once
            else:
                with partial_file(artifact_path(self.model_dir, name, self.adapter)) as partial:
                    details[name].update(self.adapter.save(program, partial) or {})
            # TorchScript modules hold reference cycles: free this method's
            # copies of the weights before the next method makes its own.
            del program
            gc.collect()
            details[name]["seconds"] = round(time.perf_counter() - start, 3)
        if not one_program:
            return True, {"methods": details}
        start = time.perf_counter()
        assert isinstance(self.adapter, MultiMethod)  # one_program
        with partial_file(artifact_path(self.model_dir, PROGRAM, self.adapter)) as partial:
            written = self.adapter.save_program(lowered, partial) or {}
        return True, {"methods": details, "program": {**written, "seconds": round(time.perf_counter() - start, 3)}}

    def export_script(self, methods: list[str]) -> dict[str, Any]:
        """The recipe as a team's export script writes it (upgrade_gate.migrate), where the adapter writes one; a
        script it could not write is said, and the export stands."""
        try:
            if isinstance(self.adapter, WritesExportScript):
                return {"export_script": self.adapter.export_script(self.variant)}
            if isinstance(self.adapter, WritesExportLines):  # the legacy's, shown beside the candidate's script
                return {"export_lines": {name: self.adapter.export_lines(self.variant, f"{name}{self.adapter.SUFFIX}")
                                         for name in methods}}
        except Exception as failure:  # noqa: BLE001 - recorded: the migration says why it has no script
            return {"export_script_error": f"{type(failure).__name__}: {failure}"}
        return {}

    def localize(self):
        # Which submodules fail to quantize (or export) on their own, with their real inputs.
        if not self.job["localize_budget_s"]:
            raise StageSkipped("turned off (localize-budget = 0)")
        if not isinstance(self.adapter, Adapter):
            raise StageSkipped("the adapter does not keep the contract (the export stage names what it lacks)")
        case, inputs = self.log.results["build"]
        from .search import localize as localizer
        attempt = "quantize" if failed(self.log, "quantize") else "export"
        error = next(r["error"] for r in self.log.data["stages"] if r["stage"] == attempt)
        # The stage stopped at its first failing method: that one is searched.
        name = self.working_on
        module = case.entry_points()[name].module
        if attempt == "quantize" and NOTHING_QUANTIZED in error["message"] and not self.fell_back:
            # No submodule fails: the recipe takes none of the modules that hold the weights. Those are the answer,
            # the first of them as the reproducer (GPT-2's Conv1D).
            found = localizer.weights_not_taken(module)
            if found["culprits"] and isinstance(self.adapter, ReproducesQuantizeFailures):
                found["reproducer"] = self.localized_reproducer(name, module, inputs[name], found["culprits"][0],
                                                                attempt, nothing=True)
            return True, {"method": name, "attempt": attempt, **found}
        try_alone = self.quantize_alone if attempt == "quantize" else self.adapter.lower
        found = localizer.localize(module, inputs[name], try_alone, error=error, budget_s=self.job["localize_budget_s"],
                                   no_grad=attempt == "export")  # as each stage runs (quantize: the recipe's capture)
        if attempt == "quantize":
            localizer.name_nested_regions(found["culprits"], module, inputs[name])
        # Its first culprit as a reproducer: the recipe's (a recipe that raises), or the lowering's (regnet's block).
        reproduces = ReproducesQuantizeFailures if attempt == "quantize" else Diagnoses
        if found["culprits"] and isinstance(self.adapter, reproduces):
            found["reproducer"] = self.localized_reproducer(name, module, inputs[name], found["culprits"][0], attempt)
        return True, {"method": name, "attempt": attempt, **found}

    def localized_reproducer(self, method: str, module: Any, inputs: tuple[Any, ...], first: dict[str, Any],
                             attempt: str, *, nothing: bool = False) -> dict[str, Any]:
        """The first culprit (a submodule, or the method where none fails alone) as a standalone reproducer, run
        here as written: the recipe on it (``attempt`` quantize), or its exported program lowered (export) — where it
        does not export, its export — exit 1 while it raises as found. One that could not be written is said, and
        the localization stands."""
        from .search import issue_text
        from .search import localize as localizer

        path = "" if first["module"] == "(root)" else first["module"]
        target = localizer.capture_calls(module, inputs)[path] if path else module
        alone = target.inputs if path else inputs
        named = f"{path} ({first['class']})" if path else f"the whole method {method} ({first['class']})"
        folder = self.model_dir / LOCALIZE / "repro" / method
        folder.mkdir(parents=True, exist_ok=True)
        fails_with = " ".join(own_words(first["message"]).split())[:100]  # what the error raised says, not its causes
        try:
            if isinstance(self.adapter, ReproducesQuantizeFailures) and attempt == "quantize":
                self.adapter.quantize_reproducer(target, alone, folder, variant=self.variant, fails_with=fails_with,
                                                 found_in=f"{self.job['model']}'s {method}", named=named,
                                                 nothing=nothing)
                of = "quantize"
            elif (exported := self.exported_or_none(target, alone)) is None:
                # It does not export: its export is the reproducer, the module handed on whole with its call.
                assert isinstance(self.adapter, ReExports)  # exported_or_none said it has the capability
                args, kwargs = target.arguments(alone) if path else (alone, {})
                self.adapter.export_reproducer(target.inner if path else target, args, kwargs, folder,
                                               fails_with=fails_with, named=named,
                                               found_in=f"{self.job['model']}'s {method}")
                of = "export"
            else:
                assert isinstance(self.adapter, Diagnoses)  # localize checked it
                self.adapter.method_reproducer(
                    exported, alone, folder, kind="not pinned to an operator", threshold=self.job["max_rel_l2"],
                    remedy=self.adapter.remedy_options(exported, [])[-1][1], fails_with=fails_with, program=named,
                    found_in=f"{self.job['model']}'s {method}: {named} fails to lower alone")
                of = "lowering"
        except Exception as failure:  # noqa: BLE001 - recorded: the localization is the finding
            shutil.rmtree(folder)  # nothing half-written beside the "not written"
            return {"status": "not written", "why": f"{type(failure).__name__}: {' '.join(str(failure).split())[:300]}"}
        run = issue_text.run_reproducer(folder)
        return {"status": "written", "folder": folder.relative_to(self.model_dir).as_posix(), "module": named,
                "of": of, "runs": [run]}

    def exported_or_none(self, module: Any, inputs: tuple[Any, ...]) -> Any:
        """The program the lowering starts from; None where the export raises and the adapter writes an export's
        reproducer (ReExports), else what it raised."""
        assert isinstance(self.adapter, Diagnoses)  # localize checked it
        try:
            return self.adapter.lowering_parts(module, inputs)[0]
        except Exception:
            if isinstance(self.adapter, ReExports):
                return None
            raise

    def quantize_alone(self, module: Any, inputs: tuple[Any, ...]) -> Any:
        """The variant's recipe on one submodule: it fails where it raises, or where its own path failed and it fell
        back to another (the legacy's FX static to dynamic); one that finds nothing to quantize has not failed."""
        assert isinstance(self.adapter, Quantizes)  # the quantize stage required it
        quantized, details = self.adapter.quantize(module, inputs, self.variant)
        if details.get("static_failed"):
            raise RecipeFellBack(details["static_failed"])
        return quantized, details

    def one_program(self, case: Any) -> bool:
        """Every method in one multi-method artifact: the model has several and asks for one, and the stack
        makes them. A capability the adapter has in part fails the export, naming what it lacks."""
        if not (case.multi_method_artifact and len(case.entry_points()) > 1 and claims(self.adapter, MultiMethod)):
            return False
        require_whole(self.adapter, MultiMethod, self.adapter_name)
        return True

    def save(self):
        case, _ = self.log.results["build"]
        if self.one_program(case):
            program = written_artifact(artifact_path(self.model_dir, PROGRAM, self.adapter))
            return True, {"bytes": program["bytes"], "program": program["file"],
                          "methods": {name: program for name in case.entry_points()}}
        files = {name: written_artifact(artifact_path(self.model_dir, name, self.adapter))
                 for name in case.entry_points()}
        return True, {"bytes": sum(f["bytes"] for f in files.values()), "methods": files}

    def backends(self):
        # Export only: does the float model lower to the stack's other backends?
        if not self.job["backends_budget_s"]:
            raise StageSkipped("turned off (backends-budget = 0)")
        require_whole(self.adapter, OtherBackends, self.adapter_name)
        assert isinstance(self.adapter, OtherBackends)  # whole, and claimed (the stage runs)
        case, inputs = self.log.results["build"]
        start = time.monotonic()
        found: dict[str, dict[str, Any]] = {}
        for backend in self.adapter.OTHER_BACKENDS:
            found[backend] = {}
            # A backend the stack lacks is named so whatever the budget: it costs nothing to ask.
            missing = self.adapter.backend_unavailable(backend)
            for name, method in case.entry_points().items():
                if missing:
                    found[backend][name] = {"status": "unavailable", "reason": missing}
                elif time.monotonic() - start > self.job["backends_budget_s"]:
                    budget = f"past the {self.job['backends_budget_s']:g} s budget (backends-budget)"
                    found[backend][name] = {"status": "not tried", "reason": budget}
                else:
                    found[backend][name] = self.adapter.export_only(backend, method.module, inputs[name])
                    gc.collect()
        return True, {"backends": found, "seconds": round(time.monotonic() - start, 3)}


class RecipeFellBack(Exception):
    """A submodule its variant's recipe did not quantize as asked: it fell back to another (the error is why)."""


def run_export_phase(job: dict[str, Any], adapter: Adapter, log: PhaseLog) -> None:
    ExportPhase(job, adapter, log).run_stages()


