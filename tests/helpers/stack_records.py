"""Writes worker records by hand, for tests of the parent's pure logic."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from upgrade_gate import layout, pipeline
from upgrade_gate.config.plan import load_plan
from upgrade_gate.measure._contention import Load
from upgrade_gate.schema.measured import remedied
from upgrade_gate.schema.records import RECORDS_VERSION

# An eager output: 16 distinct values, so a relative error means something.
REFERENCE = np.linspace(-1.0, 1.0, 16, dtype=np.float32).reshape(1, 16)
HASHES = {"weights_sha256": "a" * 64, "inputs_sha256": "b" * 64}


def write_stack_model(
    out: Path,
    stack: str,
    model: str,
    *,
    eager: list[np.ndarray] | None,
    artifact: list[np.ndarray] | None,
    latency_ms: float | list[list[float]] = 1.0,
    runtime_memory: int = 100 * 2**20,
    threads: tuple[int, ...] = (1, 2),
    artifact_bytes: int = 1000,
    failed_stage: str | None = None,
    failed_at: str | None = None,
    hashes: dict[str, str] = HASHES,
    runtime_peak_rss: int = 300 * 2**20,
    task: str = "generic",
    quantize: str | None = None,
    quantized: list[np.ndarray] | None = None,
    export_details: dict | None = None,
    profile: dict | None = None,
    backends: dict | None = None,
    localize: dict | None = None,
    build_details: dict | None = None,
) -> Path:
    """Both phase files as the worker writes them; ``failed_stage`` fails there (its error raised under the model's
    line ``failed_at``) and skips what depends on it.

    ``quantize``: a quantized variant's recipe (a quantize stage before export),
    or "no recipe" for a stack without one (the quantize stage skipped, nothing after it); ``quantized``: the
    quantized model's outputs, run eagerly (the quantize stage's)."""
    directory = layout.model_dir(out, stack, model)
    directory.mkdir(parents=True, exist_ok=True)
    failed = False

    def stage(name: str, details: dict | None = None) -> dict:
        nonlocal failed
        if failed:
            return {"stage": name, "status": "skipped", "duration_s": 0.0, "reason": "needs an earlier stage"}
        if name == failed_stage:
            failed = True
            return {"stage": name, "status": "failed", "duration_s": 0.5,
                    "error": {"type": "RuntimeError", "message": f"{name} broke", "traceback_tail": ["line"],
                              **({"source": failed_at} if failed_at else {})}}
        return {"stage": name, "status": "ok", "duration_s": 0.1, "details": details or {}}

    export = [
        stage("build", {"fixtures": hashes, "methods": ["forward"], "task": task, **(build_details or {})}),
        stage("eager", {"file": "eager.npz"}),
    ]
    if quantize == "no recipe":
        export.append({"stage": "quantize", "status": "skipped", "duration_s": 0.0,
                       "reason": "this stack has no int8 recipe (it offers: none)"})
        failed = True
    elif quantize is not None:
        export.append(stage("quantize", {"recipe": quantize, **({"outputs": "quantized.npz"} if quantized else {})}))
    export.append(stage("export", {"methods": {"forward": export_details}} if export_details else None))
    if localize is not None:  # the search behind a failed export: it runs when the export failed
        export.append({"stage": "localize", "status": "ok", "duration_s": 1.0, "details": localize})
    export += [
        stage("save", {"bytes": artifact_bytes,
                       "methods": {"forward": {"file": "forward.pte", "bytes": artifact_bytes,
                                               "sha256": _artifact(directory, artifact_bytes)}}}),
    ]
    if backends is not None:
        export.append(stage("backends", {"backends": backends}))
    runtime = [
        stage("inputs"),
        stage("load"),
        stage("run", {"file": "artifact.npz"}),
    ]
    if profile is not None:
        runtime.append(stage("profile", {"runs": 5, "methods": {"forward": profile}}))
    for phase, stages, rss in (("export", export, 500 * 2**20), ("runtime", runtime, runtime_peak_rss)):
        (directory / f"{phase}.json").write_text(json.dumps({
            "schema_version": str(RECORDS_VERSION), "phase": phase, "stack": stack, "model": model,
            "stages": stages, "facts": {"peak_rss_bytes": rss}, "complete": True,
        }))
    for name, tensors in (("eager", eager), ("artifact", artifact), ("quantized", quantized)):
        if tensors is not None:
            np.savez(directory / f"{name}.npz", **{f"forward.output_{i}": t for i, t in enumerate(tensors)})
    # What the measure session writes: a stack whose artifact did not run is not measured.
    rounds = [[latency_ms] * 8] * 7 if isinstance(latency_ms, (int, float)) else latency_ms
    entry = {"status": "not measured", "reason": "its artifact did not load and run (runtime phase)"} if failed else {
        "status": "ok",
        "cold": {"load_ms": 5.0, "first_ms": {"forward": 20.0}},
        "idle_memory": {"rss_bytes": 400 * 2**20, "peak_rss_bytes": 400 * 2**20},
        "exit_memory": {"rss_bytes": 400 * 2**20 + runtime_memory, "peak_rss_bytes": 400 * 2**20 + runtime_memory},
        "runtime_memory_bytes": runtime_memory,
        "input_shapes": {"forward": [[1, 3, 32, 32]]},
        "rounds": [{"round": i + 1, "samples_ms": {"forward": samples}} for i, samples in enumerate(rounds)],
    }
    for count in threads:
        add_measurement(out, model, count, stack, entry)
    return directory


def add_task(out: Path, stack: str, model: str, which: str, tokens: list[list[int]]) -> None:
    """A generator's loop as its stage records it (compat/phases.py run_task): ``eager`` (the export phase's
    ``eager-task``) or ``artifact`` (the runtime phase's ``task``); step logits that pick each token."""
    directory = layout.model_dir(out, stack, model)
    phase, stage = ("export", "eager-task") if which == "eager" else ("runtime", "task")
    record = json.loads((directory / f"{phase}.json").read_text())
    record["stages"].append({"stage": stage, "status": "ok", "duration_s": 0.1, "details": task_details(
        directory / f"{which}-task.npz", tokens)})
    (directory / f"{phase}.json").write_text(json.dumps(record))


def task_details(path: Path, tokens: list[list[int]], vocab: int = 8) -> dict:
    """The loop's file (tokens, and logits peaked at each token) and its stage's details."""
    logits = np.zeros((len(tokens), max(map(len, tokens)), vocab), dtype=np.float32)
    for row, sequence in enumerate(tokens):
        for step, token in enumerate(sequence):
            logits[row, step, token] = 1.0
    np.savez(path, tokens=np.array(tokens, dtype=np.int64), step_logits=logits)
    return {"file": path.name, "prompts": [f"prompt {i}" for i in range(len(tokens))], "tokens": tokens,
            "text": [" ".join(map(str, sequence)) for sequence in tokens]}


def write_remedied(out: Path, stack: str, model: str, *, remedy_outputs: list[np.ndarray],
                   latency_ms: list[list[float]] | None, threads: tuple[int, ...] = (1, 2),
                   task_tokens: list[list[int]] | None = None) -> None:
    """A diagnose phase that found a culprit in ``forward`` and a remedy that passes against eager, as the worker
    records them, with the remedied artifact's outputs (and, with ``task_tokens``, a generator's loop run with
    it: the phase's ``task`` stage); and, unless ``latency_ms`` is None, the measure session's rounds of the
    candidate timed with its remedy (measured.remedied)."""
    directory = layout.diagnose_dir(out, stack, model)
    (directory / "remedy").mkdir(parents=True, exist_ok=True)
    (directory / "remedy" / "forward.pte").write_bytes(b"remedied")
    np.savez(directory / "remedy.npz", **{f"forward.output_{i}": t for i, t in enumerate(remedy_outputs)})
    culprit = {"operator": "aten.gelu.default", "backend": "XNNPACK delegate", "share": 1.0,
               "calls": [{"key": "gelu", "module": "act", "source": "m.py:1 in forward"}]}
    chosen = {"remedy": "kept out of the delegate", "code": "partitioner = P()\n", "rel_l2": 1e-7, "passes": True,
              "file": "remedy/forward.pte", "bytes": 8}
    stages = [
        {"stage": "build", "status": "ok", "duration_s": 1.0, "details": {"methods": ["forward"]}},
        {"stage": "search", "status": "ok", "duration_s": 1.0, "details": {"methods": {"forward": {
            "status": "found", "rel_l2": 0.3, "culprits": [culprit], "tried": [{}, {}]}}}},
        {"stage": "remedy", "status": "ok", "duration_s": 1.0, "details": {
            "methods": {"forward": {**chosen, "tried": [chosen]}}, "outputs": "remedy.npz"}},
    ]
    if task_tokens is not None:
        stages.append({"stage": "task", "status": "ok", "duration_s": 1.0,
                       "details": task_details(directory / "remedy-task.npz", task_tokens)})
    (directory / f"{layout.DIAGNOSE}.json").write_text(json.dumps({
        "schema_version": str(RECORDS_VERSION), "phase": layout.DIAGNOSE, "stack": stack, "model": model,
        "stages": stages, "facts": {}, "complete": True}))
    if latency_ms is None:
        return
    entry = {"status": "ok", "cold": {"load_ms": 5.0, "first_ms": {"forward": 20.0}},
             "idle_memory": {"rss_bytes": 400 * 2**20, "peak_rss_bytes": 400 * 2**20},
             "input_shapes": {"forward": [[1, 3, 32, 32]]},
             "rounds": [{"round": i + 1, "samples_ms": {"forward": samples}} for i, samples in enumerate(latency_ms)]}
    for count in threads:
        add_measurement(out, model, count, remedied(stack), entry)


def _artifact(directory: Path, size: int) -> str:
    """An artifact file of ``size`` bytes, as the save stage records it; its SHA-256. A large one is a
    sparse file with no digest recorded (the report then checks its size only): 1.5 GB in no time."""
    if size > 2**20:
        with open(directory / "forward.pte", "wb") as stream:
            stream.truncate(size)
        return ""
    content = bytes(range(256)) * (size // 256) + bytes(size % 256)
    (directory / "forward.pte").write_bytes(content)
    return hashlib.sha256(content).hexdigest()


def add_measurement(out: Path, model: str, threads: int, stack: str, entry: dict) -> None:
    path = layout.measurement_file(out, model, threads)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.loads(path.read_text()) if path.is_file() else {
        "schema_version": str(RECORDS_VERSION), "model": model, "threads": threads, "stacks": {}}
    data["stacks"][stack] = entry
    path.write_text(json.dumps(data))


def add_round_loads(out: Path, model: str, threads: int, loads: list[tuple[float, float]], *, cores: int = 2,
                    ended: str | None = None, settings: dict | None = None, steal: float = 0.0) -> None:
    """The rounds a measurement tried, as the measure session records them: in round n the timed
    threads waited ``loads[n-1][0]`` of their time for a CPU while others kept ``loads[n-1][1]``
    cores busy (and the virtual machine's host took ``steal`` of its CPU time in every round but the first);
    whether that disturbed the round is the tool's rule (tested in test_contention).
    ``ended``: why the rounds ended; ``settings``: how they were made (rounds, stop_early, intervals)."""
    path = layout.measurement_file(out, model, threads)
    data = json.loads(path.read_text())
    data["machine"] = {"cpu": "Test CPU", "cores": cores}
    if ended is not None:
        data["ended"] = ended
    if settings is not None:
        data["settings"] = settings
    data["rounds"] = [{"round": n, "order": list(data["stacks"])[:: 1 if n % 2 else -1],
                       "disturbed": Load(seconds=0.5, waited_share=waited, others_cores=others,
                                         steal_share=steal if n > 1 else 0.0, run_queue=3,
                                         free_cores=cores - threads).disturbed,
                       "load": {stack: {"seconds": 0.5, "waited_share": waited, "others_cores": others,
                                        "steal_share": steal if n > 1 else 0.0, "run_queue": 3}
                                for stack in data["stacks"]}}
                      for n, (waited, others) in enumerate(loads, start=1)]
    path.write_text(json.dumps(data))


# -- the project's test runs and the stacks' packages, as the sessions write them ----------------


def write_project_run(out: Path, stack: str, junit: str | None, *, warnings: list[dict] | None = None,
                      installed: dict[str, str] | None = None, **run: object) -> None:
    """project/<stack>/: run.json, and the JUnit XML and the plugin's warnings.json when given."""
    folder = layout.project_dir(out, stack)
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"schema_version": "1.0", "stack": stack, "status": "ran",
                                                 "command": ["python", "-m", "pytest"], "duration_s": 2.5,
                                                 "installed": installed or {}, **run}))
    if junit is not None:
        (folder / "junit.xml").write_text(junit)
    if warnings is not None:
        (folder / "warnings.json").write_text(json.dumps({"schema_version": "1.0", "captured": True,
                                                          "warnings": warnings, "dropped": 0}))


def junit_of(**by_name: str) -> str:
    """JUnit XML of tests/test_m.py's tests, each with its outcome."""
    cases = []
    for name, outcome in by_name.items():
        inner = {"passed": "", "failed": "<failure message='AssertionError: boom'>&gt;  check()\nE   AssertionError: boom</failure>",
                 "skipped": "<skipped message='later'/>", "error": "<error message='fixture'/>"}[outcome]
        cases.append(f"<testcase classname='tests.test_m' name='{name}' file='tests/test_m.py' line='1'>{inner}</testcase>")
    return f"<testsuites><testsuite name='pytest'>{''.join(cases)}</testsuite></testsuites>"


def warning(test: str, category: str, message: str, count: int = 1, *, when: str = "runtest",
            location: str = "edge_app/model.py:40") -> dict:
    """One entry of the plugin's warnings.json."""
    return {"test": test, "when": when, "category": category, "message": message, "location": location,
            "count": count}


def write_stack_packages(out: Path, stack: str, packages: dict[str, str], extras: list[tuple[str, str | None]] = ()
                         ) -> None:
    """stacks/<stack>/stack.json's packages and extra requirements, beside what is there."""
    path = layout.stack_dir(out, stack) / "stack.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.loads(path.read_text()) if path.is_file() else {"spec": {}, "installed": None}
    data["packages"] = packages
    data["extra_requirements"] = [{"requirement": r, "distribution": d} for r, d in extras]
    path.write_text(json.dumps(data))


def report_on(project: Path, out: str, *, error: float, candidate_ms: float, size: int, memory: int) -> Path:
    plan = load_plan(["--out", out, "--models", "vit-smoke@fp32"], invoked_from=project,
                     config_path=project / "pyproject.toml")
    folder = plan.settings.out_dir
    write_stack_model(folder, "legacy", "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE], latency_ms=2.0)
    write_stack_model(folder, "candidate", "vit-smoke", eager=[REFERENCE], artifact=[REFERENCE * (1 + error)],
                      latency_ms=candidate_ms, artifact_bytes=size, runtime_memory=memory)
    pipeline.report(plan)
    return folder
