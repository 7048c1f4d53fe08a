"""Where a session is, while it runs: a live `rich` view in a terminal; anywhere else (CI, a pipe) one plain
line per event, so a log file reads in order."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

from rich.console import Console
from rich.live import Live
from rich.table import Table


class Progress:
    """``total`` tasks (a phase of a model in a stack, or a measurement), several at once."""

    def __init__(self, title: str, total: int, *, log: Callable[[str], Any] = print,
                 console: Console | None = None, stream: TextIO | None = None) -> None:
        self.title = title
        self.total = total
        self.done = 0
        self.started = time.monotonic()
        self.running: dict[str, tuple[str, float]] = {}  # task -> (stage, since)
        self._lines: dict[str, float] = {}  # task -> when its last stage line was written
        self._lock = threading.Lock()
        self._plain_log = log
        self.console = console or Console(stderr=True, file=stream)
        self._live: Live | None = None
        if self.console.is_terminal and not self.console.is_dumb_terminal:
            self._live = Live(self._view(), console=self.console, refresh_per_second=4, transient=True,
                              get_renderable=self._view)
            self._live.start()

    # -- events
    def start(self, task: str) -> None:
        with self._lock:
            self.running[task] = ("start", time.monotonic())
        self._event(f"{task} …")

    def add(self, tasks: int = 1) -> None:
        """Tasks found on the way (a diagnose phase, decided by what the runtime phase found)."""
        with self._lock:
            self.total += tasks

    def stage(self, task: str, stage: str, *, lines_every_s: float = 0.0) -> None:
        """``task`` is at ``stage`` now. A task whose stage changes often (one test after another)
        passes ``lines_every_s``: a plain line at most that often, the live view shows each."""
        now = time.monotonic()
        with self._lock:
            if task not in self.running or self.running[task][0] == stage:
                return
            self.running[task] = (stage, now)
            if now - self._lines.get(task, -lines_every_s) < lines_every_s:
                return
            self._lines[task] = now
        self._event(f"{task}: {stage}")

    def finish(self, task: str, outcome: str) -> None:
        with self._lock:
            self.running.pop(task, None)
            self.done += 1
        self._event(f"{task} {outcome}", always=True)

    def log(self, message: str) -> None:
        """A log line: above the live view in a terminal, as it is elsewhere."""
        if self._live is not None:
            self.console.print(message, markup=False, highlight=False)
        else:
            self._plain_log(message)

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
        self._plain_log(f"{self.title}: {self.done}/{self.total} finished, {_clock(time.monotonic() - self.started)}")

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- output
    def _event(self, text: str, *, always: bool = False) -> None:
        """Every event on its own line; in a terminal only the ends, the view shows the rest."""
        line = f"[{self.done}/{self.total} {_clock(time.monotonic() - self.started)}] {text}"
        if self._live is None:
            self._plain_log(line)
        elif always:
            self.console.print(line, markup=False, highlight=False)

    def _view(self) -> Table:
        now = time.monotonic()
        table = Table(title=f"{self.title}: {self.done}/{self.total} done, {_clock(now - self.started)}",
                      title_justify="left", expand=False)
        for column in ("stack", "model", "phase", "stage", "elapsed"):
            table.add_column(column)
        with self._lock:
            rows = list(self.running.items())
        for task, (stage, since) in rows:
            stack, model, phase = (task.split(": ") + ["", "", ""])[:3]
            table.add_row(stack, model, phase, stage, _clock(now - since))
        return table


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}:{secs:02d}"
