"""What the worker's programs share: records written whole, the same weights and
inputs for every stack, artifacts by path, and the model's factory.

Standard library and what the stack installs only: the parent package cannot be
imported here (another interpreter, another torch). Where the parent has the
same few lines (upgrade_gate._atomic: the writes, sha256_file) they stand
twice on purpose, one copy per side of the process boundary.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import importlib
import json
import math
import os
import re
import resource
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# The bundle carries device_runner.py alone, so the machine's description is defined there, once.
from .device_runner import ISA_FLAGS, cpu_and_isa  # noqa: F401 - re-exported for probe.py and issue_text.py
from .search.export_errors import source_line, told_traceback, with_causes

# The records' version; the parent's upgrade_gate.schema.records checks it.
RECORDS_VERSION = "1.0"
TRACEBACK_TAIL_LINES = 12
MESSAGE_CHARS = 4000
# models/ is loaded under this name (worker.py, as compat/ is under its own), so that a
# user's own package called `models` imports as theirs.
MODELS_PACKAGE = "upgrade_gate_models"


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON so that readers see the old file or the new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.chmod(tmp, 0o644)  # mkstemp makes 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as stream:
            json.dump(jsonable(data), stream, indent=2, allow_nan=False)
            stream.write("\n")
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)  # a full disk leaves no half file behind


def jsonable(value: Any) -> Any:
    """Non-finite floats spelled "inf", "-inf", "nan": JSON has none."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def peak_rss_bytes() -> int:
    # ru_maxrss is in KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def error_record(error: BaseException) -> dict[str, Any]:
    """An exception as a record: its qualified type, message, the end of its traceback, the model's line it was
    raised under (issue 63: where FX tracing stopped in a YOLO head), an OSError's errno (the parent tells a full
    disk from the model's own failure by it), and a refused method's name (the parent refuses the model's
    configuration by it: MethodNameRefused)."""
    told = told_traceback(error)
    # A note: what the runtime said (runtime_said); a cause: what a pass that broke was told (with_causes).
    message = " — ".join([with_causes(error), *getattr(error, "__notes__", ())])
    return {"type": f"{type(error).__module__}.{type(error).__qualname__}", "message": message[:MESSAGE_CHARS],
            "traceback_tail": told.splitlines()[-TRACEBACK_TAIL_LINES:],
            "source": source_line(told, {}, tool=str(Path(__file__).parent)),
            "errno": error.errno if isinstance(error, OSError) else None,
            **({"refused_method": error.method} if isinstance(error, MethodNameRefused) else {})}


class MethodNameRefused(ValueError):
    """A method of the model's ModelCase whose name the parent's rule refuses (``upgrade_gate.layout.METHOD_SHAPE``,
    which the job carries: this side cannot import it). A name is the model's configuration: the parent stops the
    run with exit 2 naming the model and the rule, and never charges it to a stack."""

    def __init__(self, method: str) -> None:
        super().__init__(f"method {method!r}: not a name upgrade-gate can use for a method's files and records")
        self.method = method


def refuse_bad_method_names(case: Any, job: dict[str, Any]) -> None:
    """Raise MethodNameRefused for the first method whose name the job's rule (``method_names``) refuses, before
    any stage writes a file by it (issue 61: a method named ``../…/escaped`` wrote its artifacts outside)."""
    rule = job["method_names"]
    shape = re.compile(rule["shape"])
    for name in case.entry_points():
        if not isinstance(name, str):  # the factory's own error, as any other thing it returns wrong
            raise TypeError(f"a ModelCase's methods are named by strings; one is {name!r} ({type(name).__name__})")
        if not shape.fullmatch(name) or name in rule["reserved"]:
            raise MethodNameRefused(name)


# -- the model ---------------------------------------------------------------------


def import_factory(job: dict[str, Any]) -> Callable[[], Any]:
    """``module:function`` — a module of models/ for built-in models, an
    importable module of the user's project for theirs."""
    module_name, _, func_name = job["factory"].partition(":")
    if job.get("project_root"):
        sys.path.insert(0, job["project_root"])
    else:
        module_name = f"{MODELS_PACKAGE}.{module_name}"
    return getattr(importlib.import_module(module_name), func_name)


def build_case(job: dict[str, Any]) -> Any:
    """Call the factory and check what it returned."""
    import torch

    case_module = importlib.import_module(f"{MODELS_PACKAGE}.case")
    factory = import_factory(job)
    torch.manual_seed(0)
    case = case_module.as_case(factory(), factory=job["factory"])
    refuse_bad_method_names(case, job)
    return case


# -- tensors and artifacts on disk ----------------------------------------------------


def load_npz_tensors(path: Path) -> dict[str, Any]:
    import numpy as np
    import torch

    with np.load(path, allow_pickle=False) as data:
        return {key: torch.from_numpy(data[key].copy()) for key in data.files}


def fixture_inputs(fixtures_dir: Path, methods: list[str]) -> dict[str, tuple[Any, ...]]:
    """Each method's inputs, from the fixture every stack loads."""
    tensors = load_npz_tensors(fixtures_dir / "inputs.npz")
    inputs = {}
    for name in methods:
        count = sum(1 for key in tensors if key.startswith(f"{name}.input_"))
        inputs[name] = tuple(tensors[f"{name}.input_{i}"] for i in range(count))
    return inputs


# The multi-method artifact's stem (``program.pte``): every method of a model that asks for one artifact
# (an LLM's prefill and decode, which share their weights) is in it, once. A method may not take this name.
PROGRAM = "program"


def artifact_path(model_dir: Path, method: str, adapter: Any) -> Path:
    return own_file(model_dir, f"{method}{adapter.SUFFIX}")


def own_file(folder: Path, name: str) -> Path:
    """``folder / name``, a file or folder the worker writes by a name it was given (a method's): one entry of
    ``folder`` itself, or ValueError. The build stage refuses such names first (refuse_bad_method_names); this is
    the write side's own check, as the parent's upgrade_gate.layout.entry."""
    path = folder / name
    if name in ("", ".", "..") or path.resolve().parent != folder.resolve():
        raise ValueError(f"{name!r} would be written at {path.resolve()}, outside {folder}: upgrade-gate writes a "
                         "method's files in the model's folder only")
    return path


def export_stages(model_dir: Path) -> dict[str, dict[str, Any]]:
    """The export phase's stage records by name (none if it left no record)."""
    try:
        record = json.loads((model_dir / "export.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {s["stage"]: s for s in record.get("stages", [])}


def saved_files(stages: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Each method's artifact by file name, as the export's save stage (of ``export_stages``) recorded it:
    ``<method><SUFFIX>``, or ``program<SUFFIX>`` for every method of a multi-method model."""
    methods = stages.get("save", {}).get("details", {}).get("methods") or {}
    return {name: str(saved["file"]) for name, saved in methods.items()}


def is_program(file: str) -> bool:
    return Path(file).stem == PROGRAM


MethodCall = Callable[[Any, tuple[Any, ...]], Any]
# A native runtime's own log line that says why it failed: "[XNNCompiler.cpp:1311] Failed to create cat3 node 52 with
# code: xnn_status_invalid_parameter" (ExecuTorch's release log), where its exception says "error 0x1".
NATIVE_FAILURE = re.compile(r"^\[?[\w.]+\.(?:cpp|cc|h):\d+\]?.*(?:fail|error|invalid|unsupported)", re.IGNORECASE)
NATIVE_LINES = 4


@contextlib.contextmanager
def stderr_kept(kept: list[str]) -> Iterator[None]:
    """Everything written to stderr meanwhile — by this process and by the tools it starts — appended to
    ``kept`` as text, and passed on to the real stderr (the worker's log) afterwards.

    ExecuTorch runs flatc with ``subprocess.run(..., check=True)`` and no capture: its CalledProcessError
    says only "returned non-zero exit status 1", while flatc's reason went to the log (issue 37). Taken at
    the file descriptor, so a child's output is kept too."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            data = sink.read()
            os.write(2, data)
            kept.append(data.decode(errors="replace"))


def runtime_said(action: Callable[..., Any], *args: Any) -> Any:
    """``action(*args)``, and where it raises, the native runtime's own words while it ran added to the exception as
    a note (issue 63: a .pte that lowered but did not load said why only in runtime.log). What the runtime writes
    to the process's stderr is kept around the call (``stderr_kept``) and written on, so the log has every line."""
    kept: list[str] = []
    try:
        with stderr_kept(kept):
            return action(*args)
    except Exception as error:
        lines = "".join(kept).splitlines()
        said = [line.strip() for line in lines if NATIVE_FAILURE.search(line.strip())][:NATIVE_LINES]
        if said:
            error.add_note("the runtime said: " + " · ".join(said))
        raise


def load_methods(adapter: Any, model_dir: Path, files: dict[str, str]) -> dict[str, tuple[MethodCall, Any]]:
    """Each method's call and the loaded artifact it takes: ``adapter.run`` on the method's own file, or
    ``adapter.run_method`` by name on the multi-method program, which is loaded once for all its methods."""
    loaded = {file: runtime_said(adapter.load, model_dir / file) for file in dict.fromkeys(files.values())}

    def call_of(name: str, file: str) -> MethodCall:
        if not is_program(file):
            return adapter.run
        return lambda program, inputs: adapter.run_method(program, name, inputs)

    return {name: (call_of(name, file), loaded[file]) for name, file in files.items()}


# -- the same weights and inputs in every stack -------------------------------------


def tensors_digest(tensors: dict[str, Any]) -> str:
    """SHA-256 over names, dtypes, shapes and bytes: equal digests, equal numbers."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        array = tensors[name].detach().cpu().contiguous().numpy()
        digest.update(f"{name}|{array.dtype.str}|{array.shape}|".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


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
    try:
        if case.weights == "fixture":
            state = {k: v.detach().cpu().numpy() for k, v in case.module.state_dict().items()}
            np.savez(staging / "weights.npz", **state)
        inputs = {
            f"{name}.input_{i}": t.detach().cpu().numpy()
            for name, method in case.entry_points().items()
            for i, t in enumerate(method.inputs)
        }
        np.savez(staging / "inputs.npz", **inputs)
        os.rename(staging, fixtures_dir)
    except OSError:
        # Another stack won the race (its files are used), or the disk is full (the error stands).
        shutil.rmtree(staging, ignore_errors=True)
        if not (fixtures_dir / "inputs.npz").is_file():
            raise


def load_case(job: dict[str, Any]) -> tuple[Any, dict[str, tuple[Any, ...]], dict[str, Any]]:
    """Build the model and give it the shared weights and inputs."""
    case = build_case(job)
    fixtures_dir = Path(job["fixtures_dir"])
    ensure_fixtures(case, fixtures_dir)
    if case.weights == "fixture":
        weights = collections.OrderedDict(load_npz_tensors(fixtures_dir / "weights.npz"))
        # The module's own versions of its parts, which an .npz does not keep: a part whose _load_from_state_dict
        # reads its version refuses the weights without them (torchvision's MNASNet: "version shluld be set …").
        weights._metadata = getattr(case.module.state_dict(), "_metadata", {})  # type: ignore[attr-defined]
        case.module.load_state_dict(weights, strict=True)
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


# -- a model's outputs, named ----------------------------------------------------


def output_leaves(value: Any, keys: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """A model's output tensors with the dict keys on their path, in pytree order.

    Dicts are walked in their own (insertion) order, as torch.utils._pytree does and so as
    torch.export flattens a program's outputs: a ``.pte`` returns them in that order. (Sorting
    the keys, as this did once, paired a Hugging Face-style dict's entries with the wrong
    ones of the ``.pte``.) Our own walk rather than ``tree_flatten_with_path``: torch 2.2
    has no key paths (2.8 has).
    """
    import torch

    if isinstance(value, torch.Tensor):
        yield keys, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from output_leaves(item, (*keys, str(key)))
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from output_leaves(item, keys)
    else:
        raise TypeError(f"model output contains {type(value).__name__}, expected tensors")


def flatten_outputs(value: Any) -> list[Any]:
    """Tensors of a model's output in pytree order (tuples, lists, dicts)."""
    return [tensor for _, tensor in output_leaves(value)]


def flat(value: Any) -> list[Any]:
    """``flatten_outputs``, each tensor detached from autograd: outputs as they are compared."""
    return [t.detach() for t in flatten_outputs(value)]


def named_outputs(value: Any) -> list[tuple[str, Any]]:
    """``[("output_0[logits]", tensor), …]``: each leaf's position, and the dict keys on its
    path in brackets (docs/report.md, "Output names"); ``output_1`` where there are none."""
    return [(f"output_{i}" + "".join(f"[{key}]" for key in keys), tensor)
            for i, (keys, tensor) in enumerate(output_leaves(value))]


def named_like_reference(method: str, named: list[tuple[str, Any]], reference: dict[str, Any]) -> list[tuple[str, Any]]:
    """An artifact that returns its outputs flat (a ``.pte``: the exported program's leaves,
    in pytree order) carries no keys: it takes the eager model's names, leaf by leaf. One
    that keeps the structure (the Lite Interpreter returns the dict) is named by its own keys."""
    names = [name.split(".", 1)[1] for name in reference if name.split(".", 1)[0] == method]
    if len(names) != len(named) or any("[" in name for name, _ in named):
        return named
    return [(name, tensor) for name, (_, tensor) in zip(names, named)]
