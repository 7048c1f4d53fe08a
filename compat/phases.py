"""The worker's two phases for one model in one stack, each in a fresh process:

* ``export``  — build → eager [→ eager-task] [→ quantize] → export [→ localize] → save [→ program] [→ backends]
* ``runtime`` — inputs → load → run [→ program-run] [→ task] → profile, like an app that only has the artifacts

``eager-task`` and ``task`` run a generation loop (greedy decoding) for models
that have one; ``program`` writes every method into one multi-method artifact
where the stack has them, and ``program-run`` checks it gives what the
per-method artifacts give.

Every stage leaves a record (status, duration, error with traceback tail). A
stage that raises is recorded and the stages that depend on it are skipped; the
phase file is rewritten after every stage, so a crash or a kill leaves the
stages that finished and names the one that was running.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .common import (
    RECORDS_VERSION,
    artifact_path,
    build_case,
    error_record,
    fixture_inputs,
    flatten_outputs,
    load_case,
    load_npz_tensors,
    named_like_reference,
    named_outputs,
    peak_rss_bytes,
    sha256_file,
    write_json_atomic,
)
from .contract import (
    Adapter,
    MultiMethod,
    OtherBackends,
    ProfilerCheck,
    Profiles,
    Quantizes,
    claims,
    require,
    require_whole,
)


class StageSkipped(Exception):
    """A stage could not start because a stage it needs did not succeed."""


class PhaseLog:
    """The stage records of one phase, persisted after every change."""

    def __init__(self, path: Path, job: dict[str, Any], phase: str) -> None:
        self.path = path
        self.data: dict[str, Any] = {
            "schema_version": RECORDS_VERSION,
            "phase": phase,
            "stack": job["stack"],
            "model": job["model"],
            "pid": os.getpid(),
            "stages": [],
            "facts": {},
        }
        self.results: dict[str, Any] = {}
        self._save()

    def stage(self, name: str, needs: tuple[str, ...], func: Callable[[], Any]) -> Any:
        """Run one stage and record its outcome; return its value or None."""
        # started_at (wall clock) is what the parent measures this stage's deadline from.
        record: dict[str, Any] = {"stage": name, "status": "running", "duration_s": 0.0, "started_at": time.time()}
        self.data["stages"].append(record)
        missing = [n for n in needs if n not in self.results]
        if missing:
            record.update(status="skipped", reason=f"needs {', '.join(missing)}")
            self._save()
            return None
        self._save()
        start = time.perf_counter()
        try:
            value, details = func()
        except StageSkipped as why:
            record.update(status="skipped", reason=str(why), duration_s=time.perf_counter() - start)
            self._save()
            return None
        except Exception as error:  # noqa: BLE001 - every failure becomes a record
            record.update(status="failed", duration_s=time.perf_counter() - start, error=error_record(error))
            self._save()
            return None
        record.update(status="ok", duration_s=time.perf_counter() - start)
        if details:
            record["details"] = details
        self.results[name] = value
        self._save()
        return value

    def finish(self, **facts: Any) -> None:
        self.data["facts"].update(facts)
        self.data["facts"]["peak_rss_bytes"] = peak_rss_bytes()
        self.data["complete"] = True
        self._save()

    def _save(self) -> None:
        write_json_atomic(self.path, self.data)



# -- tensors in and out --------------------------------------------------------


def save_arrays(path: Path, arrays: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    arrays = {k: v.detach().cpu().contiguous().numpy() if hasattr(v, "detach") else v for k, v in arrays.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.npz")
    try:
        np.savez(tmp, **arrays)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # a full disk leaves no half file behind
    return {
        "file": path.name,
        "outputs": [{"name": k, "shape": list(a.shape), "dtype": str(a.dtype)} for k, a in arrays.items()],
    }


def method_outputs(per_method: dict[str, list[tuple[str, Any]]]) -> dict[str, Any]:
    """``{"prefill.output_0": tensor, "forward.output_0[logits]": …}``: one flat namespace for
    every method's named outputs (``named_outputs``)."""
    return {f"{method}.{name}": t for method, named in per_method.items() for name, t in named}


def check_like_reference(outputs: dict[str, Any], reference: dict[str, Any]) -> None:
    """An artifact that runs must give what its eager model gives: the same
    outputs by name, shape and dtype, and no NaN or Inf where eager has none."""
    import torch

    missing, extra = sorted(set(reference) - set(outputs)), sorted(set(outputs) - set(reference))
    if missing or extra:
        raise ValueError(f"the artifact's outputs are not the eager model's: missing {missing or 'none'}, "
                         f"unexpected {extra or 'none'}")
    for name, expected in reference.items():
        got = outputs[name]
        if tuple(got.shape) != tuple(expected.shape) or got.dtype != expected.dtype:
            raise ValueError(f"{name}: the artifact gives {got.dtype} {tuple(got.shape)}, "
                             f"the eager model {expected.dtype} {tuple(expected.shape)}")
        if got.is_floating_point():
            bad = ~torch.isfinite(got) & torch.isfinite(expected)
            if bool(bad.any()):
                raise ValueError(f"{name}: {int(bad.sum())} of {got.numel()} values are NaN or Inf "
                                 "where the eager model's are finite")


def run_task(case: Any, call: Callable[..., list[Any]], path: Path) -> tuple[bool, dict[str, Any]]:
    """A generation task's end-to-end loop; its tokens and logits go to ``path``."""
    import torch

    result = case.task.drive(call)
    tokens = [list(map(int, seq)) for seq in result["tokens"]]
    steps = max((len(seq) for seq in tokens), default=0)
    padded = torch.full((len(tokens), steps), -1, dtype=torch.int64)
    for row, seq in enumerate(tokens):
        padded[row, : len(seq)] = torch.tensor(seq, dtype=torch.int64)
    save_arrays(path, {"tokens": padded, "step_logits": result["step_logits"].float()})
    return True, {"file": path.name, "prompts": list(result.get("prompts", [])), "tokens": tokens,
                  "text": list(result["text"])}


# -- the phases ----------------------------------------------------------------


# The multi-method artifact's stem; a method may not take this name.
PROGRAM = "program"
# The float model's variant; a quantized variant runs the adapter's quantize() first.
FP32 = "fp32"


def _failed(log: PhaseLog, stage: str) -> bool:
    return any(r["stage"] == stage and r["status"] == "failed" for r in log.data["stages"])


def written_artifact(path: Path) -> dict[str, Any]:
    """The file an exporter wrote: name, size, SHA-256. An exporter can
    "succeed" and leave an empty file (seed 000: OOM during partitioning left a
    0-byte .pte); only a non-empty file counts."""
    if not path.is_file():
        raise FileNotFoundError(f"exporter wrote no artifact at {path}")
    size = path.stat().st_size
    if size == 0:
        raise ValueError(f"exporter wrote an empty artifact ({path.name}: 0 bytes)")
    return {"file": path.name, "bytes": size, "sha256": sha256_file(path)}


@contextlib.contextmanager
def partial_file(path: Path) -> Iterator[Path]:
    """A name to write ``path`` under, renamed to it only when the writer returns:
    a writer killed midway leaves no truncated artifact behind (and a run that stops
    removes these names: upgrade_gate.run.pipeline.stop_writers)."""
    partial = path.with_name(f".{path.stem}.partial{path.suffix}")
    partial.unlink(missing_ok=True)
    try:
        yield partial
        if partial.exists():  # a writer that wrote nothing is caught by written_artifact
            os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def run_export_phase(job: dict[str, Any], adapter: Adapter, log: PhaseLog) -> None:
    import torch

    model_dir, name_of_adapter = Path(job["model_dir"]), job["adapter"]
    variant = job.get("variant", FP32)
    exporting: dict[str, str] = {}  # the method being exported, for localize
    torch.set_num_threads(job["threads"])

    def build():
        case, inputs, hashes = load_case(job)
        return (case, inputs), {
            "fixtures": hashes,
            "parameters": sum(p.numel() for p in case.module.parameters()),
            "methods": list(inputs),
            "task": case.task.kind,
            # The part of an output a later call reads, where it is not all of it (models/case.py Method).
            "read_extents": {f"{name}.output_{index}": list(extent) for name, method in case.entry_points().items()
                             for index, extent in method.read_extents.items()},
        }

    def eager():
        case, inputs = log.results["build"]
        methods = case.entry_points()
        with torch.no_grad():
            outputs = {name: named_outputs(methods[name].module(*inputs[name])) for name in methods}
        return outputs, save_arrays(model_dir / "eager.npz", method_outputs(outputs))

    def eager_task():
        case, _ = log.results["build"]
        methods = case.entry_points()

        def call(name: str, *args: Any) -> list[Any]:
            with torch.no_grad():
                return flatten_outputs(methods[name].module(*args))

        return run_task(case, call, model_dir / "eager-task.npz")

    def quantize():
        # Every method calibrated on its own inputs: the same in every stack.
        case, inputs = log.results["build"]
        require_whole(adapter, Quantizes, name_of_adapter)
        recipes = adapter.QUANTIZATIONS if isinstance(adapter, Quantizes) else {}
        if variant not in recipes:
            raise StageSkipped(f"this stack has no {variant} recipe (it offers: {', '.join(recipes) or 'none'})")
        assert isinstance(adapter, Quantizes)
        quantized, details = {}, {}
        for name, method in case.entry_points().items():
            start = time.perf_counter()
            quantized[name], details[name] = adapter.quantize(method.module, inputs[name], variant)
            details[name]["seconds"] = round(time.perf_counter() - start, 3)
        # A variant whose recipe found nothing to quantize would be judged as the float model.
        counts = [d.get("quantized_modules", d.get("quantize_nodes")) for d in details.values()]
        if counts and all(c == 0 for c in counts):
            raise ValueError(f"{recipes[variant]}: quantized nothing in any method (no module or operator it "
                             "takes); the artifact would be the float model")
        return quantized, {"variant": variant, "recipe": recipes[variant], "methods": details}

    def export():
        require(adapter, name_of_adapter)
        case, inputs = log.results["build"]
        modules = log.results["quantize"] if variant != FP32 else {n: m.module for n, m in case.entry_points().items()}
        # Lowered programs are kept only for the multi-method artifact: each can
        # hold a copy of the weights (a 1B model's would not fit twice).
        keep = multi_method(case) and isinstance(adapter, MultiMethod)
        lowered, details = {}, {}
        for name, module in modules.items():
            exporting["method"] = name
            path = artifact_path(model_dir, name, adapter)
            start = time.perf_counter()
            with torch.no_grad():
                program, details[name] = adapter.lower(module, inputs[name])
            with partial_file(path) as partial:
                details[name].update(adapter.save(program, partial, keep=keep) or {})
            if keep:
                lowered[name] = program
            # TorchScript modules hold reference cycles: free this method's
            # copies of the weights before the next method makes its own.
            del program
            gc.collect()
            details[name]["seconds"] = round(time.perf_counter() - start, 3)
        return lowered, {"methods": details}

    def localize():
        # Which submodules fail to export on their own, with their real inputs.
        if not job["localize_budget_s"]:
            raise StageSkipped("turned off (localize-budget = 0)")
        if not isinstance(adapter, Adapter):
            raise StageSkipped("the adapter does not keep the contract (the export stage names what it lacks)")
        case, inputs = log.results["build"]
        from . import localize as localizer
        error = next(r["error"] for r in log.data["stages"] if r["stage"] == "export")
        # The export stopped at its first failing method: that one is searched.
        name = exporting["method"]
        method = case.entry_points()[name]
        found = localizer.localize(method.module, inputs[name], adapter.lower, error=error,
                                   budget_s=job["localize_budget_s"])
        return True, {"method": name, **found}

    def multi_method(case: Any) -> bool:
        return case.multi_method_artifact and len(case.entry_points()) > 1

    def save():
        case, _ = log.results["build"]
        files = {name: written_artifact(artifact_path(model_dir, name, adapter)) for name in case.entry_points()}
        return True, {"bytes": sum(f["bytes"] for f in files.values()), "methods": files}

    def program():
        require_whole(adapter, MultiMethod, name_of_adapter)
        path = artifact_path(model_dir, PROGRAM, adapter)
        start = time.perf_counter()
        with partial_file(path) as partial:
            assert isinstance(adapter, MultiMethod)  # whole, and claimed (the stage runs)
            planned = adapter.save_program(log.results["export"], partial) or {}
        return True, {**written_artifact(path), "methods": list(log.results["export"]),
                      "seconds": round(time.perf_counter() - start, 3), **planned}

    def backends():
        # Export only: does the float model lower to the stack's other backends?
        if not job["backends_budget_s"]:
            raise StageSkipped("turned off (backends-budget = 0)")
        require_whole(adapter, OtherBackends, name_of_adapter)
        assert isinstance(adapter, OtherBackends)  # whole, and claimed (the stage runs)
        case, inputs = log.results["build"]
        start = time.monotonic()
        found: dict[str, dict[str, Any]] = {}
        for backend in adapter.OTHER_BACKENDS:
            found[backend] = {}
            # A backend the stack lacks is named so whatever the budget: it costs nothing to ask.
            missing = adapter.backend_unavailable(backend)
            for name, method in case.entry_points().items():
                if missing:
                    found[backend][name] = {"status": "unavailable", "reason": missing}
                elif time.monotonic() - start > job["backends_budget_s"]:
                    budget = f"past the {job['backends_budget_s']:g} s budget (backends-budget)"
                    found[backend][name] = {"status": "not tried", "reason": budget}
                else:
                    found[backend][name] = adapter.export_only(backend, method.module, inputs[name])
                    gc.collect()
        return True, {"backends": found, "seconds": round(time.monotonic() - start, 3)}

    built = log.stage("build", (), build)
    log.stage("eager", ("build",), eager)
    if built is not None and built[0].task.drive is not None:
        log.stage("eager-task", ("build",), eager_task)
    if variant != FP32:
        log.stage("quantize", ("build",), quantize)
    exported = log.stage("export", ("build",) if variant == FP32 else ("quantize",), export)
    # A float model that does not export: find the submodules that fail alone.
    # (A quantized variant's failure is its recipe's; its float model is localized.)
    if exported is None and variant == FP32 and built is not None and _failed(log, "export"):
        log.stage("localize", ("build",), localize)
    log.stage("save", ("export",), save)
    # A capability the adapter has in part runs its stage, which names what it lacks.
    if built is not None and multi_method(built[0]) and claims(adapter, MultiMethod):
        log.stage("program", ("save",), program)
    if variant == FP32 and claims(adapter, OtherBackends):
        log.stage("backends", ("build",), backends)
    log.finish(torch_threads=torch.get_num_threads())


def export_stages(model_dir: Path) -> dict[str, dict[str, Any]]:
    """The export phase's stage records by name (none if it left no record)."""
    try:
        record = json.loads((model_dir / "export.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {s["stage"]: s for s in record.get("stages", [])}


def run_runtime_phase(job: dict[str, Any], adapter: Adapter, log: PhaseLog) -> None:
    model_dir, name_of_adapter = Path(job["model_dir"]), job["adapter"]
    if isinstance(adapter, Adapter):  # else the load stage names what it lacks
        adapter.set_threads(job["threads"])
    # What the export phase built: the methods to load and whether the task has a loop.
    stages = export_stages(model_dir)
    built = stages.get("build", {}).get("details", {})
    has_program = "program" in stages
    saved = stages.get("save", {}).get("status") == "ok"
    methods = built.get("methods") or ["forward"]

    def inputs():
        return fixture_inputs(Path(job["fixtures_dir"]), methods), None

    def load():
        require(adapter, name_of_adapter)
        if not saved:
            raise StageSkipped("no verified artifact: the export phase's save stage did not succeed")
        programs = {}
        for name in methods:
            path = artifact_path(model_dir, name, adapter)
            if not path.is_file():
                raise StageSkipped(f"no artifact {path.name}: the export phase did not write one")
            programs[name] = adapter.load(path)
        return programs, None

    def run():
        programs, args = log.results["load"], log.results["inputs"]
        named = {name: named_outputs(adapter.run(programs[name], args[name])) for name in methods}
        reference = model_dir / "eager.npz"
        expected = load_npz_tensors(reference) if reference.is_file() else None
        if expected is not None:
            named = {name: named_like_reference(name, outputs, expected) for name, outputs in named.items()}
        details = save_arrays(model_dir / "artifact.npz", method_outputs(named))
        if expected is not None:
            check_like_reference(method_outputs(named), expected)
            details["checked_against"] = reference.name
        return {name: [t for _, t in outputs] for name, outputs in named.items()}, details

    def task():
        # The loop lives in the model's code, so the factory runs again here;
        # its modules are not used, only its prompts and decoding.
        case = build_case(job)
        programs = log.results["load"]

        def call(name: str, *args: Any) -> list[Any]:
            return flatten_outputs(adapter.run(programs[name], args))

        return run_task(case, call, model_dir / "artifact-task.npz")

    def program():
        # The multi-method artifact must give what the per-method ones give.
        import torch

        path = artifact_path(model_dir, PROGRAM, adapter)
        if not path.is_file():
            raise StageSkipped(f"no {path.name}: the export phase did not write one")
        require_whole(adapter, MultiMethod, name_of_adapter)
        assert isinstance(adapter, MultiMethod)  # the export phase wrote a program
        loaded, args = adapter.load(path), log.results["inputs"]
        differences = {}
        for name in methods:
            outputs = flatten_outputs(adapter.run_method(loaded, name, args[name]))
            expected = log.results["run"][name]
            if len(outputs) != len(expected) or any(a.shape != b.shape for a, b in zip(outputs, expected)):
                raise ValueError(f"{path.name}: method {name} gives other outputs than {name}{adapter.SUFFIX}")
            differences[name] = max(float((a - b).abs().max()) for a, b in zip(outputs, expected))
            if not all(torch.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(outputs, expected)):
                raise ValueError(f"{path.name}: method {name} differs from {name}{adapter.SUFFIX} "
                                 f"by up to {differences[name]:.3g}")
        return True, {"file": path.name, "max_abs_difference": differences}

    def profile():
        # Where the time goes, operator by operator, in the stack's own runtime.
        if not job["profile_runs"]:
            raise StageSkipped("not asked for (the release explorer compares releases; `compare` profiles)")
        if not isinstance(adapter, Profiles):
            raise StageSkipped("this stack's adapter has no per-operator profiler")
        # profiler_missing is optional: without it the machine lacks nothing.
        missing = adapter.profiler_missing() if isinstance(adapter, ProfilerCheck) else None
        if missing:
            raise StageSkipped(missing)
        args = log.results["inputs"]
        return True, {"runs": job["profile_runs"], "methods": {
            name: adapter.profile(artifact_path(model_dir, name, adapter), args[name], job["profile_runs"])
            for name in methods}}

    log.stage("inputs", (), inputs)
    log.stage("load", (), load)
    log.stage("run", ("load", "inputs"), run)
    if has_program:
        log.stage("program-run", ("run",), program)
    if built.get("task") == "generation":
        log.stage("task", ("load",), task)
    log.stage("profile", ("run",), profile)
    log.finish()


