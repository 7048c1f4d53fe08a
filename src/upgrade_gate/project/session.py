"""The team's own project in every stack: its tests run in each, their outcomes
diffed per test, and the API scan of its source (compat/scan.py) read back.

    nox -s "project(<stack>)"   install the project into the stack, run its tests → project/<stack>/
    nox -s scan                 TorchFix and compat/migration_rules.toml over its source → project/scan.json
    gather_project              both, as evidence for the gates (policy.project_gates) and the report

The tests' outcomes travel as the JUnit XML the test command wrote; this module
is the one place that reads it. What JUnit XML has no room for — the warnings the
tests raised, and how far a run is while it runs — comes from upgrade-gate's pytest
plugin (compat/pytest_plugin/upgrade_gate_pytest.py), which a pytest command loads
(``-p``); each project venv's installed packages are recorded with its run.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from upgrade_gate import layout
from upgrade_gate._atomic import write_json_atomic, write_text_atomic
from upgrade_gate.config.plan import Plan
from upgrade_gate.config.settings import ProjectSettings, runs_pytest
from upgrade_gate.errors import RecordError
from upgrade_gate.invocation import command
from upgrade_gate.judge.records import SCHEMA_VERSION, Reader, check_schema
from upgrade_gate.layout import TOOL_ROOT
from upgrade_gate.run import packages, supervisor
from upgrade_gate.run.progress import Progress
from upgrade_gate.run.runner import venv_env

# The scan runs in a venv of its own: TorchFix's libcst pin is nobody else's business.
SCAN_PYTHON = "3.11"
SCAN_REQUIREMENTS = ("torchfix==0.7.0",)
OUTCOMES = ("passed", "failed", "error", "skipped")
NOT_PASSING = ("failed", "error")
# Enough of a failure to see why, not the whole traceback (that is in the log).
MESSAGE_LINES = 12
MESSAGE_CHARS = 2000
# Terminal colours in an exception's text (torch's UnpicklingError has them), raw or as pytest
# escapes them for XML ("#x1B[1m").
_ANSI = re.compile(r"(?:\x1b|#x1B)\[[0-9;]*m")
# The pytest plugin: its folder goes on PYTHONPATH alone (nothing else of ours can shadow a team's
# module), and a pytest command gets `-p upgrade_gate_pytest`. Not PYTEST_PLUGINS, which would reach
# pytest under tox or make too: a tool that passed it on without PYTHONPATH would fail the team's run
# on an import. The variables are the plugin's (a test keeps them equal).
PLUGIN_DIR = TOOL_ROOT / "compat" / "pytest_plugin"
PLUGIN = "upgrade_gate_pytest"
PROGRESS_ENV = "UPGRADE_GATE_PYTEST_PROGRESS"
WARNINGS_ENV = "UPGRADE_GATE_PYTEST_WARNINGS"
RESTORE_ENV = "UPGRADE_GATE_PYTEST_RESTORE"
# A stack's files in project/<stack>/ (layout.project_dir), beside run.json.
JUNIT_FILE, LOG_FILE, WARNINGS_FILE, PROGRESS_FILE = "junit.xml", "test.log", "warnings.json", "progress.json"
# A long run prints a progress line at most this often in CI (the live view shows every test).
PROGRESS_LINES_EVERY_S = 15.0
# Outside any test: the plugin's empty node id, by when pytest recorded the warning.
OUTSIDE_TESTS = {"collect": "(collection)", "config": "(configuration)"}


# -- running the tests (inside `nox -s "project(<stack>)"`) -------------------------


def project_env(bin_dir: Path, folder: Path) -> dict[str, str]:
    """The environment of the project's tests: the user's, with the stack's venv first on PATH, and
    where upgrade-gate's pytest plugin finds it and writes into ``folder``."""
    env = venv_env(bin_dir)
    env["VIRTUAL_ENV"] = str(bin_dir.parent)
    # executorch imports torch._inductor, which starts a compile pool on CUDA wheels (see runner.worker_env).
    env.setdefault("TORCH_WARM_POOL", "0")
    # The plugin puts PYTHONPATH back as it was before the tests run: the tests see the team's environment.
    env[RESTORE_ENV] = json.dumps({"PYTHONPATH": env.get("PYTHONPATH")})
    env["PYTHONPATH"] = str(PLUGIN_DIR)  # venv_env removed the caller's: ours alone
    env[PROGRESS_ENV], env[WARNINGS_ENV] = str(folder / PROGRESS_FILE), str(folder / WARNINGS_FILE)
    return env


def watched_command(project: ProjectSettings, junit: Path) -> list[str]:
    """The test command as it runs: with its JUnit XML at ``junit``, and a pytest command loading the plugin."""
    command = project.test_command(junit)
    return [*command, "-p", PLUGIN] if runs_pytest(project.test) else command


def record_install_failure(plan: Plan, stack: str, error: str, bin_dir: Path) -> dict[str, Any]:
    """The project does not install into this stack: a result, not a usage error (the candidate's pins may
    refuse it)."""
    return _write_run(plan, stack, bin_dir, {"status": "install-failed", "install_error": error, "command": [],
                                             "exit_code": None, "duration_s": 0.0})


def run_tests(plan: Plan, project: ProjectSettings, stack: str, bin_dir: Path,
              log: Callable[[str], Any] = print) -> dict[str, Any]:
    """Run the project's test command in one stack, showing how far it is; write and return its run record.

    The command's own exit status says little (pytest exits 1 when a test fails):
    the outcomes are in the JUnit XML; the status says whether there are any.
    """
    folder = layout.project_dir(plan.settings.out_dir, stack)
    folder.mkdir(parents=True, exist_ok=True)
    junit, log_file = folder / JUNIT_FILE, folder / LOG_FILE
    for stale in (junit, folder / WARNINGS_FILE, folder / PROGRESS_FILE):
        stale.unlink(missing_ok=True)  # an old run's outcomes must not pass for this one's
    # `python` and `pytest` are the stack's: its bin/ leads PATH, and a bare name is resolved there first.
    command = watched_command(project, junit)
    argv = [str(bin_dir / command[0]) if (bin_dir / command[0]).exists() else command[0], *command[1:]]
    task = f"{stack}: project: tests"
    with Progress(f"{stack}: the project's tests", 1, log=log) as progress:
        progress.start(task)
        watch = TestProgress(folder / PROGRESS_FILE)

        def show() -> None:
            if (text := watch.poll()) is not None:
                progress.stage(task, text, lines_every_s=PROGRESS_LINES_EVERY_S)
        try:
            outcome = supervisor.run_supervised(
                argv, env=project_env(bin_dir, folder), cwd=project.root, log_file=log_file, phase_file=None,
                deadline_for=lambda _stage: project.timeout_s, memory_limit_bytes=plan.settings.memory_limit_bytes,
                on_poll=show)
        except OSError as error:  # the command does not exist in the stack
            progress.finish(task, "did not start")
            return _write_run(plan, stack, bin_dir, {
                "status": "not-started", "command": command, "exit_code": None, "duration_s": 0.0,
                "problem": f"cannot start {command[0]!r}: {error.strerror}"})
        show()
        progress.finish(task, f"exit status {outcome.returncode}" + (f", {watch.last}" if watch.last else ""))
    record: dict[str, Any] = {"command": command, "exit_code": outcome.returncode,
                              "duration_s": round(outcome.elapsed_s, 2), "peak_rss_bytes": outcome.peak_rss_bytes}
    if outcome.cause == "timeout":
        record.update(status="timed-out", problem=f"killed after {project.timeout_s:g} s (project.timeout)")
    elif outcome.cause == "out-of-memory":
        record.update(status="out-of-memory", problem=f"killed at {outcome.peak_rss_bytes / 2**30:.1f} GiB resident "
                                                       "(memory-limit)")
    elif not junit.is_file():
        hint = "" if runs_pytest(project.test) else " (is {junit} where the command takes its JUnit XML path?)"
        record.update(status="no-results", problem=f"exit status {outcome.returncode} and no JUnit XML{hint}; "
                                                   f"see {log_file.relative_to(plan.settings.out_dir)}")
    else:
        record.update(status="ran")
    return _write_run(plan, stack, bin_dir, record)


def _write_run(plan: Plan, stack: str, bin_dir: Path, record: dict[str, Any]) -> dict[str, Any]:
    full = {"schema_version": str(SCHEMA_VERSION), "stack": stack, "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            **record,
            # What the tests ran with: a test that changed may owe it to a package the spec pins beside torch.
            "installed": packages.installed_versions(bin_dir.parent)}
    write_json_atomic(layout.project_dir(plan.settings.out_dir, stack) / "run.json", full)
    return full


class TestProgress:
    """How far the tests are, from the plugin's progress file: one line of text when it changed."""

    __test__ = False  # not a pytest test class

    def __init__(self, path: Path) -> None:
        self.path = path
        self.last: str | None = None
        self._mtime_ns = -1

    def poll(self) -> str | None:
        """"12/40 tests done · tests/test_io.py::test_load", when the file says something new; else None."""
        try:
            mtime_ns = self.path.stat().st_mtime_ns
            if mtime_ns == self._mtime_ns:
                return None
            data = json.loads(self.path.read_text(encoding="utf-8"))
            self._mtime_ns = mtime_ns
            collected, done, running = data.get("collected"), int(data.get("done", 0)), list(data.get("running", []))
        except (OSError, ValueError, TypeError, AttributeError):
            return None  # not written yet (pytest not started, or not pytest), or being replaced: next poll
        if collected is None:
            text = "collecting"
        else:
            text = f"{done}/{collected} tests done"
            if running:
                text += f" · {running[0]}" + (f" (+{len(running) - 1} more)" if len(running) > 1 else "")
        if text == self.last:
            return None
        self.last = text
        return text


# -- the API scan (inside `nox -s scan`) ---------------------------------------------


def run_scan(settings: ProjectSettings, bin_dir: Path, target: Path) -> str | None:
    """Run compat/scan.py over the project's source in the scan venv; None, or the scanner's usage error."""
    target.parent.mkdir(parents=True, exist_ok=True)
    argv = [str(bin_dir / "python"), "-P", str(TOOL_ROOT / "compat" / "scan.py"), "--root", str(settings.root),
            "--out", str(target), *settings.scan]
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode == 2:
        return result.stderr.strip().removeprefix("scan: error: ")
    if result.returncode != 0:
        raise RuntimeError(f"compat/scan.py failed (exit status {result.returncode}): {result.stderr[-2000:]}")
    return None


def read_scan(path: Path) -> ScanResults:
    """scan.json; RecordError naming the key if it is not one of this schema."""
    reader = Reader(json.loads(path.read_text()), path.name)
    check_schema(reader)
    return ScanResults.from_reader(reader)


# -- reading JUnit XML -----------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class CaseOutcome:
    test_id: str
    outcome: str  # one of OUTCOMES
    message: str = ""  # the failure's, error's or skip's message and the start of its details
    duration_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"test": self.test_id, "outcome": self.outcome, "message": self.message, "duration_s": self.duration_s}


def read_junit(path: Path) -> dict[str, CaseOutcome]:
    """Every test case in a JUnit XML file, by test id; ValueError if it is not JUnit XML."""
    try:
        root = ElementTree.parse(path).getroot()
    except ElementTree.ParseError as error:
        raise ValueError(f"{path}: not XML ({error})") from None
    if root.tag not in ("testsuites", "testsuite"):
        raise ValueError(f"{path}: not JUnit XML (root element <{root.tag}>)")
    tests = {}
    for case in root.iter("testcase"):
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
                message = _message(child.get("message", ""), child.text or "")
                break
        test_id = case_id(case.get("classname", ""), case.get("name", ""), case.get("file"))
        tests[test_id] = CaseOutcome(test_id=test_id, outcome=outcome, message=message,
                                     duration_s=float(case.get("time") or 0.0))
    return tests


def case_id(classname: str, name: str, file: str | None) -> str:
    """pytest's node id ("tests/test_io.py::TestLoad::test_old") where the XML names
    the file (junit_family=xunit1), else "classname::name"."""
    if file and file.endswith(".py"):
        module = file[:-3].replace("/", ".").replace("\\", ".")
        if classname == module or classname.startswith(module + "."):
            inner = classname[len(module) + 1:]
            return "::".join([file.replace("\\", "/"), *(inner.split(".") if inner else []), name])
    return f"{classname}::{name}" if classname else name


def _message(summary: str, details: str) -> str:
    """What went wrong, cut to MESSAGE_CHARS: pytest's "E" lines (the exception, whole) where the
    details have them, else the message and — when they add to it — the end of the details."""
    summary, details = _ANSI.sub("", summary).strip(), _ANSI.sub("", details)
    lines = [line for line in details.strip().splitlines() if line.strip()]
    raised = [line[1:].strip() for line in lines if line.startswith("E ")]
    if raised:
        text = "\n".join(raised)
    elif not lines:
        text = summary
    else:
        tail = "\n".join(lines[-MESSAGE_LINES:])
        text = summary if summary and summary in tail else f"{summary}\n{tail}".strip()
    return text if len(text) <= MESSAGE_CHARS else text[:MESSAGE_CHARS - 1] + "…"


# -- the diff ----------------------------------------------------------------------

# The diff's groups, in the order reports show them, with their headings.
DIFF_GROUPS = (
    ("newly_failing", "Newly failing (passed on {base}; failed, errored or did not run on {stack})"),
    ("newly_passing", "Newly passing (failed on {base})"),
    ("still_failing", "Failing in both"),
    ("newly_skipped", "Newly skipped"),
    ("no_longer_skipped", "No longer skipped"),
    ("only_baseline", "Only in the {base} run"),
    ("only_candidate", "Only in the {stack} run"),
)
ABSENT = "absent"  # a test's outcome in a run that does not have it


@dataclass(frozen=True, kw_only=True, slots=True)
class CaseChange:
    """One test whose outcome differs between the baseline's run and a candidate's."""

    test_id: str
    baseline: str  # its outcome there, or ABSENT
    candidate: str
    message: str  # why it did not pass (the candidate's message, else the baseline's)
    allowed: str | None = None  # the allow-list's reason, for an accepted break

    def to_dict(self) -> dict[str, Any]:
        return {"test": self.test_id, "baseline": self.baseline, "candidate": self.candidate,
                "message": self.message, "allowed": self.allowed}

    @classmethod
    def from_reader(cls, r: Reader) -> CaseChange:
        return cls(test_id=r.text("test"), baseline=r.text("baseline"), candidate=r.text("candidate"),
                   message=r.text("message"), allowed=r.opt_text("allowed"))


@dataclass(frozen=True, kw_only=True, slots=True)
class OutcomeDiff:
    """Per test, the baseline's outcome against a candidate's."""

    # Passed on the baseline; failed, errored or did not run on the candidate.
    newly_failing: tuple[CaseChange, ...] = ()
    newly_passing: tuple[CaseChange, ...] = ()  # failed or errored on the baseline, passes on the candidate
    still_failing: tuple[CaseChange, ...] = ()
    newly_skipped: tuple[CaseChange, ...] = ()
    no_longer_skipped: tuple[CaseChange, ...] = ()
    only_baseline: tuple[CaseChange, ...] = ()  # not passing on the baseline, absent from the candidate
    only_candidate: tuple[CaseChange, ...] = ()
    # Allow-list entries that name no test of either run: probably a typo.
    unused_allow: tuple[str, ...] = ()

    @property
    def breaking(self) -> tuple[CaseChange, ...]:
        """What fails the gate: newly failing tests not on the allow-list."""
        return tuple(c for c in self.newly_failing if c.allowed is None)

    @property
    def accepted(self) -> tuple[CaseChange, ...]:
        return tuple(c for c in self.newly_failing if c.allowed is not None)

    def groups(self) -> list[tuple[str, str, tuple[CaseChange, ...]]]:
        """(group, heading, changes) in the order reports show them."""
        return [(group, title, getattr(self, group)) for group, title in DIFF_GROUPS]

    def to_dict(self) -> dict[str, Any]:
        return {**{g: [c.to_dict() for c in getattr(self, g)] for g, _ in DIFF_GROUPS},
                "unused_allow": list(self.unused_allow)}

    @classmethod
    def from_reader(cls, r: Reader) -> OutcomeDiff:
        return cls(**{g: tuple(CaseChange.from_reader(c) for c in r.children(g)) for g, _ in DIFF_GROUPS},
                   unused_allow=r.texts("unused_allow"))


def diff_outcomes(baseline: dict[str, CaseOutcome], candidate: dict[str, CaseOutcome],
                  allow: dict[str, str] | None = None) -> OutcomeDiff:
    """Sort every test of either run into what changed; unchanged tests are in neither list."""
    allow = allow or {}
    groups: dict[str, list[CaseChange]] = {}
    for test_id in [*baseline, *(t for t in candidate if t not in baseline)]:
        before, after = baseline.get(test_id), candidate.get(test_id)
        group = _group(before.outcome if before else None, after.outcome if after else None)
        if group is None:
            continue
        message = (after.message if after and after.outcome != "passed" else before.message if before else "")
        groups.setdefault(group, []).append(CaseChange(
            test_id=test_id, baseline=before.outcome if before else ABSENT,
            candidate=after.outcome if after else ABSENT, message=message,
            allowed=allow.get(test_id) if group == "newly_failing" else None))
    unused = tuple(t for t in allow if t not in baseline and t not in candidate)
    return OutcomeDiff(**{name: tuple(changes) for name, changes in groups.items()}, unused_allow=unused)


def _group(before: str | None, after: str | None) -> str | None:
    if before == "passed" and after in (*NOT_PASSING, None):
        return "newly_failing"
    if before is None:
        return "only_candidate"
    if after is None:
        return "only_baseline"
    if before in NOT_PASSING and after == "passed":
        return "newly_passing"
    if before in NOT_PASSING and after in NOT_PASSING:
        return "still_failing"
    if after == "skipped" and before != "skipped":
        return "newly_skipped"
    if before == "skipped" and after != "skipped":
        return "no_longer_skipped"
    return None


def counts(tests: dict[str, CaseOutcome]) -> dict[str, int]:
    return {outcome: sum(t.outcome == outcome for t in tests.values()) for outcome in OUTCOMES}


# -- warnings (the plugin's warnings.json) -------------------------------------------

# What differs between two runs of the same warning: object addresses, pytest's numbered temporary folders.
_RUN_SPECIFIC = ((re.compile(r"0x[0-9a-fA-F]{6,}"), "0x…"), (re.compile(r"pytest-\d+"), "pytest-N"))


@dataclass(frozen=True, kw_only=True, slots=True)
class RaisedWarning:
    """A warning the tests raised, as the plugin counted it."""

    test: str  # the pytest node id, or OUTSIDE_TESTS' name for one raised while collecting or configuring
    category: str  # "FutureWarning", "torch.jit.TracerWarning"
    message: str
    location: str  # file:line that raised it: relative to the project, or "<venv>/…"
    count: int

    @property
    def kind(self) -> tuple[str, str]:
        """The same warning in two runs: its category and message, less what differs from run to run."""
        message = self.message
        for pattern, replacement in _RUN_SPECIFIC:
            message = pattern.sub(replacement, message)
        return self.category, message

    @classmethod
    def from_reader(cls, r: Reader) -> RaisedWarning:
        return cls(test=r.text("test") or OUTSIDE_TESTS.get(r.text("when"), "(session)"), category=r.text("category"),
                   message=r.text("message"), location=r.text("location"), count=r.integer("count"))


def read_warnings(path: Path) -> tuple[bool, tuple[RaisedWarning, ...]]:
    """warnings.json: whether pytest recorded warnings at all, and those it recorded; RecordError if it is
    not a file of this schema."""
    try:
        reader = Reader(json.loads(path.read_text(encoding="utf-8")), path.name)
    except ValueError as error:
        raise RecordError(f"{path.name}: not valid JSON ({error})") from None
    check_schema(reader)
    return reader.flag("captured", True), tuple(RaisedWarning.from_reader(w) for w in reader.children("warnings"))


@dataclass(frozen=True, kw_only=True, slots=True)
class NewWarning:
    """A warning a candidate's tests raise and the baseline's do not (category and message)."""

    category: str
    message: str
    location: str  # where the candidate's first one was raised
    count: int  # how often, on the candidate
    tests: tuple[str, ...]  # the tests that raised it

    def to_dict(self) -> dict[str, Any]:
        return {"category": self.category, "message": self.message, "location": self.location, "count": self.count,
                "tests": list(self.tests)}

    @classmethod
    def from_reader(cls, r: Reader) -> NewWarning:
        return cls(category=r.text("category"), message=r.text("message"), location=r.text("location"),
                   count=r.integer("count"), tests=r.texts("tests"))


def new_warnings(baseline: tuple[RaisedWarning, ...], candidate: tuple[RaisedWarning, ...]) -> tuple[NewWarning, ...]:
    """The candidate's warnings whose kind the baseline's tests never raised, one per kind, in the order raised."""
    known = {w.kind for w in baseline}
    found: dict[tuple[str, str], list[RaisedWarning]] = {}
    for warning in candidate:
        if warning.kind not in known:
            found.setdefault(warning.kind, []).append(warning)
    return tuple(NewWarning(category=raised[0].category, message=raised[0].message, location=raised[0].location,
                            count=sum(w.count for w in raised), tests=tuple(dict.fromkeys(w.test for w in raised)))
                 for raised in found.values())


def per_test(warnings: tuple[RaisedWarning, ...]) -> dict[str, int]:
    """How many warnings each test raised."""
    tally: dict[str, int] = {}
    for warning in warnings:
        tally[warning.test] = tally.get(warning.test, 0) + warning.count
    return tally


# -- the project's part of the results (results.json "project", compat.json) ---------


@dataclass(frozen=True, kw_only=True, slots=True)
class TestRun:
    """run.json: how one stack's test run went (or why it did not)."""

    __test__ = False  # not a pytest test class

    status: str  # ran, install-failed, not-started, timed-out, out-of-memory, no-results
    command: tuple[str, ...] = ()
    exit_code: int | None = None
    duration_s: float = 0.0
    problem: str | None = None
    install_error: str | None = None
    installed: dict[str, str] = field(default_factory=dict)  # the project venv's packages: name → version

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "command": list(self.command), "exit_code": self.exit_code,
                "duration_s": self.duration_s, "problem": self.problem, "install_error": self.install_error,
                "installed": dict(self.installed)}

    @classmethod
    def from_reader(cls, r: Reader) -> TestRun:
        installed = r.child("installed") or Reader({}, r.where)
        return cls(status=r.text("status"), command=r.texts("command"), exit_code=r.opt_integer("exit_code"),
                   duration_s=r.opt_number("duration_s") or 0.0, problem=r.opt_text("problem"),
                   install_error=r.opt_text("install_error"),
                   installed={name: installed.text(name) for name in installed.data})


@dataclass(frozen=True, kw_only=True, slots=True)
class ProjectStack:
    """One stack's test run: its record and the outcomes counted, or why there are none."""

    run: TestRun | None  # None when the project's tests did not run for this report
    counts: dict[str, int]
    junit: str  # relative to the report folder
    problem: str | None = None
    # Warnings per test (OUTSIDE_TESTS' names for those raised outside any); None: not counted, and why.
    warnings: dict[str, int] | None = None
    warnings_problem: str | None = None

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def warning_total(self) -> int | None:
        return sum(self.warnings.values()) if self.warnings is not None else None

    def to_dict(self) -> dict[str, Any]:
        return {"run": self.run.to_dict() if self.run else None, "problem": self.problem, "counts": dict(self.counts),
                "junit": self.junit, "warnings": self.warnings, "warnings_problem": self.warnings_problem}

    @classmethod
    def from_reader(cls, r: Reader) -> ProjectStack:
        run, tallies, warned = r.child("run"), r.child("counts") or Reader({}, r.where), r.child("warnings")
        return cls(run=TestRun.from_reader(run) if run else None, problem=r.opt_text("problem"),
                   counts={outcome: tallies.integer(outcome) for outcome in tallies.data}, junit=r.text("junit"),
                   warnings={test: warned.integer(test) for test in warned.data} if warned else None,
                   warnings_problem=r.opt_text("warnings_problem"))


@dataclass(frozen=True, kw_only=True, slots=True)
class Finding:
    """A call in the project's source that the candidate changes, deprecates or removes (compat/scan.py)."""

    file: str
    line: int
    column: int
    code: str
    call: str
    summary: str
    why: str
    replacement: str

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "column": self.column, "code": self.code, "call": self.call,
                "summary": self.summary, "why": self.why, "replacement": self.replacement}

    @classmethod
    def from_reader(cls, r: Reader) -> Finding:
        return cls(file=r.text("file"), line=r.integer("line"), column=r.integer("column"), code=r.text("code"),
                   call=r.text("call"), summary=r.opt_text("summary") or "", why=r.opt_text("why") or "",
                   replacement=r.opt_text("replacement") or "")


@dataclass(frozen=True, kw_only=True, slots=True)
class ScanResults:
    """scan.json: the API scan of the project's source."""

    torchfix: str  # TorchFix's version
    rules: int  # upgrade-gate's own rules (compat/migration_rules.toml)
    files_scanned: int
    findings: tuple[Finding, ...]
    errors: tuple[tuple[str, str], ...]  # (file, why it could not be read or parsed)

    def to_dict(self) -> dict[str, Any]:
        return {"scanner": {"torchfix": self.torchfix, "rules": self.rules}, "files_scanned": self.files_scanned,
                "findings": [f.to_dict() for f in self.findings],
                "errors": [{"file": file, "error": error} for file, error in self.errors]}

    @classmethod
    def from_reader(cls, r: Reader) -> ScanResults:
        scanner = r.child("scanner") or Reader({}, r.where)
        return cls(torchfix=scanner.opt_text("torchfix") or "?", rules=scanner.opt_integer("rules") or 0,
                   files_scanned=r.integer("files_scanned"),
                   findings=tuple(Finding.from_reader(f) for f in r.children("findings")),
                   errors=tuple((e.text("file"), e.text("error")) for e in r.children("errors")))


@dataclass(frozen=True, kw_only=True, slots=True)
class ProjectResults:
    """The team's project in every stack: what ran, what changed per test, what the scan found."""

    root: str
    install: tuple[str, ...]
    test: tuple[str, ...]
    allow: dict[str, str]  # test id → why its break is accepted
    stacks: dict[str, ProjectStack]  # baseline first
    diffs: dict[str, OutcomeDiff]  # per candidate, against the baseline
    scan: ScanResults | None  # None when the scan did not run
    scan_problem: str | None = None
    # Per candidate whose warnings and the baseline's were both counted: the kinds only it raises.
    new_warnings: dict[str, tuple[NewWarning, ...]] = field(default_factory=dict)
    # The scan record the report cites, relative to the report folder (a copy named by its content).
    scan_file: str = "project/scan.json"

    def package_changes(self, candidate: str) -> packages.Differences:
        """The packages whose versions differ between the baseline's test venv and a candidate's
        ({} when either venv's were not recorded)."""
        runs = {name: s.run.installed for name, s in self.stacks.items()
                if name in (next(iter(self.stacks)), candidate) and s.run and s.run.installed}
        return packages.differing(runs) if len(runs) == 2 else {}

    def to_dict(self) -> dict[str, Any]:
        return {
            "root": self.root, "install": list(self.install), "test": list(self.test), "allow": dict(self.allow),
            "stacks": {name: s.to_dict() for name, s in self.stacks.items()},
            "diffs": {name: d.to_dict() for name, d in self.diffs.items()},
            "new_warnings": {name: [w.to_dict() for w in found] for name, found in self.new_warnings.items()},
            # Derived from each run's installed packages, for readers of the file.
            "package_changes": {name: self.package_changes(name) for name in list(self.stacks)[1:]},
            "scan": self.scan.to_dict() if self.scan else None,
            "scan_problem": self.scan_problem,
            "scan_file": self.scan_file,
        }

    @classmethod
    def from_reader(cls, r: Reader) -> ProjectResults:
        scan, allow = r.child("scan"), r.child("allow") or Reader({}, r.where)
        warned = r.child("new_warnings") or Reader({}, r.where)
        return cls(root=r.text("root"), install=r.texts("install"), test=r.texts("test"),
                   allow={test: allow.text(test) for test in allow.data},
                   stacks={name: ProjectStack.from_reader(s) for name, s in r.entries("stacks").items()},
                   diffs={name: OutcomeDiff.from_reader(d) for name, d in r.entries("diffs").items()},
                   new_warnings={name: tuple(NewWarning.from_reader(w) for w in warned.children(name))
                                 for name in warned.data},
                   scan=ScanResults.from_reader(scan) if scan else None, scan_problem=r.opt_text("scan_problem"),
                   scan_file=r.opt_text("scan_file") or "project/scan.json")  # a 2.1 file before issue 26


# -- the evidence a report cites ------------------------------------------------------

# A stack's files that a report's project section is made from, copied together (run.json first: a
# folder without it has nothing a report can cite).
EVIDENCE_FILES = ("run.json", JUNIT_FILE, WARNINGS_FILE, LOG_FILE)


def _digest(files: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in files:
        digest.update(f"{path.name}\0{path.stat().st_size}\0".encode())
        with path.open("rb") as stream:
            for block in iter(lambda: stream.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def _keep(sources: list[Path], target: Path) -> None:
    """Copy sources into the folder target, whole or not at all (a copy already there is the same content)."""
    if target.exists():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"))
    try:
        for source in sources:
            shutil.copyfile(source, staging / source.name)
        os.chmod(staging, 0o755)
        os.rename(staging, target)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if not target.is_dir():  # else made meanwhile (rename fails onto a folder that is not empty): the same
            raise


def keep_stack_evidence(out: Path, stack: str) -> Path:
    """The folder a report reads (and cites) a stack's test run from.

    `nox -s compat` and `nox -s compare` run the same project sessions into the same project/<stack>/,
    so a later run rewrites the files an earlier report pointed to (issue 26). The report instead
    cites copies in project/evidence/<stack>-<digest>/, named by their content: a later run with
    other outcomes makes another folder, and one with the same outcomes finds its copy there. A stack
    without run.json (its tests did not run for this report) is read where it is: nothing to cite.
    """
    folder = layout.project_dir(out, stack)
    present = [folder / name for name in EVIDENCE_FILES if (folder / name).is_file()]
    if not present or present[0].name != "run.json":
        return folder
    target = layout.stack_evidence_dir(out, stack, _digest(present))
    _keep(present, target)
    return target


def keep_scan_evidence(out: Path) -> Path:
    """The scan record a report reads (and cites): a copy of project/scan.json named by its content."""
    source = layout.scan_file(out)
    if not source.is_file():
        return source
    target = layout.scan_evidence_file(out, _digest([source]))
    if not target.exists():
        write_text_atomic(target, source.read_text(encoding="utf-8"))
    return target


def gather_project(plan: Plan) -> ProjectResults | None:
    """What the project sessions wrote into the report folder, read from (and citing) copies that no later
    run changes (keep_stack_evidence); None without a project."""
    project = plan.settings.project
    if project is None:
        return None
    out = plan.settings.out_dir
    folders = {spec.name: keep_stack_evidence(out, spec.name) for spec in plan.stacks}
    runs = {spec.name: _stack_tests(out, folders[spec.name], spec.name) for spec in plan.stacks}
    allow = dict(project.allow)
    base_problem, base_tests = runs[plan.baseline.name]
    diffs = {spec.name: diff_outcomes(base_tests, runs[spec.name][1], allow) for spec in plan.candidates
             if base_problem is None and runs[spec.name][0] is None}
    scan_file = keep_scan_evidence(out)
    scan, scan_problem = None, None
    try:
        scan = read_scan(scan_file)
    except FileNotFoundError:
        scan_problem = f"the API scan did not run for this report ({command('scan')})"
    except (OSError, ValueError, RecordError) as error:
        scan_problem = f"{scan_file.relative_to(out)} is unreadable ({error}); run {command('scan')} again"
    warned = {spec.name: _stack_warnings(out, folders[spec.name], runs[spec.name][0], project)
              for spec in plan.stacks}
    stacks = {name: ProjectStack(run=_read_run(out, folders[name]), problem=problem, counts=counts(tests),
                                 junit=(folders[name] / JUNIT_FILE).relative_to(out).as_posix(),
                                 warnings=per_test(warned[name][1]) if warned[name][0] is None else None,
                                 warnings_problem=warned[name][0])
              for name, (problem, tests) in runs.items()}
    base_warned = warned[plan.baseline.name]
    fresh = {spec.name: new_warnings(base_warned[1], warned[spec.name][1]) for spec in plan.candidates
             if base_warned[0] is None and warned[spec.name][0] is None}
    return ProjectResults(root=str(project.root), install=project.install, test=project.test, allow=allow,
                          stacks=stacks, diffs=diffs, scan=scan, scan_problem=scan_problem, new_warnings=fresh,
                          scan_file=scan_file.relative_to(out).as_posix())


def _stack_warnings(out: Path, folder: Path, tests_problem: str | None,
                    project: ProjectSettings) -> tuple[str | None, tuple[RaisedWarning, ...]]:
    """Why a stack's warnings are not counted (None when they are), and its warnings."""
    if tests_problem is not None:
        return "the tests did not run to the end", ()
    path = folder / WARNINGS_FILE
    try:
        captured, warnings = read_warnings(path)
    except FileNotFoundError:
        if runs_pytest(project.test):
            return "pytest wrote no warnings (did it load the upgrade-gate plugin? see test.log)", ()
        return ("the test command is not pytest; upgrade-gate counts warnings with a pytest plugin, which only "
                "a pytest command loads (-p)"), ()
    except (OSError, ValueError, RecordError) as error:
        return f"{path.relative_to(out).as_posix()} is unreadable ({error})", ()
    if not captured:
        return "the team's pytest runs without its warnings plugin (-p no:warnings)", ()
    return None, warnings


def _read_run(out: Path, folder: Path) -> TestRun | None:
    path = folder / "run.json"
    try:
        return TestRun.from_reader(Reader(json.loads(path.read_text()), path.relative_to(out).as_posix()))
    except (OSError, ValueError, RecordError):
        return None


def _stack_tests(out: Path, folder: Path, stack: str) -> tuple[str | None, dict[str, CaseOutcome]]:
    """Why a stack has no test outcomes (None when it has them), and its outcomes, from the files in folder."""
    path = folder / "run.json"
    try:
        run = TestRun.from_reader(Reader(json.loads(path.read_text()), path.relative_to(out).as_posix()))
    except FileNotFoundError:
        return f"the project's tests did not run in {stack} for this report ({command(f'project({stack})')})", {}
    except (OSError, ValueError, RecordError) as error:
        return f"{path.relative_to(out).as_posix()} is unreadable ({error})", {}
    if run.status == "install-failed":
        return f"the project does not install into {stack}: {run.install_error}", {}
    if run.status != "ran":
        return f"the tests did not finish in {stack}: {run.problem}", {}
    try:
        return None, read_junit(folder / JUNIT_FILE)
    except (OSError, ValueError) as error:
        return f"no test outcomes from {stack}: {error}", {}
