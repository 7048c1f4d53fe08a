"""The parent's side of a stack's fork server (compat/fork_server.py): workers forked from an interpreter that
has imported torch once, watched as fresh processes are."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from collections.abc import Collection
from pathlib import Path
from typing import Any

from upgrade_gate.run.process_group import CONTROL_FDS_ENV, PARENT_PID_ENV, TERM_GRACE_S, cap_log, stop_group

# Fork servers running now, closed with the run when it is stopped.
_FORK_SERVERS: set[ForkServer] = set()


class ForkedProcess:
    """A child of the fork server, as the supervisor uses a ``Popen`` (``-N`` for signal N, as the server says)."""

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
    """One stack's fork server, started at the first worker it is asked for. Only a worker that a fresh process
    would run the same way is forked; anything else, and every worker once the server failed, gets ``None`` from
    ``start``: the server changes how long a worker takes to start, never what it does or how it is watched.

    A thread of its own starts it and reads its events, so ``PR_SET_PDEATHSIG`` (which fires when the thread
    that started a process ends) ties the server to this object's life.
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
        """Every request still waiting falls back to a fresh process; a child it could not report on was killed
        with it (its PR_SET_PDEATHSIG), which is what its status says."""
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


def close_all() -> None:
    """Close every fork server still running: the run is being stopped."""
    for server in list(_FORK_SERVERS):
        server.close()
