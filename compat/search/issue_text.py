"""A reproducer run where it was written, and the issue text beside it (ISSUE.md): what a team pastes into
the backend's tracker — the operator and backend, the versions and the CPU, what the reproducer printed as
lowered and with the remedy, expected against actual, and the remedy's lines as the workaround.

The reproducer runs in this worker's own interpreter (torch and the stack's packages are imported already),
as ``python repro.py [--with-remedy]`` would: its printed line and exit status are what the text quotes. One that
may take the process down with it (a native runtime's assertion: mobileone's call alone) runs in a Python of its
own (``isolated``), its abort an exit status like any other."""

from __future__ import annotations

import contextlib
import io
import os
import platform
import runpy
import signal
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from ..common import cpu_and_isa
from .quoting import markdown_fence

ISSUE = "ISSUE.md"
EXITS = {0: "within the threshold", 1: "differs", 3: "could not run"}
FAILS_AS_FOUND = "fails as found"  # a reproducer of a method that did not lower, exit 1 (executorch_diagnose.py)


def run_reproducer(folder: Path, *args: str, isolated: bool = False) -> dict[str, Any]:
    """``python repro.py *args`` in this process (``isolated``: in a Python of its own, this one's): its exit status
    (a signal's as ``-N``) and its last printed line."""
    script = folder / "repro.py"
    if isolated:
        return _run_apart(script, args)
    printed = io.StringIO()
    saved = sys.argv
    sys.argv = [str(script), *args]
    try:
        with contextlib.redirect_stdout(printed):
            runpy.run_path(str(script), run_name="__main__")
        code: Any = 0
    except SystemExit as stop:
        code = stop.code if stop.code is not None else 0
    except Exception as failure:  # noqa: BLE001 - a script that breaks outside its own guard: recorded, not raised
        said = " ".join(str(failure).split())[:500]  # one line, as the reproducer's own guard prints it
        code, printed = 3, io.StringIO(f"could not run: {type(failure).__name__}: {said}")
    finally:
        sys.argv = saved
    lines = printed.getvalue().strip().splitlines()
    return {"args": list(args), "exit": code if isinstance(code, int) else 1, "said": lines[-1][:500] if lines else ""}


def _run_apart(script: Path, args: tuple[str, ...]) -> dict[str, Any]:
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    try:
        done = subprocess.run([sys.executable, str(script), *args], cwd=script.parent, capture_output=True, text=True,
                              env=env, timeout=900, check=False)
    except subprocess.TimeoutExpired:
        return {"args": list(args), "exit": 3, "said": "could not run: it did not finish in 900 s"}
    lines = done.stdout.strip().splitlines()
    said = lines[-1] if lines else ""
    if done.returncode < 0:  # killed by a signal: the runtime's own last words are on stderr
        last = (done.stderr.strip().splitlines() or [""])[-1]
        name = signal.Signals(-done.returncode).name if -done.returncode in signal.valid_signals() else (
            f"signal {-done.returncode}")
        said = f"aborted by {name}" + (f": {last}" if last else "")
    return {"args": list(args), "exit": done.returncode, "said": said[:500]}


def environment(packages: tuple[str, ...]) -> list[str]:
    """The versions and the machine, as a tracker asks for them."""
    found = []
    for name in packages:
        loaded = getattr(sys.modules.get(name), "__version__", None)  # torch's says which build: 2.8.0+cu128
        with contextlib.suppress(PackageNotFoundError):  # the legacy stack has no executorch
            found.append(f"{name} {loaded if isinstance(loaded, str) else version(name)}")
    cpu, flags = cpu_and_isa()
    return [", ".join(found), f"Python {platform.python_version()}, {platform.system()} {platform.machine()}",
            f"CPU: {cpu}" + (f"; ISA flags: {' '.join(flags)}" if flags else "")]


def write_issue(folder: Path, *, title: str, what: str, expected: str, runs: list[dict[str, Any]], remedy: str,
                remedy_judged: str, machine: list[str]) -> None:
    """ISSUE.md beside the reproducer (``machine``: the lines ``environment()`` gives). ``title``, ``what`` and
    ``remedy_judged`` are Markdown whose quoted names are code spans already (compat/search/quoting.py); what the
    reproducer printed and the remedy's lines are quoted here, in fences no line of theirs can close."""
    quoted = []
    for run in runs:
        command = " ".join(["python repro.py", *run["args"]])
        said = FAILS_AS_FOUND if FAILS_AS_FOUND in run["said"] else EXITS.get(run["exit"], "could not run")
        quoted += [f"$ {command}", run["said"], f"(exit {run['exit']}: {said})", ""]
    text = "\n".join([
        f"# {title}", "",
        "## What happens", "", what, "",
        "## To reproduce", "",
        "`repro.py` and its inputs are attached (torch and the backend's packages only). Run here, it printed:", "",
        markdown_fence("\n".join(quoted[:-1])), "",
        "## Expected", "", expected, "",
        "## Actual", "", markdown_fence(runs[0]["said"]) if runs else "not run", "",
        "## Workaround", "", remedy_judged, "", markdown_fence(remedy.rstrip(), "python"), "",
        "## Environment", "", *(f"- {line}" for line in machine), "",  # what this machine's packages and CPU say
        "Found and written by upgrade-gate; the reproducer was run where it was written, as above.", ""])
    # A message may hold a lone surrogate (a file name not in UTF-8, decoded by os.fsdecode): written as its escape.
    (folder / ISSUE).write_text(text, encoding="utf-8", errors="backslashreplace")
