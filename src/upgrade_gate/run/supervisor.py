"""One worker process under watch: every ``POLL_S`` its phase file's running stage and its group's memory, its
group killed past the stage's deadline (a ``forward()`` that hangs, seed 002) or the memory limit (an export that
would take the machine down, seed 000). The worker cannot record either: the caller records it on the running stage.
The worker also dies with its parent (``PR_SET_PDEATHSIG``, compat/worker.py): a ``kill -9`` of nox leaves none.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from upgrade_gate.run import fork_server as fork_servers
from upgrade_gate.run import process_group
from upgrade_gate.run.fork_server import ForkedProcess, ForkServer
from upgrade_gate.run.process_group import PARENT_PID_ENV, POLL_S, Process, cap_log, stop_group, tree_rss_bytes


@dataclass(frozen=True, kw_only=True, slots=True)
class Outcome:
    """How a worker ended."""

    returncode: int | None
    # None when it ended by itself; "timeout" or "out-of-memory" when the supervisor killed it,
    # "interrupted" when the run was being stopped.
    cause: str | None
    # The stage that was running at the end ("start" before the first one).
    stage: str
    stage_elapsed_s: float
    deadline_s: float
    elapsed_s: float
    peak_rss_bytes: int
    memory_limit_bytes: int
    # The kernel's out-of-memory kills counted while the worker ran (``oom_kills``), or None
    # when no counter could be read; with a SIGKILL we did not send, > 0 says who sent it.
    oom_kills: int | None = None
    # Forked by the stack's fork server (its imports done), not a fresh interpreter.
    forked: bool = False

    @property
    def finished(self) -> bool:
        return self.cause is None and self.returncode == 0


def run_supervised(
    argv: list[str],
    *,
    env: dict[str, str],
    cwd: Path,
    log_file: Path,
    phase_file: Path | None,
    deadline_for: Callable[[str], float],
    memory_limit_bytes: int,
    first_stage: str = "start",
    on_stage: Callable[[str], Any] | None = None,
    on_poll: Callable[[], Any] | None = None,
    fork_server: ForkServer | None = None,
) -> Outcome:
    """Run ``argv`` to its end or until a deadline or the memory limit; never raises for the worker's sake.
    ``first_stage`` names the time before the phase file shows one; ``on_poll`` is a caller's own look at what
    the process writes. With ``fork_server``, the worker is its child where it can be, else a fresh process.
    """
    env = {**env, PARENT_PID_ENV: str(os.getpid())}
    start = time.monotonic()
    watch = _StageWatch(phase_file, first_stage, start)
    oom_before = process_group.oom_kill_count()
    with open(log_file, "wb") as log:
        # Its own process group, so a kill takes the worker and any child it started.
        forked = fork_server.start(argv, env=env, cwd=cwd, log_file=log_file) if fork_server is not None else None
        # A phase's worker (the runner's, which has a fork server) that would start as the run is being stopped —
        # it waited for the server while stop_all ran, or started after stop_all took its list — starts not, or stops.
        phase_of_run = fork_server is not None
        if phase_of_run and forked is None and process_group.interrupted():
            return Outcome(returncode=None, cause="interrupted", stage=first_stage, stage_elapsed_s=0.0,
                           deadline_s=deadline_for(first_stage), elapsed_s=time.monotonic() - start, peak_rss_bytes=0,
                           memory_limit_bytes=memory_limit_bytes)
        process: Process = forked or subprocess.Popen(
            argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        if process_group.track(process) and phase_of_run:
            stop_group(process)
        try:
            cause, peak = _watch(process, watch, deadline_for, memory_limit_bytes, on_stage, on_poll)
        except BaseException:  # Ctrl-C: take the worker down with us
            stop_group(process)
            raise
        finally:
            process_group.forget(process)
    cap_log(log_file)
    if cause is None and process.returncode != 0 and process_group.interrupted():
        cause = "interrupted"
    stage, stage_elapsed = watch.running()
    return Outcome(returncode=process.returncode, cause=cause, stage=stage, stage_elapsed_s=stage_elapsed,
                   deadline_s=deadline_for(stage), elapsed_s=time.monotonic() - start, peak_rss_bytes=peak,
                   memory_limit_bytes=memory_limit_bytes, oom_kills=process_group.oom_kills_since(oom_before),
                   forked=isinstance(process, ForkedProcess))


def _watch(process: Process, watch: _StageWatch, deadline_for: Callable[[str], float], memory_limit_bytes: int,
           on_stage: Callable[[str], Any] | None, on_poll: Callable[[], Any] | None) -> tuple[str | None, int]:
    """Poll ``process`` to its end or until the supervisor kills it: why it killed it (None if it did not),
    and the peak resident memory of its group."""
    peak = 0
    while True:
        try:
            process.wait(timeout=POLL_S)
            return None, peak
        except subprocess.TimeoutExpired:
            pass
        peak = max(peak, tree_rss_bytes(process.pid))
        if peak > memory_limit_bytes:
            stop_group(process, grace_s=0.0)
            return "out-of-memory", peak
        stage, elapsed = watch.running()
        if on_stage is not None:
            on_stage(stage)
        if on_poll is not None:
            on_poll()
        if elapsed > deadline_for(stage):
            stop_group(process)
            return "timeout", peak


def stop_all() -> None:
    """Kill every worker still running, and the fork servers: the run is being stopped."""
    process_group.stop_live()
    fork_servers.close_all()


class _StageWatch:
    """Which stage the worker is in and for how long, from its phase file."""

    def __init__(self, phase_file: Path | None, first_stage: str, start: float) -> None:
        self.phase_file = phase_file
        self.stage = first_stage
        self.since = start
        self._mtime_ns = -1

    def running(self) -> tuple[str, float]:
        self._refresh()
        return self.stage, time.monotonic() - self.since

    def _refresh(self) -> None:
        if self.phase_file is None:
            return
        try:
            mtime_ns = self.phase_file.stat().st_mtime_ns
            if mtime_ns == self._mtime_ns:
                return
            data = json.loads(self.phase_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return  # not written yet (still "start"), or being replaced: next poll
        self._mtime_ns = mtime_ns
        running = [s for s in data.get("stages", []) if s.get("status") == "running"]
        if running:
            stage = str(running[-1].get("stage"))
            if stage != self.stage:
                # The worker's wall-clock start, in this process's monotonic time.
                started_at = running[-1].get("started_at")
                age = time.time() - started_at if isinstance(started_at, (int, float)) else 0.0
                self.stage, self.since = stage, time.monotonic() - max(age, 0.0)
        elif self.stage != "finish":
            # Between the last stage and exit: writing the last record, freeing memory.
            self.stage, self.since = "finish", time.monotonic()

