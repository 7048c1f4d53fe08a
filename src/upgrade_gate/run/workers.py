"""A stack's worker process, as the runner starts it: its command line and environment
(``python -P compat/worker.py COMMAND JOB`` under the supervisor, run/supervisor.py), and what a worker
that did not finish leaves on its phase's record: the stage that was running, with its cause."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from upgrade_gate import layout
from upgrade_gate._atomic import write_json_atomic
from upgrade_gate.config.plan import Plan
from upgrade_gate.layout import TOOL_ROOT
from upgrade_gate.run import cache, process_group, supervisor
from upgrade_gate.run.fork_server import ForkServer
from upgrade_gate.schema.records import RECORDS_VERSION
from upgrade_gate.text import size

# The last lines of a worker's log kept in the record of a stage it did not finish.
LOG_TAIL_LINES = 20


def start_worker(
    bin_dir: Path, command: str, job: dict[str, Any], *, job_file: Path, log_file: Path, plan: Plan,
    phase_file: Path | None = None, first_stage: str = "start", on_stage: Callable[[str], Any] | None = None,
    fork_server: ForkServer | None = None,
) -> supervisor.Outcome:
    """Run ``python -P compat/worker.py COMMAND JOB`` in the stack under the supervisor (forked by the
    stack's ``fork_server`` where one is given)."""
    write_json_atomic(job_file, job)
    settings = plan.settings
    return supervisor.run_supervised(
        worker_argv(bin_dir, command, job_file), env=worker_env(bin_dir), cwd=TOOL_ROOT, log_file=log_file,
        phase_file=phase_file, deadline_for=settings.timeout_s, memory_limit_bytes=settings.memory_limit_bytes,
        first_stage=first_stage, on_stage=on_stage, fork_server=fork_server,
    )


def worker_argv(bin_dir: Path, command: str, job_file: Path) -> list[str]:
    return [*_worker_command(bin_dir), command, str(job_file)]


def _worker_command(bin_dir: Path) -> list[str]:
    return [str(bin_dir / "python"), "-P", str(TOOL_ROOT / "compat" / "worker.py")]


# The fork server each phase's worker is forked from (workers.fork_servers), by what it imported once.
# The runtime phase is an app that has only the artifacts (the adapter contract's ``load``): its server
# imported no more than a fresh worker would before loading one; the phases that export, the exporter too.
FORKED_FROM = {"runtime": "app", "export": "exporter", layout.DIAGNOSE: "exporter"}


@contextlib.contextmanager
def fork_servers(plan: Plan, bin_dir: Path, adapter: str, stack_dir: Path,
                 log: Callable[[str], Any]) -> Iterator[dict[str, ForkServer]]:
    """The stack's fork servers for one run's phases, by phase (none for ``worker-start = "fresh"``). Each starts
    with the first worker it forks: a run whose phases all come from the cache imports nothing."""
    if plan.settings.worker_start != "fork":
        yield {}
        return
    stack_dir.mkdir(parents=True, exist_ok=True)
    servers = {}
    for imports in sorted(set(FORKED_FROM.values())):
        job_file = stack_dir / f"fork-server-{imports}-job.json"
        write_json_atomic(job_file, {"adapter": adapter, "imports": imports})
        servers[imports] = ForkServer(
            worker_argv(bin_dir, "fork-server", job_file), serves=_worker_command(bin_dir),
            commands=[phase for phase, server in FORKED_FROM.items() if server == imports], env=worker_env(bin_dir),
            cwd=TOOL_ROOT, log_file=stack_dir / f"fork-server-{imports}.log",
            ready_deadline_s=plan.settings.timeout_s("start"),
        )
    for server in servers.values():
        server.siblings = [other for other in servers.values() if other is not server]
    try:
        yield {phase: servers[imports] for phase, imports in FORKED_FROM.items()}
    finally:
        for imports, server in servers.items():
            if server.broken is not None and not process_group.interrupted():
                log(f"{stack_dir.name}: the fork server of the {imports} stopped forking: {server.broken}; each "
                    "phase after it started an interpreter of its own")
            server.close()


def venv_env(bin_dir: Path) -> dict[str, str]:
    """This process's environment for a program of the venv that holds ``bin_dir``:
    that venv's bin/ first on PATH, nothing of the caller's on its Python path, the cache's temporary folder."""
    env = dict(os.environ)
    # -P and no PYTHONPATH: the worker loads compat/ and models/ by path under private names, shadowing nothing.
    env.pop("PYTHONPATH", None)
    # executorch's serializer runs `flatc` from the venv's bin/.
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env.pop("PYTHONHOME", None)
    temporary = layout.temporary_dir()
    temporary.mkdir(parents=True, exist_ok=True)
    env["TMPDIR"] = str(temporary)
    return env


def worker_env(bin_dir: Path) -> dict[str, str]:
    """The environment of a worker in the stack whose venv holds ``bin_dir``."""
    env = venv_env(bin_dir)
    env["PYTHONWARNINGS"] = "ignore"
    # Importing torch._inductor (executorch's export does) starts a pool of compile subprocesses when triton is
    # installed (the CUDA wheels); nothing here compiles with inductor, and on 2 cores they steal time.
    env["TORCH_WARM_POOL"] = "0"
    # The host wheels' OpenMP busy-waits between parallel regions: on 2 cores torch 2.2's Lite Interpreter ran
    # 4-10× slower at 2 threads than at 1 (ViT-Ti/16: 500 ms against 70 ms passive). A phone's pthreadpool sleeps,
    # as XNNPACK's threads do. The same in every stack; a user's own setting wins.
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # Without cached bytecode each worker compiles torch's and executorch's sources again (≈ 7 s a process where
    # PYTHONDONTWRITEBYTECODE is set); the cache lives in the stack's venv, not in a user's project.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(bin_dir.parent / "pycache")
    return env


def record_outcome(
    phase_file: Path, job: dict[str, Any], phase: str, outcome: supervisor.Outcome, log_file: Path, plan: Plan
) -> bool:
    """Add what the supervisor saw to the phase file, and why a worker did not finish on the stage that was running;
    True when the result may be cached."""
    data = phase_record(phase_file, job, phase)
    data.setdefault("facts", {})["supervisor"] = {
        "elapsed_s": round(outcome.elapsed_s, 3),
        "peak_rss_bytes": outcome.peak_rss_bytes,
        "memory_limit_bytes": outcome.memory_limit_bytes,
        "forked": outcome.forked,
    }
    finished = bool(data.get("complete")) and outcome.finished
    if not finished:
        running = next((s for s in data["stages"] if s["status"] == "running"), None)
        if running is None:
            running = {"stage": outcome.stage, "status": "running", "duration_s": 0.0}
            data["stages"].append(running)
        status, message = cause(outcome, plan)
        running.update(
            status=status,
            duration_s=round(outcome.stage_elapsed_s, 3),
            error={"type": status, "message": message, "traceback_tail": log_tail(log_file)},
        )
        data["complete"] = True
    write_json_atomic(phase_file, data)
    return finished and all(s["status"] in cache.CACHEABLE_STATUSES for s in data["stages"])


def phase_record(phase_file: Path, job: dict[str, Any], phase: str) -> dict[str, Any]:
    """The phase's record as the worker left it, or an empty one for a worker that wrote none."""
    try:
        return json.loads(phase_file.read_text())
    except (OSError, ValueError):
        return {"schema_version": str(RECORDS_VERSION), "phase": phase, "stack": job["stack"], "model": job["model"],
                "stages": [], "facts": {}}


def mark_interrupted(phase_file: Path, job: dict[str, Any], phase: str) -> None:
    """The stage that was running when the run was stopped: interrupted, not failed."""
    data = phase_record(phase_file, job, phase)
    if not data["stages"]:  # stopped before the worker wrote anything: while it started
        data["stages"].append({"stage": "start", "status": "running", "duration_s": 0.0})
    for stage in data["stages"]:
        if stage["status"] == "running":
            stage.update(status="interrupted", error={"type": "interrupted", "message": _stopped(stage["stage"]),
                                                      "traceback_tail": []})
    data["complete"] = True
    write_json_atomic(phase_file, data)


def _stopped(stage: str) -> str:
    return f"the run was stopped (Ctrl-C or SIGTERM) while stage {stage} ran; running the same command again resumes"


def cause(outcome: supervisor.Outcome, plan: Plan) -> tuple[str, str]:
    """The status and one-line message for a worker that did not finish its phase."""
    if outcome.cause == "timeout":
        key = plan.settings.timeout_key(outcome.stage)
        return "timeout", (f"stage {outcome.stage} ran {outcome.stage_elapsed_s:.0f} s, past its deadline of "
                           f"{outcome.deadline_s:.0f} s (timeouts.{key}); worker killed")
    if outcome.cause == "out-of-memory":
        return "out-of-memory", (f"stage {outcome.stage}: the worker reached {size(outcome.peak_rss_bytes)} resident, "
                                 f"past the memory limit of {size(outcome.memory_limit_bytes)} (memory-limit); killed")
    if outcome.cause == "interrupted":
        return "interrupted", _stopped(outcome.stage)
    code = outcome.returncode
    if code is not None and -code in process_group.OUTSIDE_SIGNALS:
        status, message = process_group.killed_from_outside(-code, outcome.oom_kills, outcome.peak_rss_bytes)
        return status, f"stage {outcome.stage}: {message}" if status == "out-of-memory" else message
    if code is not None and code < 0:
        return "crashed", f"worker killed by signal {signal.Signals(-code).name}"
    return "crashed", f"worker exited with code {code}"


def log_tail(path: Path) -> list[str]:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    # A line can be megabytes (a model that prints without newlines): the record keeps its end.
    return [line if len(line) <= TAIL_LINE_CHARS else "…" + line[-TAIL_LINE_CHARS:] for line in lines[-LOG_TAIL_LINES:]]


# The longest line of a log's tail kept in a stage's record.
TAIL_LINE_CHARS = 2000
