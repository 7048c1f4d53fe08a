"""The parent's side of a measurement server (compat/measure_server.py): a worker that stays up and answers
requests, each step under its deadline and the group under the memory limit."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from upgrade_gate.run import process_group
from upgrade_gate.run.process_group import PARENT_PID_ENV, POLL_S, TERM_GRACE_S, cap_log, stop_group


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
        self._oom_before = process_group.oom_kill_count()
        requests_read, self._requests = os.pipe()
        self._events, events_write = os.pipe()
        env = {**env, PARENT_PID_ENV: str(os.getpid()), control_env: f"{requests_read},{events_write}"}
        with open(log_file, "wb") as log:
            self.process = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                            start_new_session=True, pass_fds=(requests_read, events_write))
        os.close(requests_read)
        os.close(events_write)
        process_group.track(self.process)

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
        process_group.forget(self.process)
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
            self.peak_rss_bytes = max(self.peak_rss_bytes, process_group.tree_rss_bytes(self.process.pid))
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
        if code is not None and -code in process_group.OUTSIDE_SIGNALS:
            oom_kills = process_group.oom_kills_since(self._oom_before)
            killed = process_group.killed_from_outside(-code, oom_kills, self.peak_rss_bytes)
            return ServerFailed(killed[0], self.stage, killed[1])
        if code is not None and code < 0:
            return ServerFailed("crashed", self.stage, f"worker killed by signal {signal.Signals(-code).name}")
        return ServerFailed("crashed", self.stage, f"worker exited with code {code}")

