"""upgrade-gate's pytest plugin, loaded into the team's test run in each stack (upgrade_gate/project/session.py
puts this folder on PYTHONPATH and adds ``-p upgrade_gate_pytest`` to a pytest command).

It writes two files the JUnit XML has no room for:

* progress — tests collected, finished, and those running, rewritten as each test starts, so the
  parent can show how far a silent run is;
* warnings — every warning pytest recorded, counted per test, category, message and place, written
  when the session ends.

It only watches: every hook swallows its own errors, so the team's outcomes are what they would be
without it. It uses the standard library and pytest, and nothing of upgrade-gate.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest

SCHEMA_VERSION = "1.0"
# The files to write; the variables are removed once read, so that a pytest the tests start
# themselves (pytester, a subprocess) writes nothing, even if it loads the plugin.
PROGRESS_ENV = "UPGRADE_GATE_PYTEST_PROGRESS"
WARNINGS_ENV = "UPGRADE_GATE_PYTEST_WARNINGS"
# The team's own PYTHONPATH (JSON, null for unset), put back for its tests.
RESTORE_ENV = "UPGRADE_GATE_PYTEST_RESTORE"
# A test that warns in a loop must not make the file huge: distinct entries beyond this are counted only.
MAX_ENTRIES = 2000
MESSAGE_CHARS = 1000
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class _Watch:
    def __init__(self, progress: Path | None, warnings: Path | None, rootdir: Path) -> None:
        self.progress_file = progress
        self.warnings_file = warnings
        self.rootdir = rootdir
        self.collected: int | None = None
        self.done = 0
        self.running: list[str] = []
        self.counts: dict[tuple[str, str, str, str, str], int] = {}
        self.dropped = 0
        self.captured = True  # pytest's warnings plugin is on, so warnings are recorded at all

    def write_progress(self, finished: bool = False) -> None:
        if self.progress_file is not None:
            _write(self.progress_file, {"schema_version": SCHEMA_VERSION, "collected": self.collected,
                                        "done": self.done, "running": self.running, "finished": finished,
                                        "updated_at": time.time()})

    def record(self, message: Any, when: str, nodeid: str) -> None:  # a warnings.WarningMessage
        category = message.category
        name = category.__name__ if category.__module__ == "builtins" else \
            f"{category.__module__}.{category.__qualname__}"
        text = _ANSI.sub("", str(message.message)).replace(sys.prefix, "<venv>")
        key = (nodeid, when, name, text[:MESSAGE_CHARS], f"{self._where(message.filename)}:{message.lineno}")
        if key in self.counts or len(self.counts) < MAX_ENTRIES:
            self.counts[key] = self.counts.get(key, 0) + 1
        else:
            self.dropped += 1

    def _where(self, filename: str) -> str:
        path = Path(filename)
        if path.is_absolute() and path.is_relative_to(self.rootdir):
            return path.relative_to(self.rootdir).as_posix()
        return filename.replace(sys.prefix, "<venv>")

    def write_warnings(self) -> None:
        if self.warnings_file is None:
            return
        entries = [{"test": test, "when": when, "category": category, "message": text, "location": where,
                    "count": count} for (test, when, category, text, where), count in self.counts.items()]
        _write(self.warnings_file, {"schema_version": SCHEMA_VERSION, "captured": self.captured,
                                    "warnings": entries, "dropped": self.dropped})


_WATCH: _Watch | None = None
# Every hook runs under this: an error of the plugin's must not become the team's failure
# (a count it could not make is said by the parent as unknown).
_QUIETLY = contextlib.suppress(Exception)


def _write(path: Path, data: dict[str, Any]) -> None:
    """Whole or not at all: the parent reads the file while the tests run."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    partial.write_text(json.dumps(data), encoding="utf-8")
    os.replace(partial, path)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: Any) -> None:
    global _WATCH
    with _QUIETLY:
        for name, value in json.loads(os.environ.pop(RESTORE_ENV, "{}")).items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        progress, warnings = os.environ.pop(PROGRESS_ENV, None), os.environ.pop(WARNINGS_ENV, None)
        if hasattr(config, "workerinput") or not (progress or warnings):
            return  # an xdist worker (the controller hears of its tests and warnings), or a nested pytest
        watch = _Watch(Path(progress) if progress else None, Path(warnings) if warnings else None,
                       Path(str(getattr(config, "rootpath", None) or config.rootdir)))
        watch.captured = config.pluginmanager.has_plugin("warnings")
        watch.write_progress()
        _WATCH = watch


def pytest_collection_finish(session: Any) -> None:
    with _QUIETLY:
        if _WATCH is not None:
            _WATCH.collected = len(session.items)
            _WATCH.write_progress()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    with _QUIETLY:
        if _WATCH is not None:  # under xdist the controller does not collect: each worker says what it did
            _WATCH.collected = len(ids)
            _WATCH.write_progress()


def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    with _QUIETLY:
        if _WATCH is not None:
            _WATCH.running.append(nodeid)
            _WATCH.write_progress()


def pytest_runtest_logfinish(nodeid: str, location: Any) -> None:
    with _QUIETLY:
        if _WATCH is not None and nodeid in _WATCH.running:
            _WATCH.running.remove(nodeid)
            _WATCH.done += 1


@pytest.hookimpl(optionalhook=True)  # pytest 6.0 and later
def pytest_warning_recorded(warning_message: Any, when: str, nodeid: str, location: Any) -> None:
    with _QUIETLY:
        if _WATCH is not None:
            _WATCH.record(warning_message, when, nodeid)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    with _QUIETLY:
        if _WATCH is not None:
            _WATCH.write_progress(finished=True)
            _WATCH.write_warnings()
