"""A worker's process group, as the run handles every one of them: stopped in steps, its resident memory
summed, its log capped, its end by an outside signal explained; and the run's list of those alive, so an
interrupted run stops them all."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from pathlib import Path
from typing import Protocol

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


def track(process: Process) -> bool:
    """Count ``process`` among the live ones; whether the run is being stopped (it must stop too)."""
    with _LIVE_LOCK:
        _LIVE.add(process)
        return _INTERRUPTED.is_set()


def forget(process: Process) -> None:
    with _LIVE_LOCK:
        _LIVE.discard(process)


def interrupted() -> bool:
    """Whether the run is being stopped (supervisor.stop_all): no new worker should start."""
    return _INTERRUPTED.is_set()


def stop_live() -> None:
    """Kill every worker still running: the run is being stopped."""
    _INTERRUPTED.set()
    with _LIVE_LOCK:
        live = list(_LIVE)
    for process in live:
        stop_group(process)


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


