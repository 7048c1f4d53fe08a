"""Latency where the model ships (docs/device.md): ``nox -s bundle`` writes a report folder's artifacts as a device
runs them, and ``upgrade-gate device-results`` reads a device's rounds back into the report.

The bundle (``<out>/bundle/``), per model both stacks could run: the candidate's program as an ExecuTorch
BundledProgram (``.bpte``, verified on this machine by ExecuTorch before it is written: compat/bundle_phase.py),
the baseline's ``.ptl`` files, the fixture's inputs (``inputs.npz``: the numbers the report's rounds ran on), and
``run-on-device.sh`` with ``device_runner.py``, which time the stacks in alternating rounds on a phone over adb or on
the machine they are on and write one results file. ``manifest.json`` says what it holds — each stack's runtime key,
so that a device's figures are judged only against the artifacts they are of — and ``SHA256SUMS`` every file's
digest, which the script checks before it runs anything.

A results file read in is checked whole (its last line is the digest of the lines before it: schema/device.py;
the bundle it names is this folder's), kept in ``<out>/device/`` with the manifest it ran, and the report is judged
again: the ``device-latency`` gate (judge/_latency_gates.py) applies the latency gate's rule to each device.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from upgrade_gate import __version__, layout
from upgrade_gate._atomic import read_own_json, sha256_file, write_json_atomic, write_text_atomic
from upgrade_gate._confined import remove_file, remove_tree
from upgrade_gate.config.plan import Plan
from upgrade_gate.errors import RecordError, RunIncomplete
from upgrade_gate.invocation import command
from upgrade_gate.layout import TOOL_ROOT
from upgrade_gate.measure.rounds import artifacts_job, runnable_stacks
from upgrade_gate.run import workers
from upgrade_gate.run.guard import fail_incomplete, fail_usage
from upgrade_gate.schema.device import DeviceRun, UnfinishedResults, read_device_results
from upgrade_gate.schema.records import runtime_key

# ExecuTorch's bundled verification of the device's outputs against this machine's: the tolerances of its own
# example runner (examples/devtools/example_runner), as kernels of another ISA round differently.
VERIFY_RTOL, VERIFY_ATOL = 1e-3, 1e-5
# What the bundle carries of compat/: the runner and the script, and nothing that needs upgrade-gate.
CARRIED = ("device_runner.py", "run-on-device.sh")
MANIFEST, SUMS = layout.bundle_manifest_file(Path()).name, "SHA256SUMS"  # the manifest named once, in layout
# speed_benchmark_torch's --input_type names, by numpy dtype (the Android path: docs/device.md).
BENCHMARK_INPUT_TYPES = {"float32": "float", "uint8": "uint8_t", "int64": "int64"}


def write_bundle(plan: Plan, log: Callable[[str], Any] = print) -> Path | None:
    """The bundle of every model both the baseline and a candidate ran in this report folder; None when there is
    none (each reason logged)."""
    out, settings = plan.settings.out_dir, plan.settings
    staging = out / ".bundle.partial"
    if staging.exists():
        remove_tree(staging, within=out)
    staging.mkdir()
    models: dict[str, Any] = {}
    lines, pythons, skipped = [], {}, []
    not_bundled: list[tuple[str, str]] = []  # kept in the manifest: a target's gate says why the model is not timed
    for model in plan.models:
        runnable, not_run = runnable_stacks(plan, model)
        names = [spec.name for spec, _ in runnable]
        if plan.baseline.name not in names or len(names) < 2:
            why = "; ".join(f"{k}: {v}" for k, v in not_run.items()) or "one stack"
            skipped.append(f"{model.name} ({why})")
            not_bundled.append((model.name, why))
            continue
        parts = {}
        for spec, bin_dir in runnable:
            part = _bundle_part(plan, model, spec, bin_dir, staging / model.name / spec.name)
            if isinstance(part, str):
                skipped.append(f"{model.name} ({spec.name}: {part})")
                not_bundled.append((model.name, f"{spec.name}: {part}"))
                break
            parts[spec.name] = part
            pythons[spec.name] = str(bin_dir / "python")
        if len(parts) != len(runnable):
            remove_tree(staging / model.name, within=staging)
            continue
        methods = next(iter(parts.values()))["methods"]
        _inputs(artifacts_job(plan, model, runnable[0][0]), methods, staging / model.name)
        for name, part in parts.items():
            lines.append("\t".join((model.name, name, part["runtime"], part["artifact"], ",".join(methods))))
        models[model.name] = {"methods": methods, "threads": list(settings.threads), "stacks": {
            name: {"runtime_key": runtime_key(out, name, model.name), "runtime": part["runtime"],
                   "files": part["files"], "verified": part["verified"]} for name, part in parts.items()}}
        log(f"bundle: {model.name}: " + ", ".join(f"{n} ({p['runtime']})" for n, p in parts.items()))
    for reason in skipped:
        log(f"bundle: not bundled: {reason}")
    if not models:
        remove_tree(staging, within=out)
        return None
    _write_bundle_files(plan, staging, models, lines, pythons, dict(not_bundled))
    target = layout.bundle_dir(out)
    if target.exists():
        remove_tree(target, within=out)
    staging.rename(target)
    return target


def _write_bundle_files(plan: Plan, staging: Path, models: dict[str, Any], lines: list[str], pythons: dict[str, str],
                        not_bundled: dict[str, str]) -> None:
    """Beside the models' parts: the runner and its script, the plan, each stack's spec, the manifest, the settings
    and the checksums of it all."""
    out, settings = plan.settings.out_dir, plan.settings
    for name in CARRIED:
        shutil.copyfile(TOOL_ROOT / "compat" / name, staging / name)
    (staging / "run-on-device.sh").chmod(0o755)
    write_text_atomic(staging / "plan.tsv", "".join(f"{line}\n" for line in lines))
    write_text_atomic(staging / "pythons.tsv", "".join(f"{name}\t{python}\n" for name, python in pythons.items()))
    for spec in plan.stacks:  # `run-on-device.sh --install DIR` builds each stack where it runs, from its spec
        if spec.name in pythons:
            write_text_atomic(staging / "stacks" / f"{spec.name}.txt", f"# python {spec.python}\n"
                              + "".join(f"{requirement}\n" for requirement in spec.requirements))
    write_json_atomic(staging / MANIFEST, {
        "format": 1, "tool_version": __version__, "report": str(out), "baseline": plan.baseline.name,
        "requested": [model.name for model in plan.models], "models": models,
        "not_bundled": not_bundled,
        "rounds": {"rounds": settings.rounds, "warmup": settings.warmup, "calls": _calls(plan),
                   "threads": list(settings.threads), "rtol": VERIFY_RTOL, "atol": VERIFY_ATOL},
    })
    write_text_atomic(staging / "settings.env", (
        f"ROUNDS={settings.rounds}\nWARMUP={settings.warmup}\nCALLS={_calls(plan)}\n"
        f"THREADS='{' '.join(str(t) for t in settings.threads)}'\nRTOL={VERIFY_RTOL}\nATOL={VERIFY_ATOL}\n"
        f"MANIFEST_SHA256={sha256_file(staging / MANIFEST)}\n"))
    files = sorted(p for p in staging.rglob("*") if p.is_file() and p.name != SUMS)
    write_text_atomic(staging / SUMS, "".join(f"{sha256_file(p)}  {p.relative_to(staging).as_posix()}\n"
                                              for p in files))


def _calls(plan: Plan) -> int:
    """Calls per method per round: ``iterations`` spread over the rounds, as the host's rounds count them."""
    return max(1, math.ceil(plan.settings.iterations / plan.settings.rounds))


def _bundle_part(plan: Plan, model: Any, spec: Any, bin_dir: Path, folder: Path) -> dict[str, Any] | str:
    """One stack's files for the model, written by its worker (compat/bundle_phase.py); or why there are none."""
    folder.mkdir(parents=True)
    model_dir = layout.model_dir(plan.settings.out_dir, spec.name, model.name)
    job = {**artifacts_job(plan, model, spec), "threads": plan.settings.threads[0], "out_dir": str(folder),
           "rtol": VERIFY_RTOL, "atol": VERIFY_ATOL}
    outcome = workers.start_worker(bin_dir, "bundle", job, job_file=model_dir / "bundle-job.json",
                                   log_file=model_dir / "bundle.log", plan=plan)
    (model_dir / "bundle-job.json").unlink(missing_ok=True)
    out = plan.settings.out_dir
    if outcome.cause == "interrupted":
        fail_incomplete(f"bundle: stopped at {model.name} ({spec.name}); run `{command('bundle', f'--out {out}')}` "
                        "again")
    record_file = folder / "bundle.json"
    if not record_file.is_file():
        ended = outcome.cause or f"exit status {outcome.returncode}"
        return (f"the bundle worker ended ({ended}) without a record; its log: "
                f"{(model_dir / 'bundle.log').relative_to(out).as_posix()}")
    record = json.loads(record_file.read_text(encoding="utf-8"))
    record_file.unlink()
    if record.get("error"):
        error = record["error"]
        return f"{error.get('type', 'error').rsplit('.', 1)[-1]}: {str(error.get('message', ''))[:300]}"
    return record


def _inputs(job: dict[str, Any], methods: list[str], folder: Path) -> None:
    """The fixture's inputs of the bundled methods, and for the Android path their shapes and types."""
    with np.load(Path(job["fixtures_dir"]) / "inputs.npz") as arrays:
        kept = {key: arrays[key] for key in arrays.files if key.split(".input_")[0] in methods}
    np.savez(folder / "inputs.npz", **kept)
    forward = [kept[key] for key in sorted(kept, key=lambda k: int(k.rsplit("_", 1)[1])) if key.startswith("forward.")]
    if not forward:
        return  # the Android path runs single-method models only
    write_text_atomic(folder / "input_dims.txt", ";".join(",".join(map(str, a.shape)) for a in forward) + "\n")
    write_text_atomic(folder / "input_types.txt",
                      ";".join(BENCHMARK_INPUT_TYPES.get(str(a.dtype), str(a.dtype)) for a in forward) + "\n")


class ResultsRefused(Exception):
    """A results file that is not a whole, untouched file of this folder's bundle (``stopped``: its rounds did not
    all run)."""

    def __init__(self, message: str, *, stopped: bool = False) -> None:
        super().__init__(message)
        self.stopped = stopped


def read_manifest(out: Path) -> dict[str, Any]:
    """The bundle's manifest as write_bundle wrote it; one that does not read so was damaged from outside: exit 3
    naming it, and how to write it again (it is the tool's own file: never a candidate's failure)."""
    path = layout.bundle_manifest_file(out)
    again = f"write the bundle again with `{command('bundle', f'--out {out}')}`, then run the same command again"
    held = read_own_json(path, again=again)
    try:
        if isinstance(held["requested"], list) and all(isinstance(m["stacks"], dict) and all(
                isinstance(entry, dict) for entry in m["stacks"].values()) for m in held["models"].values()):
            return dict(held)
    except (KeyError, TypeError, AttributeError):
        pass
    raise RunIncomplete(f"{path} is damaged: it does not say what the bundle holds as upgrade-gate wrote it; {again}")


def checked_results(out: Path, results: Path) -> DeviceRun:
    """The results file read, whole and of this report folder's bundle, or ResultsRefused saying why."""
    manifest = layout.bundle_manifest_file(out)
    if not manifest.is_file():
        raise ResultsRefused(f"{out}: no device bundle (bundle/{MANIFEST}); write one with "
                             f"`{command('bundle', f'--out {out}')}` and run its run-on-device.sh first")
    if not results.is_file():
        raise ResultsRefused(f"{results}: no such results file; give the file run-on-device.sh wrote")
    try:
        run = read_device_results(results, str(results))
    except UnfinishedResults as error:
        raise ResultsRefused(f"{error}; run it again (the same command) and read in the file it writes",
                             stopped=True) from error
    except RecordError as error:
        raise ResultsRefused(f"{error}; run run-on-device.sh again and read in the file it writes") from error
    read_manifest(out)  # a damaged one is said as such, not as the rounds of another bundle
    digest = sha256_file(manifest)
    if run.manifest_sha256 != digest:
        raise ResultsRefused(f"{results}: the rounds of another bundle (manifest {run.manifest_sha256[:12]}; "
                             f"{out}/bundle's is {digest[:12]}); run {out}/bundle/run-on-device.sh "
                             "and read in its file")
    return run


def keep(out: Path, results: Path, run: DeviceRun) -> Path:
    """The checked results in the report folder, with the manifest of the bundle they ran; no earlier failure of
    the same target stands beside them."""
    kept = layout.device_results_file(out, run.target.name)
    kept.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(kept, results.read_text(encoding="utf-8"))
    manifest = layout.bundle_manifest_file(out).read_text(encoding="utf-8")
    write_text_atomic(layout.device_manifest_file(kept), manifest)
    failed = layout.device_failed_file(out, run.target.name)
    if failed.exists():
        remove_file(failed, within=out)
    return kept


def read_in(plan: Plan, results: Path) -> Path:
    """`device-results`: a device's results file checked and kept in the report folder; exit 2 when it is not a
    whole, untouched file of this folder's bundle, 3 when its rounds did not all run."""
    try:
        run = checked_results(plan.settings.out_dir, results)
    except ResultsRefused as refused:
        if refused.stopped:
            fail_incomplete(str(refused))
        fail_usage(str(refused))
    return keep(plan.settings.out_dir, results, run)
