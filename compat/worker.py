"""Runs inside one stack's venv: builds a model, exports it, runs the artifact.

Needs nothing but the standard library and what the stack installs (torch,
numpy, the stack's runtime). The parent process starts it with a job file and
reads back JSON records and ``.npz`` tensors; nothing pickled crosses the
process boundary, because the two sides run different torch versions.

Each phase runs in a fresh process:

* ``export``  — build → eager [→ eager-task] → export → save [→ program]
* ``runtime`` — load → run [→ program-run] [→ task], like an app that only
  has the artifacts
* ``measure`` — a server for the parent's interleaved latency rounds: starts the
  runtime, loads the artifacts and runs each method once (cold start, memory),
  warms up, then times one round per request (upgrade_gate.measure)

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

import argparse
import contextlib
import ctypes
import gc
import hashlib
import importlib
import importlib.util
import json
import math
import os
import platform
import resource
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterator

SCHEMA_VERSION = "1.0"
TRACEBACK_TAIL_LINES = 12


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON so that readers see the old file or the new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.chmod(tmp, 0o644)  # mkstemp makes 0600
    with os.fdopen(fd, "w", encoding="utf-8") as stream:
        json.dump(_jsonable(data), stream, indent=2, allow_nan=False)
        stream.write("\n")
        stream.flush()
        os.fsync(stream.fileno())
    os.replace(tmp, path)


def _jsonable(value: Any) -> Any:
    # Non-finite floats are spelled "inf", "-inf", "nan": JSON has none. The
    # parent's upgrade_gate.atomic.to_json does the same; the worker cannot
    # import the parent's package, so the few lines stand twice.
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def sha256_file(path: Path) -> str:
    # The same as the parent's upgrade_gate.cache.sha256_file, which this side cannot import.
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def peak_rss_bytes() -> int:
    # ru_maxrss is in KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class StageSkipped(Exception):
    """A stage could not start because a stage it needs did not succeed."""


class PhaseLog:
    """The stage records of one phase, persisted after every change."""

    def __init__(self, path: Path, job: dict[str, Any], phase: str) -> None:
        self.path = path
        self.data: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
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
            record.update(
                status="failed",
                duration_s=time.perf_counter() - start,
                error={
                    "type": f"{type(error).__module__}.{type(error).__qualname__}",
                    "message": str(error)[:4000],
                    "traceback_tail": traceback.format_exc().splitlines()[-TRACEBACK_TAIL_LINES:],
                },
            )
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


# -- our packages, under names a user's project cannot shadow ------------------
#
# The worker runs as ``python -P compat/worker.py``: nothing of this repository
# is on sys.path, so a user's own package called ``models`` or ``compat`` (the
# project root is on sys.path for plugin factories) imports as theirs. Ours are
# loaded from their folders under private names.

REPO_ROOT = Path(__file__).resolve().parents[1]
COMPAT_PACKAGE = "upgrade_gate_compat"
MODELS_PACKAGE = "upgrade_gate_models"


def _register_package(alias: str, folder: Path) -> None:
    spec = importlib.util.spec_from_file_location(
        alias, folder / "__init__.py", submodule_search_locations=[str(folder)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[alias] = module
    spec.loader.exec_module(module)


def load_adapter(name: str) -> Any:
    """A module of compat/ by name, or a stack spec's own adapter file (a path
    ending in .py), which may build on ours: ``from upgrade_gate_compat import executorch_xnnpack``."""
    if not name.endswith(".py"):
        return importlib.import_module(f"{COMPAT_PACKAGE}.{name}")
    path = Path(name)
    spec = importlib.util.spec_from_file_location(f"{COMPAT_PACKAGE}_spec_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def die_with_parent() -> None:
    """SIGKILL this process when the thread that started it goes away (Linux):
    a ``kill -9`` of the run must not leave an export writing into its folder."""
    parent = os.environ.get("UPGRADE_GATE_PARENT_PID")
    if not parent or not sys.platform.startswith("linux"):
        return
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)
    if os.getppid() != int(parent):  # the parent died before the request took effect
        os._exit(1)


def import_factory(job: dict[str, Any]) -> Callable[[], Any]:
    """``module:function`` — a module of models/ for built-in models, an
    importable module of the user's project for theirs."""
    module_name, _, func_name = job["factory"].partition(":")
    if job.get("project_root"):
        sys.path.insert(0, job["project_root"])
    else:
        module_name = f"{MODELS_PACKAGE}.{module_name}"
    return getattr(importlib.import_module(module_name), func_name)


# -- tensors in and out --------------------------------------------------------


def flatten_outputs(value: Any) -> list[Any]:
    """Tensors of a model's output in a stable order (tuples, lists, dicts)."""
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for key in sorted(value) for t in flatten_outputs(value[key])]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in flatten_outputs(item)]
    raise TypeError(f"model output contains {type(value).__name__}, expected tensors")


def save_arrays(path: Path, arrays: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    arrays = {k: v.detach().cpu().contiguous().numpy() if hasattr(v, "detach") else v for k, v in arrays.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.npz")
    np.savez(tmp, **arrays)
    os.replace(tmp, path)
    return {
        "file": path.name,
        "outputs": [{"name": k, "shape": list(a.shape), "dtype": str(a.dtype)} for k, a in arrays.items()],
    }


def method_outputs(per_method: dict[str, list[Any]]) -> dict[str, Any]:
    """``{"prefill.output_0": tensor, …}``: one flat namespace for every method's outputs."""
    return {f"{name}.output_{i}": t for name, tensors in per_method.items() for i, t in enumerate(tensors)}


def load_npz_tensors(path: Path) -> dict[str, Any]:
    import numpy as np
    import torch

    with np.load(path, allow_pickle=False) as data:
        return {key: torch.from_numpy(data[key].copy()) for key in data.files}


def tensors_digest(tensors: dict[str, Any]) -> str:
    """SHA-256 over names, dtypes, shapes and bytes: equal digests, equal numbers."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        array = tensors[name].detach().cpu().contiguous().numpy()
        digest.update(f"{name}|{array.dtype.str}|{array.shape}|".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


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


# -- the case: the same weights and inputs in every stack ----------------------


def build_case(job: dict[str, Any]) -> Any:
    """Call the factory and check what it returned."""
    import torch

    case_module = importlib.import_module(f"{MODELS_PACKAGE}.case")
    factory = import_factory(job)
    torch.manual_seed(0)
    return case_module.as_case(factory(), factory=job["factory"])


def ensure_fixtures(case: Any, fixtures_dir: Path) -> None:
    """Save the inputs (and random weights) once; every stack loads the same files.

    Re-seeding is not enough: two torch versions need not draw the same numbers
    from the same seed. The first stack to get here writes the files into a
    temporary dir and renames it into place, so a concurrent or interrupted
    writer never leaves a half fixture.
    """
    import numpy as np

    if (fixtures_dir / "inputs.npz").is_file():
        return
    fixtures_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=fixtures_dir.parent, prefix=f".{fixtures_dir.name}."))
    if case.weights == "fixture":
        state = {k: v.detach().cpu().numpy() for k, v in case.module.state_dict().items()}
        np.savez(staging / "weights.npz", **state)
    inputs = {
        f"{name}.input_{i}": t.detach().cpu().numpy()
        for name, method in case.entry_points().items()
        for i, t in enumerate(method.inputs)
    }
    np.savez(staging / "inputs.npz", **inputs)
    try:
        os.rename(staging, fixtures_dir)
    except OSError:  # another stack won the race; use its files
        for leftover in staging.iterdir():
            leftover.unlink()
        staging.rmdir()


def fixture_inputs(fixtures_dir: Path, methods: list[str]) -> dict[str, tuple[Any, ...]]:
    tensors = load_npz_tensors(fixtures_dir / "inputs.npz")
    inputs = {}
    for name in methods:
        count = sum(1 for key in tensors if key.startswith(f"{name}.input_"))
        inputs[name] = tuple(tensors[f"{name}.input_{i}"] for i in range(count))
    return inputs


def load_case(job: dict[str, Any]) -> tuple[Any, dict[str, tuple[Any, ...]], dict[str, Any]]:
    """Build the model and give it the shared weights and inputs."""
    case = build_case(job)
    fixtures_dir = Path(job["fixtures_dir"])
    ensure_fixtures(case, fixtures_dir)
    if case.weights == "fixture":
        case.module.load_state_dict(load_npz_tensors(fixtures_dir / "weights.npz"), strict=True)
    case.module.eval()
    for method in case.entry_points().values():
        method.module.eval()
    inputs = fixture_inputs(fixtures_dir, list(case.entry_points()))
    hashes = {
        "weights": case.weights,
        "weights_sha256": tensors_digest(case.module.state_dict()),
        "inputs_sha256": tensors_digest({f"{m}.{i}": t for m, ts in inputs.items() for i, t in enumerate(ts)}),
    }
    return case, inputs, hashes


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


# -- phases ---------------------------------------------------------------------


# The multi-method artifact's stem; a method may not take this name.
PROGRAM = "program"
# The float model's variant; a quantized variant runs the adapter's quantize() first.
FP32 = "fp32"


def _failed(log: PhaseLog, stage: str) -> bool:
    return any(r["stage"] == stage and r["status"] == "failed" for r in log.data["stages"])


def artifact_path(model_dir: Path, method: str, adapter: Any) -> Path:
    return model_dir / f"{method}{adapter.SUFFIX}"


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
    a writer killed midway leaves no truncated artifact behind."""
    partial = path.with_name(f".{path.stem}.partial{path.suffix}")
    partial.unlink(missing_ok=True)
    try:
        yield partial
        if partial.exists():  # a writer that wrote nothing is caught by written_artifact
            os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def run_export_phase(job: dict[str, Any], adapter: Any, log: PhaseLog) -> None:
    import torch

    model_dir = Path(job["model_dir"])
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
        }

    def eager():
        case, inputs = log.results["build"]
        methods = case.entry_points()
        with torch.no_grad():
            outputs = {name: flatten_outputs(methods[name].module(*inputs[name])) for name in methods}
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
        recipes = getattr(adapter, "QUANTIZATIONS", {})
        if variant not in recipes:
            raise StageSkipped(f"this stack has no {variant} recipe (it offers: {', '.join(recipes) or 'none'})")
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
        case, inputs = log.results["build"]
        modules = log.results["quantize"] if variant != FP32 else {n: m.module for n, m in case.entry_points().items()}
        # Lowered programs are kept only for the multi-method artifact: each can
        # hold a copy of the weights (a 1B model's would not fit twice).
        keep = wants_program(case)
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
        case, inputs = log.results["build"]
        localizer = importlib.import_module(f"{COMPAT_PACKAGE}.localize")
        error = next(r["error"] for r in log.data["stages"] if r["stage"] == "export")
        # The export stopped at its first failing method: that one is searched.
        name = exporting["method"]
        method = case.entry_points()[name]
        found = localizer.localize(method.module, inputs[name], adapter.lower, error=error,
                                   budget_s=job["localize_budget_s"])
        return True, {"method": name, **found}

    def wants_program(case: Any) -> bool:
        return case.multi_method_artifact and len(case.entry_points()) > 1 and hasattr(adapter, "save_program")

    def save():
        case, _ = log.results["build"]
        files = {name: written_artifact(artifact_path(model_dir, name, adapter)) for name in case.entry_points()}
        return True, {"bytes": sum(f["bytes"] for f in files.values()), "methods": files}

    def program():
        path = artifact_path(model_dir, PROGRAM, adapter)
        start = time.perf_counter()
        with partial_file(path) as partial:
            planned = adapter.save_program(log.results["export"], partial) or {}
        return True, {**written_artifact(path), "methods": list(log.results["export"]),
                      "seconds": round(time.perf_counter() - start, 3), **planned}

    def backends():
        # Export only: does the float model lower to the stack's other backends?
        if not job["backends_budget_s"]:
            raise StageSkipped("turned off (backends-budget = 0)")
        case, inputs = log.results["build"]
        start, found = time.monotonic(), {}
        for backend in adapter.OTHER_BACKENDS:
            found[backend] = {}
            # A backend the stack lacks is named so whatever the budget: it costs nothing to ask.
            missing = adapter.backend_unavailable(backend)
            for name, method in case.entry_points().items():
                if missing:
                    found[backend][name] = {"status": "unavailable", "reason": missing}
                elif time.monotonic() - start > job["backends_budget_s"]:
                    found[backend][name] = {"status": "not tried",
                                            "reason": f"past the {job['backends_budget_s']:g} s budget (backends-budget)"}
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
    if built is not None and wants_program(built[0]):
        log.stage("program", ("save",), program)
    if variant == FP32 and hasattr(adapter, "OTHER_BACKENDS"):
        log.stage("backends", ("build",), backends)
    log.finish(torch_threads=torch.get_num_threads())


def export_stages(model_dir: Path) -> dict[str, dict[str, Any]]:
    """The export phase's stage records by name (none if it left no record)."""
    try:
        record = json.loads((model_dir / "export.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {s["stage"]: s for s in record.get("stages", [])}


def run_runtime_phase(job: dict[str, Any], adapter: Any, log: PhaseLog) -> None:
    model_dir = Path(job["model_dir"])
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
        outputs = {name: flatten_outputs(adapter.run(programs[name], args[name])) for name in methods}
        details = save_arrays(model_dir / "artifact.npz", method_outputs(outputs))
        reference = model_dir / "eager.npz"
        if reference.is_file():
            check_like_reference(method_outputs(outputs), load_npz_tensors(reference))
            details["checked_against"] = reference.name
        return outputs, details

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
        if not hasattr(adapter, "profile"):
            raise StageSkipped("this stack's adapter has no per-operator profiler")
        missing = getattr(adapter, "profiler_missing", lambda: None)()
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


# -- measure: the server behind upgrade_gate.measure ----------------------------
#
# One process per stack, model and thread count. The parent talks to it over
# two pipes (fds named in UPGRADE_GATE_CONTROL_FDS), one JSON object per line;
# stdout and stderr stay the log. Every step announces itself ("stage" events),
# so the parent can hold each to its deadline.

CONTROL_FDS_ENV = "UPGRADE_GATE_CONTROL_FDS"


def memory_status() -> dict[str, int]:
    """This process's resident memory now (VmRSS) and at its peak so far (VmHWM), in bytes."""
    found = {}
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                found[key] = int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return {"rss_bytes": found.get("VmRSS", 0), "peak_rss_bytes": found.get("VmHWM", peak_rss_bytes())}


def time_runs(run: Callable[[Any, Any], Any], program: Any, inputs: Any, runs: int) -> list[float]:
    """The harness: ``run(program, inputs)`` as a bare loop would call it, with
    one clock read before and after (its cost against the bare loop is
    benchmarked: docs/benchmarks.md)."""
    clock = time.perf_counter_ns
    samples = [0.0] * runs
    for index in range(runs):
        start = clock()
        run(program, inputs)
        samples[index] = (clock() - start) / 1e6
    return samples


def runs_per_round(job: dict[str, Any], warm_mean_ms: float) -> int:
    """``iterations`` spread over the rounds, or more when that is less than the time budget."""
    rounds = job["rounds"]
    by_count = math.ceil(job["iterations"] / rounds)
    by_time = math.ceil(job["time_budget_s"] * 1000.0 / rounds / max(warm_mean_ms, 1e-3))
    return int(min(max(by_count, by_time), job.get("max_runs_per_round", 100_000)))


class Channel:
    """Requests in, events out, one JSON object per line."""

    def __init__(self) -> None:
        read_fd, write_fd = (int(fd) for fd in os.environ[CONTROL_FDS_ENV].split(","))
        self.requests = os.fdopen(read_fd, "r", encoding="utf-8")
        self.events = os.fdopen(write_fd, "w", encoding="utf-8")

    def send(self, event: str, **data: Any) -> None:
        self.events.write(json.dumps(_jsonable({"event": event, **data})) + "\n")
        self.events.flush()

    def receive(self) -> dict[str, Any]:
        line = self.requests.readline()
        return json.loads(line) if line else {"command": "exit"}


def run_measure_server(job: dict[str, Any], adapter: Any, channel: Channel) -> None:
    model_dir, methods = Path(job["model_dir"]), job["methods"]
    adapter.set_threads(job["threads"])
    args = fixture_inputs(Path(job["fixtures_dir"]), methods)
    # "The same process doing nothing but starting the runtime": imports done,
    # threads set, inputs in memory; what loading and running adds is the model's.
    idle = memory_status()

    channel.send("stage", stage="load")
    start = time.perf_counter_ns()
    programs = {name: adapter.load(artifact_path(model_dir, name, adapter)) for name in methods}
    load_ms = (time.perf_counter_ns() - start) / 1e6
    first_ms = {}
    for name in methods:
        first_ms[name] = time_runs(adapter.run, programs[name], args[name], 1)[0]
    after_first = memory_status()

    channel.send("stage", stage="warm-up")
    warm_mean_ms, runs = {}, {}
    for name in methods:
        warm = time_runs(adapter.run, programs[name], args[name], job["warmup"])
        warm_mean_ms[name] = sum(warm) / len(warm)
        runs[name] = runs_per_round(job, warm_mean_ms[name])
    channel.send("ready", cold={"load_ms": load_ms, "first_ms": first_ms}, idle=idle, after_first_run=after_first,
                 warm_mean_ms=warm_mean_ms, runs_per_round=runs,
                 input_shapes={name: [list(t.shape) for t in args[name]] for name in methods})

    while (request := channel.receive())["command"] in ("round", "overhead"):
        channel.send("stage", stage="round")
        if request["command"] == "overhead":
            channel.send("overhead", blocks=harness_overhead(adapter, programs, args, warm_mean_ms, request["pairs"],
                                                             request["block_s"]))
            continue
        samples = {}
        for name in methods:
            adapter.run(programs[name], args[name])  # untimed: the other stack ran since this method's last call
            samples[name] = time_runs(adapter.run, programs[name], args[name], runs[name])
        channel.send("round", round=request["round"], samples_ms=samples)
    channel.send("exit", memory=memory_status())


def harness_overhead(adapter: Any, programs: dict[str, Any], args: dict[str, Any], warm_mean_ms: dict[str, float],
                     pairs: int, block_s: float) -> dict[str, list[dict[str, float]]]:
    """The benchmark of time_runs itself: pairs of blocks of the same calls,
    one through the harness and one in a bare loop, in alternating order;
    each block's wall time per call."""
    found: dict[str, list[dict[str, float]]] = {}
    for name, program in programs.items():
        count = max(5, math.ceil(block_s * 1000.0 / max(warm_mean_ms[name], 1e-3)))
        run, inputs = adapter.run, args[name]

        def through_harness() -> float:
            start = time.perf_counter_ns()
            time_runs(run, program, inputs, count)
            return (time.perf_counter_ns() - start) / 1e6 / count

        def bare() -> float:
            start = time.perf_counter_ns()
            for _ in range(count):
                run(program, inputs)
            return (time.perf_counter_ns() - start) / 1e6 / count

        for index in range(pairs):
            if index % 2:
                bare_ms, harness_ms = bare(), through_harness()
            else:
                harness_ms, bare_ms = through_harness(), bare()
            found.setdefault(name, []).append({"harness_ms": harness_ms, "bare_ms": bare_ms, "calls": count})
    return found


# -- probe ----------------------------------------------------------------------


def probe(distributions: list[str]) -> dict[str, Any]:
    """What is really installed in this stack, for the report's provenance."""
    from importlib import metadata

    versions = {}
    for name in distributions:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    import torch

    return {
        "schema_version": SCHEMA_VERSION,
        "python": platform.python_version(),
        "executable": sys.executable,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_version": torch.__version__,
        "torch_default_threads": torch.get_num_threads(),
        "distributions": versions,
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def check_factory(job: dict[str, Any]) -> dict[str, Any]:
    """Import and call a user's factory: does it give a model the tool can run?"""
    try:
        case = build_case(job)
        return {"ok": True, "methods": list(case.entry_points()), "task": case.task.kind}
    except Exception as error:  # noqa: BLE001 - reported to the user as a config error
        return {"ok": False, "error": f"{type(error).__name__}: {error}",
                "traceback_tail": traceback.format_exc().splitlines()[-TRACEBACK_TAIL_LINES:]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -P compat/worker.py")
    parser.add_argument("command", choices=("probe", "check", "export", "runtime", "measure"))
    parser.add_argument("job", type=Path, help="job JSON written by the parent")
    args = parser.parse_args(argv)
    die_with_parent()
    job = json.loads(args.job.read_text(encoding="utf-8"))
    _register_package(COMPAT_PACKAGE, REPO_ROOT / "compat")
    _register_package(MODELS_PACKAGE, REPO_ROOT / "models")
    if job.get("assets_dir"):
        os.environ["UPGRADE_GATE_ASSETS"] = job["assets_dir"]

    if args.command == "probe":
        write_json_atomic(Path(job["out"]), probe(job["distributions"]))
        return 0
    if args.command == "check":
        write_json_atomic(Path(job["out"]), {name: check_factory(entry) for name, entry in job["models"].items()})
        return 0

    adapter = load_adapter(job["adapter"])
    if args.command == "measure":
        channel = Channel()
        try:
            run_measure_server(job, adapter, channel)
        except Exception as error:  # noqa: BLE001 - the parent records it on the stack's measurement
            channel.send("error", type=f"{type(error).__module__}.{type(error).__qualname__}",
                         message=str(error)[:4000],
                         traceback_tail=traceback.format_exc().splitlines()[-TRACEBACK_TAIL_LINES:])
            return 1
        return 0
    log = PhaseLog(Path(job["model_dir"]) / f"{args.command}.json", job, args.command)
    phase = run_export_phase if args.command == "export" else run_runtime_phase
    phase(job, adapter, log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
