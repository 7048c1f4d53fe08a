"""The fork server: one process per stack that imports torch and the stack's packages once, then forks a
child per phase (``python -P compat/worker.py fork-server JOB``; the parent's side is
upgrade_gate.run.supervisor.ForkServer).

A fresh interpreter per phase pays torch's and the exporter's imports each time (≈ 5 s warm, 13 s cold
for ExecuTorch 0.7, per process). Here a child starts with them done, and is otherwise what a fresh
worker is: its own process group (the supervisor's kills take it and what it starts), its log on its
stdout and stderr, the environment and working folder the parent asked for, SIGKILL when its parent
goes (``PR_SET_PDEATHSIG``, re-armed in the child by worker.py), and its exit status (a signal as
``-N``, as ``subprocess`` says it) sent to the parent, which cannot wait for a process it did not start.

Why a child cannot corrupt the server or the next phase: the server never runs a model or a thread
pool (it imports, builds what the adapter's ``warm_up`` says every first lowering builds, on one thread,
then only reads requests and reaps); every child is forked from that state, and what a child does to its
memory is its own copy (copy on write). A child closes the server's pipes before it runs anything, so it
cannot speak for the server. The server forks only while it has one Python thread and no more threads
than its imports left (a thread another library started would be copied as a lock held by nobody): with
more, it refuses, and the parent starts fresh workers instead.

Standard library only: this runs in a stack's venv before anything of the stack is imported.
"""

from __future__ import annotations

import json
import os
import select
import threading
from typing import Any

# How often the server looks for children that ended, between requests (the supervisor polls at 0.25 s).
REAP_S = 0.05


def serve(requests_fd: int, events_fd: int, preloaded: dict[str, str],
          os_threads: int | None = None) -> dict[str, Any] | None:
    """Answer the parent's requests until it closes its end; None then. Returns in each forked child,
    with the request it is to run (already in its process group, log, folder and environment). With
    ``os_threads``, the server also refuses to fork while it has more threads than that, counting those
    Python's ``threading`` does not see (a native pool)."""
    send(events_fd, "ready", pid=os.getpid(), threads=threading.active_count(), preloaded=preloaded)
    children: set[int] = set()
    buffer = b""
    while True:
        ready, _, _ = select.select([requests_fd], [], [], REAP_S)
        _reap(children, events_fd, block=False)
        if not ready:
            continue
        chunk = os.read(requests_fd, 1 << 16)
        if not chunk:  # the parent is done (or gone: then its children are being killed with it)
            _reap(children, events_fd, block=True)
            return None
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            request = json.loads(line)
            why = _unsafe_to_fork(os_threads)
            if why:
                send(events_fd, "refused", id=request["id"], why=why)
                continue
            request["server_pid"] = os.getpid()
            pid = os.fork()
            if pid == 0:
                _become(request, requests_fd, events_fd)
                return request
            try:  # as the child does: whichever runs first, the group exists before the parent hears of it
                os.setpgid(pid, pid)
            except OSError:
                pass  # the child already did, or already ended
            children.add(pid)
            send(events_fd, "started", id=request["id"], pid=pid)


def os_threads() -> int | None:
    """This process's threads as the kernel counts them (Linux), or None where it cannot tell."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return None


def _unsafe_to_fork(allowed: int | None) -> str:
    """Why forking now would copy a thread's locks into the child, or ''."""
    if threading.active_count() > 1:
        return f"the fork server has {threading.active_count()} threads; forking is safe with one"
    now = os_threads()
    if allowed is not None and now is not None and now > allowed:
        return (f"the fork server has {now} threads, {allowed} after its imports: something it ran since started "
                "a thread, and forking is safe with none")
    return ""


def _become(request: dict[str, Any], requests_fd: int, events_fd: int) -> None:
    """In the child: what a fresh worker started by ``subprocess`` would have."""
    os.setpgid(0, 0)
    os.close(requests_fd)
    os.close(events_fd)
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])


def _reap(children: set[int], events_fd: int, *, block: bool) -> None:
    for pid in list(children):
        try:
            done, status = os.waitpid(pid, 0 if block else os.WNOHANG)
        except ChildProcessError:
            done, status = pid, 0
        if done:
            children.discard(pid)
            send(events_fd, "exited", pid=pid, returncode=os.waitstatus_to_exitcode(status))


def send(events_fd: int, event: str, **fields: Any) -> None:
    data = (json.dumps({"event": event, **fields}) + "\n").encode()
    while data:
        data = data[os.write(events_fd, data):]
