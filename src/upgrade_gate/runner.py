"""Starts the worker inside one stack's venv, one fresh process per model phase.

A worker that raises is recorded by the worker itself. A worker that dies
(signal, exit code, deadline) cannot record anything, so the parent amends the
phase file it left: the stage that was running gets the cause. Either way the
run goes on with the next model.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from upgrade_gate import layout
from upgrade_gate.assets import assets_dir
from upgrade_gate.atomic import write_json_atomic
from upgrade_gate.config import REPO_ROOT, ModelEntry, Plan
from upgrade_gate.records import SCHEMA_VERSION
from upgrade_gate.specs import StackSpec

PROBE_TIMEOUT_S = 300
LOG_TAIL_LINES = 20

# Workers running right now, so an interrupted run can stop those other threads wait on.
_LIVE: set[subprocess.Popen[bytes]] = set()
_LIVE_LOCK = threading.Lock()


def run_stack(plan: Plan, spec: StackSpec, bin_dir: Path, log: Any = print) -> None:
    """Probe the stack, then export and run every model of the plan in it."""
    out = plan.settings.out_dir
    stack_dir = layout.stack_dir(out, spec.name)
    stack_dir.mkdir(parents=True, exist_ok=True)
    probe_file = stack_dir / "probe.json"
    _start_worker(
        bin_dir,
        "probe",
        {"out": str(probe_file), "distributions": spec.distributions},
        job_file=stack_dir / "probe-job.json",
        log_file=stack_dir / "probe.log",
        timeout_s=PROBE_TIMEOUT_S,
    )
    probe = json.loads(probe_file.read_text()) if probe_file.is_file() else None
    write_json_atomic(stack_dir / "stack.json", {"spec": spec.to_dict(), "installed": probe})

    # Exports are single-threaded Python (graph capture, partitioning,
    # serialization): `export-jobs` of them share the machine. Latency is
    # measured afterwards, one runtime phase at a time on a quiet machine.
    _export_all(plan, spec, bin_dir, log)
    for model in plan.models:
        _timed(plan, spec, model, "runtime", bin_dir, log)


def _timed(plan: Plan, spec: StackSpec, model: ModelEntry, phase: str, bin_dir: Path, log: Any) -> None:
    start = time.monotonic()
    log(f"{spec.name}: {model.name}: {phase} …")
    _run_phase(plan, spec, model, phase, bin_dir)
    log(f"{spec.name}: {model.name}: {phase} done in {time.monotonic() - start:.1f} s")


def _export_all(plan: Plan, spec: StackSpec, bin_dir: Path, log: Any) -> None:
    """Every model's export phase, up to ``export-jobs`` at once, in suite order.

    A model marked ``exclusive`` (one whose export needs most of the memory)
    waits for the others to finish and runs alone.
    """
    jobs = plan.settings.export_jobs
    pending = list(plan.models)
    running: dict[Future[None], ModelEntry] = {}
    pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="export")
    try:
        while pending or running:
            while pending and len(running) < jobs:
                alone = pending[0].exclusive or any(m.exclusive for m in running.values())
                if alone and running:
                    break
                model = pending.pop(0)
                running[pool.submit(_timed, plan, spec, model, "export", bin_dir, log)] = model
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                del running[future]
                future.result()
    except BaseException:  # Ctrl-C or a bug: no export may outlive the run
        with _LIVE_LOCK:
            live = list(_LIVE)
        for process in live:
            _stop_group(process)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _run_phase(plan: Plan, spec: StackSpec, model: ModelEntry, phase: str, bin_dir: Path) -> None:
    settings = plan.settings
    model_dir = layout.model_dir(settings.out_dir, spec.name, model.name)
    model_dir.mkdir(parents=True, exist_ok=True)
    phase_file = model_dir / f"{phase}.json"
    if phase == "export":
        # A new export invalidates everything after it.
        for stale in model_dir.iterdir():
            if stale.is_file():
                stale.unlink()
    job = {
        **model_job(model),
        "stack": spec.name,
        "model": model.name,
        "adapter": spec.adapter,
        "model_dir": str(model_dir),
        "fixtures_dir": str(layout.fixtures_dir(settings.out_dir, model.name, model.factory)),
        "threads": settings.threads,
        "warmup": settings.warmup,
        "iterations": settings.iterations,
    }
    outcome = _start_worker(
        bin_dir,
        phase,
        job,
        job_file=model_dir / f"{phase}-job.json",
        log_file=model_dir / f"{phase}.log",
        timeout_s=settings.phase_timeout_s,
    )
    _amend_phase_file(phase_file, job, phase, outcome, model_dir / f"{phase}.log")


def model_job(model: ModelEntry) -> dict[str, Any]:
    """What the worker needs to build a model: its factory and where to import it from."""
    return {
        "factory": model.factory,
        "project_root": str(model.project_root) if model.project_root else None,
        "assets_dir": str(assets_dir()),
    }


def check_factories(plan: Plan, spec: StackSpec, bin_dir: Path) -> dict[str, dict[str, Any]]:
    """Import and call each project model's factory in the stack; what went wrong, by model."""
    models = [m for m in plan.models if m.project_root]
    if not models:
        return {}
    stack_dir = layout.stack_dir(plan.settings.out_dir, spec.name)
    stack_dir.mkdir(parents=True, exist_ok=True)
    result_file = stack_dir / "factories.json"
    result_file.unlink(missing_ok=True)
    outcome = _start_worker(
        bin_dir,
        "check",
        {"out": str(result_file), "models": {m.name: model_job(m) for m in models}},
        job_file=stack_dir / "factories-job.json",
        log_file=stack_dir / "factories.log",
        timeout_s=plan.settings.phase_timeout_s,
    )
    if not result_file.is_file():
        tail = "\n".join(_tail(stack_dir / "factories.log"))
        return {m.name: {"ok": False, "error": f"the check died ({outcome['returncode']}): {tail}"} for m in models}
    return json.loads(result_file.read_text(encoding="utf-8"))


def _start_worker(
    bin_dir: Path, command: str, job: dict[str, Any], *, job_file: Path, log_file: Path, timeout_s: float
) -> dict[str, Any]:
    """Run ``python -P compat/worker.py COMMAND JOB`` in the stack; never raises for the worker's sake."""
    write_json_atomic(job_file, job)
    env = dict(os.environ)
    # -P and no PYTHONPATH: the worker loads compat/ and models/ by path under
    # private names, so nothing of ours shadows a user's package of the same name.
    env.pop("PYTHONPATH", None)
    # executorch's serializer runs `flatc` from the venv's bin/.
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env.pop("PYTHONHOME", None)
    env["PYTHONWARNINGS"] = "ignore"
    # Importing torch._inductor (executorch's export does) starts a pool of
    # compile subprocesses when triton is installed, as in the CUDA wheels;
    # nothing here compiles with inductor, and on 2 cores they steal time.
    env["TORCH_WARM_POOL"] = "0"
    # Every phase is a fresh interpreter: without cached bytecode each one
    # compiles torch's and executorch's sources again (≈ 7 s per process here,
    # where PYTHONDONTWRITEBYTECODE is set). The cache lives in the stack's venv,
    # so nothing is written into a user's project.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(bin_dir.parent / "pycache")
    argv = [str(bin_dir / "python"), "-P", str(REPO_ROOT / "compat" / "worker.py"), command, str(job_file)]
    start = time.monotonic()
    with open(log_file, "wb") as stderr:
        # Its own process group, so a deadline kills the worker and any child it started.
        process = subprocess.Popen(argv, env=env, cwd=REPO_ROOT, stdin=subprocess.DEVNULL,
                                   stdout=stderr, stderr=stderr, start_new_session=True)
        with _LIVE_LOCK:
            _LIVE.add(process)
        try:
            returncode = process.wait(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            _stop_group(process)
            returncode, timed_out = process.returncode, True
        except BaseException:  # Ctrl-C: take the worker down with us
            _stop_group(process)
            raise
        finally:
            with _LIVE_LOCK:
                _LIVE.discard(process)
    return {"returncode": returncode, "timed_out": timed_out, "elapsed_s": time.monotonic() - start,
            "timeout_s": timeout_s}


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    """terminate → wait → kill, as nox's popen does."""
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def _amend_phase_file(
    phase_file: Path, job: dict[str, Any], phase: str, outcome: dict[str, Any], log_file: Path
) -> None:
    """Record what happened to a worker that did not finish its phase."""
    try:
        data = json.loads(phase_file.read_text())
    except (OSError, ValueError):
        data = None
    if data is not None and data.get("complete") and outcome["returncode"] == 0:
        return
    if data is None:
        data = {"schema_version": str(SCHEMA_VERSION), "phase": phase, "stack": job["stack"], "model": job["model"],
                "stages": [{"stage": "start", "status": "running", "duration_s": 0.0}], "facts": {}}
    running = next((s for s in data["stages"] if s["status"] == "running"), None)
    if running is None:
        running = {"stage": "finish", "status": "running", "duration_s": 0.0}
        data["stages"].append(running)
    code = outcome["returncode"]
    if outcome["timed_out"]:
        status = "timeout"
        message = f"no result after {outcome['timeout_s']:.0f} s (phase-timeout-s); worker killed"
    elif code is not None and code < 0:
        status = "crashed"
        message = f"worker killed by signal {signal.Signals(-code).name}"
    else:
        status = "crashed"
        message = f"worker exited with code {code}"
    running.update(
        status=status,
        duration_s=outcome["elapsed_s"],
        error={"type": status, "message": message, "traceback_tail": _tail(log_file)},
    )
    data["complete"] = True
    write_json_atomic(phase_file, data)


def _tail(path: Path) -> list[str]:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return lines[-LOG_TAIL_LINES:]

