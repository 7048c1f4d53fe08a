"""Runs inside one stack's venv: builds a model, exports it, runs the artifact.

Needs nothing but the standard library and what the stack installs (torch,
numpy, the stack's runtime). The parent process starts it with a job file and
reads back JSON records and ``.npz`` tensors; nothing pickled crosses the
process boundary, because the two sides run different torch versions.

Each phase runs in a fresh process:

* ``export``  — build → eager → export → save (the artifact file)
* ``runtime`` — load → run → latency, like an app that only has the artifact

Every stage leaves a record (status, duration, error with traceback tail). A
stage that raises is recorded and the stages that depend on it are skipped; the
phase file is rewritten after every stage, so a crash or a kill leaves the
stages that finished and names the one that was running.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
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
from typing import Any, Callable

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
        record: dict[str, Any] = {"stage": name, "status": "running", "duration_s": 0.0}
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


def save_tensors(path: Path, tensors: list[Any]) -> dict[str, Any]:
    import numpy as np

    arrays = {f"output_{i}": t.detach().cpu().contiguous().numpy() for i, t in enumerate(tensors)}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.npz")
    np.savez(tmp, **arrays)
    os.replace(tmp, path)
    return {
        "file": path.name,
        "outputs": [{"name": k, "shape": list(a.shape), "dtype": str(a.dtype)} for k, a in arrays.items()],
    }


def load_npz_tensors(path: Path) -> dict[str, Any]:
    import numpy as np
    import torch

    with np.load(path, allow_pickle=False) as data:
        return {key: torch.from_numpy(data[key].copy()) for key in data.files}


# -- fixtures: the same weights and inputs in every stack ----------------------


def ensure_fixtures(case: Any, fixtures_dir: Path) -> dict[str, Any]:
    """Create the model's weights and inputs once; every stack loads the same files.

    Re-seeding is not enough: two torch versions need not draw the same numbers
    from the same seed. The first stack to get here writes the files into a
    temporary dir and renames it into place, so a concurrent or interrupted
    writer never leaves a half fixture.
    """
    import numpy as np

    if not (fixtures_dir / "inputs.npz").is_file():
        fixtures_dir.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=fixtures_dir.parent, prefix=f".{fixtures_dir.name}."))
        state = {k: v.detach().cpu().numpy() for k, v in case.module.state_dict().items()}
        np.savez(staging / "weights.npz", **state)
        np.savez(staging / "inputs.npz", **{f"input_{i}": t.numpy() for i, t in enumerate(case.inputs)})
        try:
            os.rename(staging, fixtures_dir)
        except OSError:  # another stack won the race; use its files
            for leftover in staging.iterdir():
                leftover.unlink()
            staging.rmdir()
    return {
        "weights_sha256": sha256_file(fixtures_dir / "weights.npz"),
        "inputs_sha256": sha256_file(fixtures_dir / "inputs.npz"),
    }


def load_case(job: dict[str, Any]) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """Build the model, then overwrite its weights and inputs with the fixtures."""
    import torch

    module_name, _, func_name = job["factory"].partition(":")
    factory = getattr(importlib.import_module(module_name), func_name)
    torch.manual_seed(0)
    case = factory()
    fixtures_dir = Path(job["fixtures_dir"])
    hashes = ensure_fixtures(case, fixtures_dir)
    state = load_npz_tensors(fixtures_dir / "weights.npz")
    case.module.load_state_dict(state, strict=True)
    case.module.eval()
    inputs = load_npz_tensors(fixtures_dir / "inputs.npz")
    ordered = tuple(inputs[f"input_{i}"] for i in range(len(inputs)))
    return case.module, ordered, hashes


# -- phases ---------------------------------------------------------------------


def run_export_phase(job: dict[str, Any], adapter: Any, log: PhaseLog) -> None:
    import torch

    model_dir = Path(job["model_dir"])
    artifact = model_dir / f"model{adapter.SUFFIX}"
    torch.set_num_threads(job["threads"])

    def build():
        module, inputs, hashes = load_case(job)
        return (module, inputs), {"fixtures": hashes, "parameters": sum(p.numel() for p in module.parameters())}

    def eager():
        module, inputs = log.results["build"]
        with torch.no_grad():
            outputs = flatten_outputs(module(*inputs))
        return outputs, save_tensors(model_dir / "eager.npz", outputs)

    def export():
        module, inputs = log.results["build"]
        artifact.unlink(missing_ok=True)
        with torch.no_grad():
            details = adapter.export(module, inputs, artifact)
        return True, details

    def save():
        # An exporter can "succeed" and leave an empty file (seed 000: OOM during
        # partitioning left a 0-byte .pte); only a non-empty file counts.
        if not artifact.is_file():
            raise FileNotFoundError(f"exporter wrote no artifact at {artifact}")
        size = artifact.stat().st_size
        if size == 0:
            raise ValueError(f"exporter wrote an empty artifact ({artifact.name}: 0 bytes)")
        return True, {"file": artifact.name, "bytes": size, "sha256": sha256_file(artifact)}

    log.stage("build", (), build)
    log.stage("eager", ("build",), eager)
    log.stage("export", ("build",), export)
    log.stage("save", ("export",), save)
    log.finish(torch_threads=torch.get_num_threads())


def run_runtime_phase(job: dict[str, Any], adapter: Any, log: PhaseLog) -> None:
    model_dir = Path(job["model_dir"])
    artifact = model_dir / f"model{adapter.SUFFIX}"
    adapter.set_threads(job["threads"])

    def load():
        if not artifact.is_file():
            raise StageSkipped(f"no artifact {artifact.name}: the export phase did not write one")
        return adapter.load(artifact), None

    def inputs():
        tensors = load_npz_tensors(Path(job["fixtures_dir"]) / "inputs.npz")
        return tuple(tensors[f"input_{i}"] for i in range(len(tensors))), None

    def run():
        outputs = flatten_outputs(adapter.run(log.results["load"], log.results["inputs"]))
        return outputs, save_tensors(model_dir / "artifact.npz", outputs)

    def latency():
        program, args = log.results["load"], log.results["inputs"]
        for _ in range(job["warmup"]):
            adapter.run(program, args)
        samples = []
        for _ in range(job["iterations"]):
            start = time.perf_counter_ns()
            adapter.run(program, args)
            samples.append((time.perf_counter_ns() - start) / 1e6)
        return True, {"threads": job["threads"], "warmup": job["warmup"], "samples_ms": samples}

    log.stage("inputs", (), inputs)
    log.stage("load", (), load)
    log.stage("run", ("load", "inputs"), run)
    log.stage("latency", ("run",), latency)
    log.finish()


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m compat.worker")
    parser.add_argument("command", choices=("probe", "export", "runtime"))
    parser.add_argument("job", type=Path, help="job JSON written by the parent")
    args = parser.parse_args(argv)
    job = json.loads(args.job.read_text(encoding="utf-8"))

    if args.command == "probe":
        write_json_atomic(Path(job["out"]), probe(job["distributions"]))
        return 0

    adapter = importlib.import_module(f"compat.{job['adapter']}")
    log = PhaseLog(Path(job["model_dir"]) / f"{args.command}.json", job, args.command)
    phase = run_export_phase if args.command == "export" else run_runtime_phase
    phase(job, adapter, log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
