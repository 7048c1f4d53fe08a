"""One stack's part of a model in a device bundle (``nox -s bundle``, upgrade_gate.measure.device): the artifacts
the stack shipped, as a phone would run them, checked on this machine before anything is written.

- An ExecuTorch program (``.pte``) becomes a BundledProgram (``.bpte``, executorch.devtools.bundled_program): the
  program with the fixture's inputs and, as the outputs to expect, what the program gave for them here, each
  method called in the order the runtime phase calls them (a method may read the state an earlier one wrote).
  Before the file is written, ExecuTorch's own bundled-program verification loads it and checks every method;
  a bundle that fails it is not written, and the record says why.
- A Lite Interpreter artifact (``.ptl``) is copied as it is, after it loaded and ran here.

The record (``bundle.json`` in the part's folder) names the files, their SHA-256, the runtime the device runner
uses for them and the tolerances of the verification.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from .common import (
    error_record,
    export_stages,
    fixture_inputs,
    flatten_outputs,
    load_methods,
    own_file,
    saved_files,
    sha256_file,
    write_json_atomic,
)
from .contract import Adapter, require
from .device_runner import RUNTIMES, executorch_binding

RECORD = "bundle.json"


def run_bundle_phase(job: dict[str, Any], adapter: Adapter) -> None:
    out_dir = Path(job["out_dir"])
    out_dir.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {"stack": job["stack"], "model": job["model"], "methods": job["methods"]}
    try:
        require(adapter, job["adapter"])
        adapter.set_threads(job["threads"])
        record.update(_bundle(job, adapter, out_dir))
    except Exception as error:  # noqa: BLE001 - the parent says which part could not be bundled, and why
        record["error"] = error_record(error)
    write_json_atomic(out_dir / RECORD, record)


def _bundle(job: dict[str, Any], adapter: Adapter, out_dir: Path) -> dict[str, Any]:
    model_dir, methods = Path(job["model_dir"]), list(job["methods"])
    files = saved_files(export_stages(model_dir))
    missing = [method for method in methods if method not in files or not (model_dir / files[method]).is_file()]
    if missing:
        raise FileNotFoundError(f"{model_dir}: no saved artifact for {', '.join(missing)}")
    if adapter.SUFFIX == ".pte":
        return _executorch_bundle(job, adapter, model_dir, files, methods, out_dir)
    if adapter.SUFFIX == ".ptl":
        return _lite_copy(job, adapter, model_dir, files, methods, out_dir)
    raise ValueError(f"no device runtime for {adapter.SUFFIX} artifacts: a bundle runs "
                     f"{' and '.join(sorted(RUNTIMES))} files (docs/device.md)")


def _executorch_bundle(job: dict[str, Any], adapter: Adapter, model_dir: Path, files: dict[str, str],
                       methods: list[str], out_dir: Path) -> dict[str, Any]:
    from executorch.devtools.bundled_program.config import MethodTestCase, MethodTestSuite
    from executorch.devtools.bundled_program.core import BundledProgram
    from executorch.devtools.bundled_program.serialize import serialize_from_bundled_program_to_flatbuffer

    if len(set(files[m] for m in methods)) != 1:
        raise ValueError(f"{model_dir}: the methods are in {len(set(files.values()))} programs; a bundle holds one "
                         "program per model (a multi-method program.pte)")
    program_file = model_dir / files[methods[0]]
    inputs = fixture_inputs(Path(job["fixtures_dir"]), methods)
    calls = load_methods(adapter, model_dir, {m: files[m] for m in methods})
    expected = {}
    for method in methods:  # in order, on one loaded program: the state each method leaves is the next one's
        call, program = calls[method]
        expected[method] = tuple(t.detach().clone() for t in flatten_outputs(call(program, inputs[method])))
    suites = [MethodTestSuite(method_name=method, test_cases=[
        MethodTestCase(inputs=inputs[method], expected_outputs=expected[method])]) for method in methods]
    data = serialize_from_bundled_program_to_flatbuffer(
        BundledProgram(None, suites, pte_file_path=str(program_file)))
    rtol, atol = job["rtol"], job["atol"]
    binding = executorch_binding()
    bundle = binding._load_bundled_program_from_buffer(data)
    module = binding._load_for_executorch_from_bundled_program(bundle)
    for method in methods:  # ExecuTorch's own check, as a device runs it: inputs from the bundle, outputs against it
        module.load_bundled_input(bundle, method, 0)
        module.plan_execute(method)
        module.verify_result_with_bundled_expected_output(bundle, method, 0, rtol, atol)
    name = f"{program_file.stem}.bpte"
    _write_whole(out_dir / name, data)
    return {"runtime": RUNTIMES[".bpte"], "artifact": name, "files": {name: sha256_file(out_dir / name)},
            "verified": {"by": "executorch bundled-program verification", "rtol": rtol, "atol": atol,
                         "methods": methods}}


def _lite_copy(job: dict[str, Any], adapter: Adapter, model_dir: Path, files: dict[str, str], methods: list[str],
               out_dir: Path) -> dict[str, Any]:
    inputs = fixture_inputs(Path(job["fixtures_dir"]), methods)
    calls = load_methods(adapter, model_dir, {m: files[m] for m in methods})
    for method in methods:
        call, program = calls[method]
        call(program, inputs[method])  # it loads and runs here, or it is not bundled
    copied = {}
    for method in methods:
        name = f"{method}{adapter.SUFFIX}"  # the device runner finds each method's file by this name
        target = own_file(out_dir, name)
        tmp = out_dir / f".{name}.tmp"
        shutil.copyfile(model_dir / files[method], tmp)
        os.replace(tmp, target)
        copied[name] = sha256_file(target)
    return {"runtime": RUNTIMES[".ptl"], "artifact": ".", "files": copied,
            "verified": {"by": "loaded and ran in the Lite Interpreter", "methods": methods}}


def _write_whole(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as stream:
            stream.write(data)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
