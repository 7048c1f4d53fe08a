"""The runtime phase in a stack's worker: load the saved artifacts, run them on the same inputs, check
their outputs against the eager ones, profile — one method per stage (PhaseLog in phases.py records each)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .common import (
    build_case,
    export_stages,
    fixture_inputs,
    flatten_outputs,
    is_program,
    load_methods,
    load_npz_tensors,
    named_like_reference,
    named_outputs,
    runtime_said,
    saved_files,
)
from .contract import (
    Adapter,
    MultiMethod,
    ProfilerCheck,
    Profiles,
    WritesExportScript,
    require,
    require_whole,
)
from .phases import (
    PhaseLog,
    StageSkipped,
    check_like_reference,
    method_outputs,
    run_task,
    save_arrays,
)


class RuntimePhase:
    """The runtime phase, one method per stage: inputs → load → run [→ task] → profile — an app that has
    only the artifacts: do they load, run, and give outputs like the eager model's? A multi-method
    program is loaded once and each method run from it, as an app does."""

    def __init__(self, job: dict[str, Any], adapter: Adapter, log: PhaseLog) -> None:
        self.job, self.adapter, self.log = job, adapter, log
        self.model_dir, self.adapter_name = Path(job["model_dir"]), job["adapter"]
        if isinstance(adapter, Adapter):  # else the load stage names what it lacks
            adapter.set_threads(job["threads"])
        # What the export phase built: the methods to load, their files, and whether the task has a loop.
        stages = export_stages(self.model_dir)
        self.built = stages.get("build", {}).get("details", {})
        self.saved = stages.get("save", {}).get("status") == "ok"
        self.files = saved_files(stages)
        self.methods = self.built.get("methods") or ["forward"]

    def run_stages(self) -> None:
        self.log.stage("inputs", (), self.inputs)
        self.log.stage("load", (), self.load)
        self.log.stage("run", ("load", "inputs"), self.run)
        if self.built.get("task") == "generation":
            self.log.stage("task", ("load",), self.task)
        self.log.stage("profile", ("run",), self.profile)
        self.log.finish()

    def inputs(self):
        return fixture_inputs(Path(self.job["fixtures_dir"]), self.methods), None

    def load(self):
        require(self.adapter, self.adapter_name)
        if not self.saved:
            raise StageSkipped("no verified artifact: the export phase's save stage did not succeed")
        files = {name: self.files.get(name, "") for name in self.methods}
        for name, file in files.items():
            if not file or not (self.model_dir / file).is_file():
                raise StageSkipped(f"no artifact {file or 'for ' + name}: the export phase did not write one")
        if any(is_program(file) for file in files.values()):
            require_whole(self.adapter, MultiMethod, self.adapter_name)
        loaded = load_methods(self.adapter, self.model_dir, files)
        return loaded, {"files": sorted(set(files.values())), **self.signatures(loaded)}

    def signatures(self, loaded: dict[str, Any]) -> dict[str, Any]:
        """Each method's inputs and outputs as the artifact's metadata says them (the migration's app-side code),
        where the adapter reads them; one it cannot read is said, and the load stands."""
        if not isinstance(self.adapter, WritesExportScript):
            return {}
        try:
            return {"signatures": {name: self.adapter.method_signature(program, name)
                                   for name, (_, program) in loaded.items()}}
        except Exception as failure:  # noqa: BLE001 - recorded: the migration says why it has no signature
            return {"signatures_error": f"{type(failure).__name__}: {failure}"}

    def call(self, name: str, args: tuple[Any, ...]) -> Any:
        run, program = self.log.results["load"][name]
        return run(program, args)

    def run(self):
        args = self.log.results["inputs"]
        # What the runtime says while a method fails, caught once for the stage, not around every call.
        named = runtime_said(lambda: {name: named_outputs(self.call(name, args[name])) for name in self.methods})
        reference = self.model_dir / "eager.npz"
        expected = load_npz_tensors(reference) if reference.is_file() else None
        if expected is not None:
            named = {name: named_like_reference(name, outputs, expected) for name, outputs in named.items()}
        details = save_arrays(self.model_dir / "artifact.npz", method_outputs(named))
        if expected is not None:
            check_like_reference(method_outputs(named), expected)
            details["checked_against"] = reference.name
        return {name: [t for _, t in outputs] for name, outputs in named.items()}, details

    def task(self):
        # The loop lives in the model's code, so the factory runs again here;
        # its modules are not used, only its prompts and decoding.
        case = build_case(self.job)

        def call(name: str, *args: Any) -> list[Any]:
            return flatten_outputs(self.call(name, args))

        return runtime_said(run_task, case, call, self.model_dir / "artifact-task.npz")

    def profile(self):
        # Where the time goes, operator by operator, in the stack's own runtime.
        if not self.job["profile_runs"]:
            raise StageSkipped("turned off (profile = false)")
        profiler = self.adapter
        if not isinstance(profiler, Profiles):
            raise StageSkipped("this stack's adapter has no per-operator profiler")
        # profiler_missing is optional: without it the machine lacks nothing.
        missing = self.adapter.profiler_missing() if isinstance(self.adapter, ProfilerCheck) else None
        if missing:
            raise StageSkipped(missing)
        args, runs = self.log.results["inputs"], self.job["profile_runs"]

        def profiled(name: str) -> dict[str, Any]:
            file = self.files[name]
            # Only a MultiMethod adapter makes programs, and only its profile takes method=.
            by_method = {"method": name} if is_program(file) else {}
            return profiler.profile(self.model_dir / file, args[name], runs, **by_method)

        return True, {"runs": runs, "methods": {name: profiled(name) for name in self.methods}}


def run_runtime_phase(job: dict[str, Any], adapter: Adapter, log: PhaseLog) -> None:
    RuntimePhase(job, adapter, log).run_stages()
