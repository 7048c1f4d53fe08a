"""One worker process under watch: its stage's deadline, its memory, its parent.

The worker rewrites its phase file at every stage change, and the running stage
carries ``started_at``. Every ``POLL_S`` the supervisor reads that file and the
resident memory of the worker and its children, and kills the worker's process
group when the running stage is past its deadline (a ``forward()`` that hangs,
seed 002) or the group is past the memory limit (an export that would take the
machine down, seed 000). The worker cannot record either, so the caller
records the outcome on the stage that was running.

The worker also dies with its parent: it asks the kernel for SIGKILL when the
thread that started it goes away (``PR_SET_PDEATHSIG``, see compat/worker.py),
so a ``kill -9`` of nox leaves no export running into the report folder.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

POLL_S = 0.25
TERM_GRACE_S = 5.0
# The environment variable that tells the worker which process must outlive it.
PARENT_PID_ENV = "UPGRADE_GATE_PARENT_PID"
# The one that tells a server (measurement, fork) its two pipes: "requests-read-fd,events-write-fd".
CONTROL_FDS_ENV = "UPGRADE_GATE_CONTROL_FDS"
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
# A worker's log keeps its first and last this many bytes: a model whose import prints
# 10 MB would otherwise store them in every log of every phase, and again in the cache.
LOG_KEEP_BYTES = 2**20


class Process(Protocol):
    """A worker as the supervisor watches it: a ``subprocess.Popen``, or a fork server's child (ForkedProcess).
    Either leads its own process group, whose id is its pid."""

    pid: int
    returncode: int | None

    def wait(self, timeout: float | None = None) -> int: ...


# Workers running right now, so an interrupted run can stop those that other threads wait on.
_LIVE: set[Process] = set()
_LIVE_LOCK = threading.Lock()
# Set when the run is being stopped (Ctrl-C, SIGTERM): a worker that dies now was stopped by
# us, not by its model.
_INTERRUPTED = threading.Event()


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

    ``deadline_for(stage)`` gives the seconds a stage may run; ``first_stage``
    names the time before the phase file shows one. ``on_stage`` hears of each
    stage the phase file shows, as the poll sees it; ``on_poll`` is called at
    every poll (a caller's own look at what the process writes). With ``fork_server``, the worker is
    its child where it can be (the same command and environment as its own), else a fresh process.
    """
    env = {**env, PARENT_PID_ENV: str(os.getpid())}
    start = time.monotonic()
    watch = _StageWatch(phase_file, first_stage, start)
    oom_before = oom_kill_count()
    peak = 0
    cause: str | None = None
    with open(log_file, "wb") as log:
        # Its own process group, so a kill takes the worker and any child it started.
        forked = fork_server.start(argv, env=env, cwd=cwd, log_file=log_file) if fork_server is not None else None
        # A phase's worker (the runner's, which has a fork server) that would start as the run is being stopped —
        # it waited for the server while stop_all ran, or started after stop_all took its list — starts not, or stops.
        phase_of_run = fork_server is not None
        if phase_of_run and forked is None and _INTERRUPTED.is_set():
            return Outcome(returncode=None, cause="interrupted", stage=first_stage, stage_elapsed_s=0.0,
                           deadline_s=deadline_for(first_stage), elapsed_s=time.monotonic() - start, peak_rss_bytes=0,
                           memory_limit_bytes=memory_limit_bytes)
        process: Process = forked or subprocess.Popen(
            argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        with _LIVE_LOCK:
            _LIVE.add(process)
            stopping = phase_of_run and _INTERRUPTED.is_set()
        if stopping:
            stop_group(process)
        try:
            while True:
                try:
                    process.wait(timeout=POLL_S)
                    break
                except subprocess.TimeoutExpired:
                    pass
                peak = max(peak, tree_rss_bytes(process.pid))
                if peak > memory_limit_bytes:
                    cause = "out-of-memory"
                    stop_group(process, grace_s=0.0)
                    break
                stage, elapsed = watch.running()
                if on_stage is not None:
                    on_stage(stage)
                if on_poll is not None:
                    on_poll()
                if elapsed > deadline_for(stage):
                    cause = "timeout"
                    stop_group(process)
                    break
        except BaseException:  # Ctrl-C: take the worker down with us
            stop_group(process)
            raise
        finally:
            with _LIVE_LOCK:
                _LIVE.discard(process)
    cap_log(log_file)
    if cause is None and process.returncode != 0 and _INTERRUPTED.is_set():
        cause = "interrupted"
    stage, stage_elapsed = watch.running()
    return Outcome(
        returncode=process.returncode,
        cause=cause,
        stage=stage,
        stage_elapsed_s=stage_elapsed,
        deadline_s=deadline_for(stage),
        elapsed_s=time.monotonic() - start,
        peak_rss_bytes=peak,
        memory_limit_bytes=memory_limit_bytes,
        oom_kills=oom_kills_since(oom_before),
        forked=isinstance(process, ForkedProcess),
    )


def oom_kill_count() -> tuple[Path, int] | None:
    """The kernel's count of out-of-memory kills that could have taken our workers, and where it was read.

    A worker lives in our memory cgroup (children inherit it), and the kernel counts a kill
    there whether the cgroup's limit or the whole machine ran out (mm/oom_kill.c counts both
    the machine's ``oom_kill`` and the victim's cgroup's). So the cgroup's counter when it can
    be read — cgroup v2 ``memory.events``, v1 ``memory.oom_control`` — which other containers'
    kills do not move; else the machine's, ``/proc/vmstat``. A kill of anything else counted
    there in the same seconds cannot be told apart: the kernel does not say whom it killed.
    """
    for path in _oom_counter_files():
        count = oom_kill_count_at(path)
        if count is not None:
            return path, count
    return None


def _oom_counter_files() -> list[Path]:
    files = []
    try:
        groups = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        groups = []
    for line in groups:
        _, controllers, group = line.split(":", 2)
        if controllers == "" and (Path("/sys/fs/cgroup") / "cgroup.controllers").exists():
            files.append(Path("/sys/fs/cgroup") / group.lstrip("/") / "memory.events")
        elif "memory" in controllers.split(","):
            files.append(Path("/sys/fs/cgroup/memory") / group.lstrip("/") / "memory.oom_control")
    return [*files, Path("/proc/vmstat")]


def oom_kills_since(before: tuple[Path, int] | None) -> int | None:
    """How many out-of-memory kills the counter read ``before`` counted since; None if it cannot say."""
    if before is None:
        return None
    path, count = before
    now = oom_kill_count_at(path)
    return None if now is None else max(0, now - count)


def oom_kill_count_at(path: Path) -> int | None:
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
    except OSError:
        pass
    return None


def cap_log(path: Path, keep: int = LOG_KEEP_BYTES) -> None:
    """Keep a finished worker's log to its first and last ``keep`` bytes (cut at line ends),
    with one line saying how much was dropped between them. The start says what the worker
    was, the end how it ended; what a chatty model printed in between is not evidence."""
    try:
        size = path.stat().st_size
        if size <= 2 * keep + 4096:
            return
        partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
        with open(path, "rb") as log:
            head = log.read(keep)
            head = head[: head.rfind(b"\n") + 1] or head
            log.seek(size - keep)
            tail = log.read(keep)
            tail = tail[tail.find(b"\n") + 1:] if b"\n" in tail[:-1] else tail
        dropped = size - len(head) - len(tail)
        note = (f"[upgrade-gate: {dropped} bytes of this log dropped (its first {keep / 2**20:g} MiB and last "
                f"{keep / 2**20:g} MiB are kept)]\n").encode()
        try:
            with open(partial, "wb") as capped:
                capped.write(head + note + tail)
            os.replace(partial, path)
        finally:
            partial.unlink(missing_ok=True)
    except OSError:
        pass  # the log stays whole: a full disk is the next write's to report


def interrupted() -> bool:
    """Whether the run is being stopped (stop_all): no new worker should start."""
    return _INTERRUPTED.is_set()


def stop_all() -> None:
    """Kill every worker still running, and the fork servers: the run is being stopped."""
    _INTERRUPTED.set()
    with _LIVE_LOCK:
        live = list(_LIVE)
    for process in live:
        stop_group(process)
    for server in list(_FORK_SERVERS):
        server.close()


def stop_group(process: Process, grace_s: float = TERM_GRACE_S) -> None:
    """SIGTERM → wait → SIGKILL for the whole process group, as nox's popen does."""
    kill = (signal.SIGKILL, TERM_GRACE_S)
    steps = ((signal.SIGTERM, grace_s), kill) if grace_s else (kill,)
    for sig, grace in steps:
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of a process and its descendants (Linux /proc), 0 where unknown."""
    total, pending, seen = 0, [pid], set()
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        try:
            with open(f"/proc/{current}/statm", "rb") as stream:
                total += int(stream.read().split()[1]) * _PAGE_BYTES
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children", "rb") as stream:
                    pending.extend(int(child) for child in stream.read().split())
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile, or no children file on this kernel
    return total


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


# Signals a process gets from outside, not from a fault of its own code: a server
# ended by one was stopped by the machine or someone on it, not by the stack it runs.
OUTSIDE_SIGNALS = frozenset({signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP})


def killed_from_outside(signum: int, oom_kills: int | None, peak_rss_bytes: int) -> tuple[str, str]:
    """A worker ended by a signal upgrade-gate did not send: the status and message.

    A SIGKILL while the kernel counted an out-of-memory kill is the kernel's out-of-memory
    killer: the model's (or its export's) memory, a finding against the stack that ran it,
    like the memory limit's kill. Any other outside signal — a SIGKILL with no such kill
    counted (someone's ``kill -9``, a CI runner's clean-up), SIGTERM, SIGINT, SIGHUP — was
    the machine or someone on it: ``killed``, which is no one's failure; the evidence is
    missing (INCOMPLETE) and the same command runs it again.
    """
    name = signal.Signals(signum).name
    peak = f"peak resident memory {peak_rss_bytes / 2**30:.2f} GiB"
    if signum == signal.SIGKILL and oom_kills:
        return "out-of-memory", (f"worker killed by the kernel's out-of-memory killer (SIGKILL; it counted {oom_kills} "
                                 f"out-of-memory kill(s) while the worker ran; {peak})")
    counted = ("and the kernel counted no out-of-memory kill" if oom_kills == 0 else
               "the kernel's out-of-memory kills could not be read") if signum == signal.SIGKILL else ""
    return "killed", (f"worker killed by signal {name} from outside (not by upgrade-gate{', ' if counted else ''}"
                      f"{counted}; {peak})")


class ServerFailed(Exception):
    """A server that did not answer: it raised, crashed, hung or ran out of memory."""

    def __init__(self, status: str, stage: str, message: str, traceback_tail: list[str] | None = None) -> None:
        super().__init__(message)
        self.status = status  # "failed" | "crashed" | "killed" | "timeout" | "out-of-memory"
        self.stage = stage
        self.message = message
        self.traceback_tail = traceback_tail or []


class Server:
    """A worker that stays up and answers requests (the latency rounds), watched
    as ``run_supervised`` watches a phase: each step it announces has its
    deadline, its process group has the memory limit, and it dies with us.

    Requests and events are JSON lines over two pipes of their own, so whatever
    the model or the runtime prints to stdout goes to the log, not into the protocol.
    """

    def __init__(self, argv: list[str], *, env: dict[str, str], cwd: Path, log_file: Path,
                 deadline_for: Callable[[str], float], memory_limit_bytes: int, control_env: str,
                 deadline_key: Callable[[str], str] = str) -> None:
        self.deadline_for = deadline_for
        self.log_file = log_file
        self.deadline_key = deadline_key  # the setting that holds a step's deadline, for the message
        self.memory_limit_bytes = memory_limit_bytes
        self.peak_rss_bytes = 0
        self.stage = "start"
        self._since = time.monotonic()
        self._buffer = b""
        self._exit_asked = False
        self._oom_before = oom_kill_count()
        requests_read, self._requests = os.pipe()
        self._events, events_write = os.pipe()
        env = {**env, PARENT_PID_ENV: str(os.getpid()), control_env: f"{requests_read},{events_write}"}
        with open(log_file, "wb") as log:
            self.process = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                            start_new_session=True, pass_fds=(requests_read, events_write))
        os.close(requests_read)
        os.close(events_write)
        with _LIVE_LOCK:
            _LIVE.add(self.process)

    def request(self, command: dict[str, Any] | None, until: str) -> dict[str, Any]:
        """Send ``command`` (if any), then read events up to the one named ``until``."""
        if command is not None:
            try:
                os.write(self._requests, (json.dumps(command) + "\n").encode())
            except OSError:
                raise self._failure() from None
        while True:
            event = self._next_event()
            if event.get("event") == "stage":
                self.stage, self._since = str(event.get("stage")), time.monotonic()
            elif event.get("event") == "error":
                raise ServerFailed("failed", self.stage, f"{event.get('type')}: {event.get('message')}",
                                   [str(line) for line in event.get("traceback_tail") or []])
            elif event.get("event") == until:
                return event

    def ask_to_exit(self) -> None:
        """Ask the server to exit, without waiting: servers asked one after the other wind down side by side
        (an interpreter with torch loaded takes about half a second to end), and ``close`` reads the goodbye."""
        if self._exit_asked:
            return
        self._exit_asked = True
        try:
            os.write(self._requests, (json.dumps({"command": "exit"}) + "\n").encode())
        except OSError:
            pass  # gone already: ``close`` reads why

    def close(self) -> dict[str, Any] | None:
        """Ask the server to exit (if not asked yet); its last event, or None if it could not say goodbye."""
        self.ask_to_exit()
        try:
            return self.request(None, "exit")
        except ServerFailed:
            return None
        finally:
            self.stop()

    def stop(self) -> None:
        try:
            self.process.wait(timeout=TERM_GRACE_S)
        except subprocess.TimeoutExpired:
            stop_group(self.process)
        stop_group(self.process)  # a child it left behind
        for fd in (self._requests, self._events):
            try:
                os.close(fd)
            except OSError:
                pass
        with _LIVE_LOCK:
            _LIVE.discard(self.process)
        cap_log(self.log_file)

    def _next_event(self) -> dict[str, Any]:
        while b"\n" not in self._buffer:
            ready, _, _ = select.select([self._events], [], [], POLL_S)
            if ready:
                chunk = os.read(self._events, 1 << 16)
                if not chunk:
                    raise self._failure()
                self._buffer += chunk
                continue
            self.peak_rss_bytes = max(self.peak_rss_bytes, tree_rss_bytes(self.process.pid))
            if self.peak_rss_bytes > self.memory_limit_bytes:
                stop_group(self.process, grace_s=0.0)
                raise ServerFailed("out-of-memory", self.stage,
                                   f"step {self.stage}: the worker reached {self.peak_rss_bytes / 2**30:.2f} GiB "
                                   f"resident, past the memory limit of {self.memory_limit_bytes / 2**30:.2f} GiB "
                                   "(memory-limit); killed")
            elapsed, deadline = time.monotonic() - self._since, self.deadline_for(self.stage)
            if elapsed > deadline:
                stop_group(self.process)
                raise ServerFailed("timeout", self.stage, f"step {self.stage} ran {elapsed:.0f} s, past its deadline "
                                   f"of {deadline:.0f} s (timeouts.{self.deadline_key(self.stage)}); worker killed")
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def _failure(self) -> ServerFailed:
        """The server went away without a word."""
        try:
            code = self.process.wait(timeout=TERM_GRACE_S)
        except subprocess.TimeoutExpired:
            stop_group(self.process)
            code = self.process.returncode
        if code is not None and -code in OUTSIDE_SIGNALS:
            killed = killed_from_outside(-code, oom_kills_since(self._oom_before), self.peak_rss_bytes)
            return ServerFailed(killed[0], self.stage, killed[1])
        if code is not None and code < 0:
            return ServerFailed("crashed", self.stage, f"worker killed by signal {signal.Signals(-code).name}")
        return ServerFailed("crashed", self.stage, f"worker exited with code {code}")


# Fork servers running now, closed with the run when it is stopped.
_FORK_SERVERS: set[ForkServer] = set()


class ForkedProcess:
    """A child of the fork server, as the supervisor uses a ``Popen``: its pid (and process group), its exit
    status as the server reported it (``-N`` for signal N), and a wait for it."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._ended = threading.Event()

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(f"fork server child {self.pid}", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def poll(self) -> int | None:
        return self.returncode

    def ended(self, returncode: int) -> None:
        self.returncode = returncode
        self._ended.set()


class ForkServer:
    """One stack's fork server (compat/fork_server.py), started at the first worker it is asked for: it
    imports torch and the stack's packages once and forks a child per worker. Only a worker that a fresh
    process would run the same way is forked (the server's interpreter and script, the same environment);
    anything else — and every worker once the server could not start, died or refused — gets
    ``None`` from ``start``, and the caller starts a fresh process. So the server changes how long a
    worker takes to start, never what it does or how it is watched.

    The server is started by a thread of its own that then reads its events, so the kernel's
    ``PR_SET_PDEATHSIG`` (which fires when the thread that started a process ends) ties the server to this
    object's life; each child is tied to the server the same way (compat/worker.py).
    """

    def __init__(self, argv: list[str], *, serves: list[str], commands: Collection[str], env: dict[str, str],
                 cwd: Path, log_file: Path, ready_deadline_s: float) -> None:
        # ``serves`` + one of ``commands`` + its arguments: the workers it forks.
        self.argv, self.serves, self.commands, self.env, self.cwd = argv, serves, frozenset(commands), env, cwd
        self.log_file, self.ready_deadline_s = log_file, ready_deadline_s
        # Why it forks no more (None while it does): for the caller's log.
        self.broken: str | None = None
        self.ready: dict[str, Any] | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._requests = -1
        self._lock = threading.Lock()
        self._started = threading.Event()  # the ready event, or the server's end
        self._next_id = 0
        self._answers: dict[int, tuple[threading.Event, list[ForkedProcess | None]]] = {}
        self._children: dict[int, ForkedProcess] = {}
        self._thread: threading.Thread | None = None
        # The stack's other fork servers: launched with this one, so that a run that needs one needs the others
        # soon, and their imports overlap.
        self.siblings: list[ForkServer] = []

    def start(self, argv: list[str], *, env: dict[str, str], cwd: Path, log_file: Path) -> ForkedProcess | None:
        """``argv`` run as a child of the server, or None: start a fresh process instead."""
        own = {key: value for key, value in env.items() if key != PARENT_PID_ENV}
        command = argv[len(self.serves):len(self.serves) + 1]
        if argv[:len(self.serves)] != self.serves or not set(command) & self.commands or own != self.env \
                or self.broken is not None:
            return None
        for server in (self, *self.siblings):  # they import at once, each on its own core if there is one
            server.launch()
        if not self._started.wait(self.ready_deadline_s) and self.broken is None:
            self._fail(f"it was not ready within {self.ready_deadline_s:.0f} s (timeouts.start)")
        if self.broken is not None:
            return None
        answered, slot = threading.Event(), list[ForkedProcess | None]()
        with self._lock:
            request_id, self._next_id = self._next_id, self._next_id + 1
            self._answers[request_id] = (answered, slot)
            request = {"id": request_id, "argv": argv[len(self.serves):], "cwd": str(cwd),
                       "env": own, "log": str(log_file)}  # worker.py sets the parent to die with: the server
            try:
                os.write(self._requests, (json.dumps(request) + "\n").encode())
            except OSError:
                pass  # the server is gone: its end answers every request with None
        answered.wait()
        return slot[0] if slot else None

    def launch(self) -> None:
        """Start the server (its imports), if it is not started: ``start`` waits for it to be ready."""
        with self._lock:
            if self._thread is None:
                _FORK_SERVERS.add(self)
                self._thread = threading.Thread(target=self._run, name="fork-server", daemon=True)
                self._thread.start()

    def close(self) -> None:
        """No more workers: the server reaps its children and exits (killed if it does not)."""
        with self._lock:
            requests, self._requests = self._requests, -1
            process = self._process
        if requests >= 0:
            os.close(requests)
        if self._thread is not None:
            self._thread.join(TERM_GRACE_S)
        if process is not None and process.poll() is None:
            stop_group(process)
        _FORK_SERVERS.discard(self)
        cap_log(self.log_file)

    def _fail(self, why: str) -> None:
        self.broken = self.broken or why
        with self._lock:
            process = self._process
        if process is not None:
            stop_group(process, grace_s=0.0)

    def _run(self) -> None:
        requests_read, requests_write = os.pipe()
        events_read, events_write = os.pipe()
        env = {**self.env, PARENT_PID_ENV: str(os.getpid()), CONTROL_FDS_ENV: f"{requests_read},{events_write}"}
        try:
            with open(self.log_file, "wb") as log:
                process = subprocess.Popen(self.argv, env=env, cwd=self.cwd, stdin=subprocess.DEVNULL, stdout=log,
                                           stderr=log, start_new_session=True, pass_fds=(requests_read, events_write))
        except OSError as error:
            self.broken = f"it did not start ({error})"
            process = None
        finally:
            os.close(requests_read)
            os.close(events_write)
        with self._lock:
            self._process, self._requests = process, requests_write
        try:
            if process is not None:
                self._read_events(events_read)
        finally:
            os.close(events_read)
            self._ended(process)

    def _read_events(self, events: int) -> None:
        buffer = b""
        while True:
            chunk = os.read(events, 1 << 16)
            if not chunk:
                return
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                event = json.loads(line)
                kind = event.get("event")
                if kind == "ready":
                    self.ready = event
                    self._started.set()
                elif kind in ("started", "refused"):
                    child = ForkedProcess(int(event["pid"])) if kind == "started" else None
                    if child is not None:
                        self._children[child.pid] = child
                    else:
                        self.broken = str(event.get("why"))
                    answered, slot = self._answers.pop(int(event["id"]))
                    slot.append(child)
                    answered.set()
                elif kind == "exited" and (child := self._children.pop(int(event["pid"]), None)) is not None:
                    child.ended(int(event["returncode"]))

    def _ended(self, process: subprocess.Popen[bytes] | None) -> None:
        """The server is gone: every request still waiting falls back to a fresh process, and a child it
        could not report on was killed with it (its PR_SET_PDEATHSIG), which is what its status says."""
        code = process.wait() if process is not None else None
        if self.broken is None:
            self.broken = f"it ended (exit status {code}; {self.log_file.name})"
        self._started.set()
        with self._lock:
            answers, self._answers = list(self._answers.values()), {}
            requests, self._requests = self._requests, -1
        if requests >= 0:
            os.close(requests)
        for answered, _ in answers:
            answered.set()
        for child in list(self._children.values()):
            try:
                os.killpg(child.pid, signal.SIGKILL)  # in case it outran its PR_SET_PDEATHSIG
            except OSError:
                pass
            child.ended(-signal.SIGKILL)
        self._children.clear()
