"""The runtime phase in a stack's worker: load the saved artifacts, run them on the same inputs, check
their outputs against the eager ones, profile — one method per stage (PhaseLog in phases.py records each)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .common import (
    artifact_path,
    build_case,
    fixture_inputs,
    flatten_outputs,
    load_npz_tensors,
    named_like_reference,
    named_outputs,
)
from .contract import (
    Adapter,
    MultiMethod,
    ProfilerCheck,
    Profiles,
    require,
    require_whole,
)
from .phases import (
    PROGRAM,
    PhaseLog,
    StageSkipped,
    check_like_reference,
    method_outputs,
    run_task,
    save_arrays,
)


def export_stages(model_dir: Path) -> dict[str, dict[str, Any]]:
    """The export phase's stage records by name (none if it left no record)."""
    try:
        record = json.loads((model_dir / "export.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {s["stage"]: s for s in record.get("stages", [])}


class RuntimePhase:
    """The runtime phase, one method per stage: inputs → load → run [→ program-run] [→ task] → profile —
    an app that has only the artifacts: do they load, run, and give outputs like the eager model's?"""

    def __init__(self, job: dict[str, Any], adapter: Adapter, log: PhaseLog) -> None:
        self.job, self.adapter, self.log = job, adapter, log
        self.model_dir, self.adapter_name = Path(job["model_dir"]), job["adapter"]
        if isinstance(adapter, Adapter):  # else the load stage names what it lacks
            adapter.set_threads(job["threads"])
        # What the export phase built: the methods to load and whether the task has a loop.
        stages = export_stages(self.model_dir)
        self.built = stages.get("build", {}).get("details", {})
        self.has_program = "program" in stages
        self.saved = stages.get("save", {}).get("status") == "ok"
        self.methods = self.built.get("methods") or ["forward"]

    def run_stages(self) -> None:
        self.log.stage("inputs", (), self.inputs)
        self.log.stage("load", (), self.load)
        self.log.stage("run", ("load", "inputs"), self.run)
        if self.has_program:
            self.log.stage("program-run", ("run",), self.program_run)
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
        programs = {}
        for name in self.methods:
            path = artifact_path(self.model_dir, name, self.adapter)
            if not path.is_file():
                raise StageSkipped(f"no artifact {path.name}: the export phase did not write one")
            programs[name] = self.adapter.load(path)
        return programs, None

    def run(self):
        programs, args = self.log.results["load"], self.log.results["inputs"]
        named = {name: named_outputs(self.adapter.run(programs[name], args[name])) for name in self.methods}
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
        programs = self.log.results["load"]

        def call(name: str, *args: Any) -> list[Any]:
            return flatten_outputs(self.adapter.run(programs[name], args))

        return run_task(case, call, self.model_dir / "artifact-task.npz")

    def program_run(self):
        # The multi-method artifact must give what the per-method ones give.
        import torch

        path = artifact_path(self.model_dir, PROGRAM, self.adapter)
        if not path.is_file():
            raise StageSkipped(f"no {path.name}: the export phase did not write one")
        require_whole(self.adapter, MultiMethod, self.adapter_name)
        assert isinstance(self.adapter, MultiMethod)  # the export phase wrote a program
        loaded, args = self.adapter.load(path), self.log.results["inputs"]
        differences = {}
        for name in self.methods:
            outputs = flatten_outputs(self.adapter.run_method(loaded, name, args[name]))
            expected = self.log.results["run"][name]
            if len(outputs) != len(expected) or any(a.shape != b.shape for a, b in zip(outputs, expected)):
                raise ValueError(f"{path.name}: method {name} gives other outputs than {name}{self.adapter.SUFFIX}")
            differences[name] = max(float((a - b).abs().max()) for a, b in zip(outputs, expected))
            if not all(torch.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(outputs, expected)):
                raise ValueError(f"{path.name}: method {name} differs from {name}{self.adapter.SUFFIX} "
                                 f"by up to {differences[name]:.3g}")
        return True, {"file": path.name, "max_abs_difference": differences}

    def profile(self):
        # Where the time goes, operator by operator, in the stack's own runtime.
        if not self.job["profile_runs"]:
            raise StageSkipped("turned off (profile = false)")
        if not isinstance(self.adapter, Profiles):
            raise StageSkipped("this stack's self.adapter has no per-operator profiler")
        # profiler_missing is optional: without it the machine lacks nothing.
        missing = self.adapter.profiler_missing() if isinstance(self.adapter, ProfilerCheck) else None
        if missing:
            raise StageSkipped(missing)
        args = self.log.results["inputs"]
        return True, {"runs": self.job["profile_runs"], "methods": {
            name: self.adapter.profile(artifact_path(self.model_dir, name, self.adapter), args[name],
                                       self.job["profile_runs"])
            for name in self.methods}}


def run_runtime_phase(job: dict[str, Any], adapter: Adapter, log: PhaseLog) -> None:
    RuntimePhase(job, adapter, log).run_stages()
