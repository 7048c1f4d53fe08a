"""Real runs of the tool: nox with this checkout's noxfile, in a team's folder the test makes."""

from __future__ import annotations

import getpass
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from upgrade_gate import layout
from upgrade_gate.config.plan import load_plan

REPO = Path(__file__).resolve().parents[2]


# The stages that explain a result without gating it (the other backends' export-only tries, the
# per-operator profile: seconds each per model), the settings that turn them off (with the culprit
# search's phase, a minute or more where an artifact departs), and their records then.
EXPLAINING = ("backends", "profile")
EXPLAINING_OFF = "backends-budget = 0\nprofile = false\ndiagnose-budget = 0\n"
TURNED_OFF = {"backends": "turned off (backends-budget = 0)", "profile": "turned off (profile = false)"}
# The shortest measurement: one thread count, the fewest rounds an interval allows, a short budget.
QUICK_TIMING = "threads = [1]\nrounds = 6\ntime-budget = 0.2\n"
# For a run whose test is about something else than timing or diagnosis.
QUICK = QUICK_TIMING + EXPLAINING_OFF


def nox(*args: str, env: dict[str, str] | None = None, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nox", "--noxfile", str(REPO / "noxfile.py"), "--no-color", *args],
        capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})},
    )


def ended_as(result: subprocess.CompletedProcess[str], out: Path, *expected: int, cache: Path | None = None) -> bool:
    """The run ended with one of the ``expected`` exit statuses — or, on a machine others keep busy (a CI
    runner shared with other jobs), with exactly the designed INCOMPLETE: every reason it gives is the
    latency gates' "machine busy" (and the advice to run again), and it shows what a busy run must
    (``busy_run_shows``; ``cache``: the run's result cache, the default one's where None). For a test whose
    subject is not latency. Returns whether it was that busy INCOMPLETE, so the test can leave out what a
    latency verdict shows."""
    if result.returncode in expected:
        return False
    verdict = out / "verdict.json"
    reasons = json.loads(verdict.read_text()).get("incomplete", []) if verdict.is_file() else []
    busy = (result.returncode == 3 and bool(reasons) and reasons[0].startswith("machine busy: ")
            and all(r.startswith("machine busy: ") or r.startswith("run `") for r in reasons))
    assert busy, (expected, result.returncode, reasons, result.stderr[-3000:])
    busy_run_shows(out, cache)
    return True


# A latency gate's note where a busy machine left too few quiet rounds at a thread count (judge/_latency_gates.py).
BUSY_NOTE = re.compile(r"(\d+) thread\(s\): machine busy: (\d+) of (\d+) rounds quiet; an interval needs (\d+) "
                       r"quiet rounds")


def busy_run_shows(out: Path, cache: Path | None = None) -> None:
    """What a report a busy machine left INCOMPLETE must show (issue 61, D3), whatever else its test checks: for
    each thread count a latency gate was left incomplete at, its reason (the quiet rounds and how few, as its
    measurement file counts them; the repeats ran out), no stored measurement (the result cache ``cache`` holds
    none of these rounds under the file's key — an earlier, quiet one's may be there — so the next run does not
    reuse them), and the verdict's one line naming the model at that thread count, with the advice to measure
    again, then to resume."""
    verdict = json.loads((out / "verdict.json").read_text())
    busy, resume = verdict["incomplete"][0], verdict["incomplete"][-1]
    assert busy.startswith("machine busy: too few quiet rounds to judge latency (an interval needs "), busy
    assert busy.endswith(". Measure again when the machine is quieter: `--remeasure` times again without exporting")
    assert resume.startswith("run `") and resume.endswith(
        "` again with the same options: it reuses what finished and redoes the rest"), resume
    left = [(gate["model"], note) for gate in verdict["gates"] if gate["gate"] == "latency"
            and gate["status"] == "incomplete" for note in BUSY_NOTE.finditer(gate["note"])]
    assert left, verdict["gates"]
    results = cache if cache is not None else layout.cache_root() / "results"
    for model, note in left:
        threads, quiet, tried, needs = (int(figure) for figure in note.groups())
        measurement = layout.measurement_file(out, model, threads)
        measured = json.loads(measurement.read_text())
        assert sum(not r["disturbed"] for r in measured["rounds"]) == quiet < needs and len(measured["rounds"]) == tried
        assert measured["ended"] == "repeats ran out", (model, threads, measured["ended"])
        assert f"{model} at " in busy and f"{threads} thread(s) ({quiet} of {tried} quiet" in busy, busy
        stored = results / "+".join(measured["order"]) / model / f"measure-t{threads}" / str(measured["key"])
        kept = json.loads((stored / measurement.name).read_text()) if stored.is_dir() else {}
        assert kept.get("rounds") != measured["rounds"], stored


def load(out: Path, name: str) -> dict:
    return json.loads((out / name).read_text())


def user_project(tmp_path: Path, config: str) -> dict[str, str]:
    (tmp_path / "envs").mkdir()
    for spec in ("legacy.toml", "candidate.toml"):
        (tmp_path / "envs" / spec).write_text((REPO / "envs" / spec).read_text())
    # A lone surrogate stands for a byte that is not UTF-8 (written as that byte).
    (tmp_path / "pyproject.toml").write_bytes(config.encode("utf-8", "surrogateescape"))
    return {"UPGRADE_GATE_CONFIG": str(tmp_path / "pyproject.toml")}


def plan_for(project: Path, *posargs: str):
    return load_plan(list(posargs), invoked_from=project, config_path=project / "pyproject.toml")


def make_project(folder: Path) -> Path:
    """A user project in ``folder``: a pyproject.toml and its own copy of the built-in stack specs, to edit."""
    shutil.copytree(REPO / "envs", folder / "envs")
    (folder / "pyproject.toml").write_text('[tool.upgrade-gate]\nsuite = "smoke"\n')
    return folder


def bare_shell(home: Path) -> dict[str, str]:
    """The environment of a team's shell that has nothing of this checkout or of the stacks: the system's PATH, and
    ``home`` (the test's folder) as its home and its temporary folder, so that what torch and the scripts write there
    (inductor's folder, a check's mkdtemp) is the test's to remove, not left in /tmp."""
    return {"PATH": "/usr/bin:/bin", "HOME": str(home), "TMPDIR": str(home)}


def stack_shell(python: Path, scratch: Path) -> dict[str, str]:
    """This shell with a stack's venv activated (its ``bin/`` first on PATH: executorch 0.7 needs it) and ``scratch``
    as the temporary folder, so that what torch writes there is the test's to remove, not left in /tmp."""
    return {**os.environ, "PATH": f"{python.parent}{os.pathsep}{os.environ['PATH']}", "TMPDIR": str(scratch)}


def torch_traces_since(started: float, temporary: Path | None = None) -> list[Path]:
    """What torch's structured trace (draft_export's) wrote since ``started`` in the folder it takes without
    $TORCH_DTRACE: in the temporary folder (``temporary``, the program's $TMPDIR; the system's where None). The tool,
    its reproducers and its export scripts write nothing there."""
    folder = temporary if temporary is not None else Path(tempfile.gettempdir())
    traces = folder / f"export_{re.sub(r'[^A-Za-z0-9_.-]', '_', getpass.getuser())}"
    return sorted(p for p in traces.glob("*") if p.stat().st_mtime >= started)
