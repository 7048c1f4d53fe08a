"""The team's own project in every stack: its tests run in each, their outcomes
diffed per test, and the API scan of its source (compat/scan.py) read back.

    nox -s "project(<stack>)"   install the project into the stack, run its tests → project/<stack>/
    nox -s scan                 TorchFix and compat/migration_rules.toml over its source → project/scan.json
    gather_project              both, as evidence for the gates (policy.project_gates) and the report

The tests' outcomes travel as the JUnit XML the test command wrote; this module
is the one place that reads it.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from upgrade_gate import layout, supervisor
from upgrade_gate.atomic import write_json_atomic
from upgrade_gate.errors import RecordError
from upgrade_gate.layout import TOOL_ROOT
from upgrade_gate.plan import Plan
from upgrade_gate.records import SCHEMA_VERSION, Reader, check_schema
from upgrade_gate.runner import venv_env
from upgrade_gate.settings import ProjectSettings, runs_pytest

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


# -- running the tests (inside `nox -s "project(<stack>)"`) -------------------------


def project_env(bin_dir: Path) -> dict[str, str]:
    """The environment of the project's tests: the user's, with the stack's venv first on PATH."""
    env = venv_env(bin_dir)
    env["VIRTUAL_ENV"] = str(bin_dir.parent)
    # executorch imports torch._inductor, which starts a compile pool on CUDA wheels (see runner.worker_env).
    env.setdefault("TORCH_WARM_POOL", "0")
    return env


def record_install_failure(plan: Plan, stack: str, error: str) -> dict[str, Any]:
    """The project does not install into this stack: a result, not a usage error (the candidate's pins may
    refuse it)."""
    return _write_run(plan, stack, {"status": "install-failed", "install_error": error, "command": [],
                                    "exit_code": None, "duration_s": 0.0})


def run_tests(plan: Plan, project: ProjectSettings, stack: str, bin_dir: Path) -> dict[str, Any]:
    """Run the project's test command in one stack; write and return its run record.

    The command's own exit status says little (pytest exits 1 when a test fails):
    the outcomes are in the JUnit XML; the status says whether there are any.
    """
    folder = layout.project_dir(plan.settings.out_dir, stack)
    folder.mkdir(parents=True, exist_ok=True)
    junit, log_file = folder / "junit.xml", folder / "test.log"
    junit.unlink(missing_ok=True)  # an old run's outcomes must not pass for this one's
    # `python` and `pytest` are the stack's: its bin/ leads PATH, and a bare name is resolved there first.
    command = project.test_command(junit)
    argv = [str(bin_dir / command[0]) if (bin_dir / command[0]).exists() else command[0], *command[1:]]
    try:
        outcome = supervisor.run_supervised(
            argv, env=project_env(bin_dir), cwd=project.root, log_file=log_file, phase_file=None,
            deadline_for=lambda _stage: project.timeout_s, memory_limit_bytes=plan.settings.memory_limit_bytes)
    except OSError as error:  # the command does not exist in the stack
        return _write_run(plan, stack, {"status": "not-started", "command": command, "exit_code": None,
                                        "duration_s": 0.0, "problem": f"cannot start {command[0]!r}: {error.strerror}"})
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
    return _write_run(plan, stack, record)


def _write_run(plan: Plan, stack: str, record: dict[str, Any]) -> dict[str, Any]:
    full = {"schema_version": str(SCHEMA_VERSION), "stack": stack, "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            **record}
    write_json_atomic(layout.project_dir(plan.settings.out_dir, stack) / "run.json", full)
    return full


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

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "command": list(self.command), "exit_code": self.exit_code,
                "duration_s": self.duration_s, "problem": self.problem, "install_error": self.install_error}

    @classmethod
    def from_reader(cls, r: Reader) -> TestRun:
        return cls(status=r.text("status"), command=r.texts("command"), exit_code=r.opt_integer("exit_code"),
                   duration_s=r.opt_number("duration_s") or 0.0, problem=r.opt_text("problem"),
                   install_error=r.opt_text("install_error"))


@dataclass(frozen=True, kw_only=True, slots=True)
class ProjectStack:
    """One stack's test run: its record and the outcomes counted, or why there are none."""

    run: TestRun | None  # None when the project's tests did not run for this report
    counts: dict[str, int]
    junit: str  # relative to the report folder
    problem: str | None = None

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def to_dict(self) -> dict[str, Any]:
        return {"run": self.run.to_dict() if self.run else None, "problem": self.problem, "counts": dict(self.counts),
                "junit": self.junit}

    @classmethod
    def from_reader(cls, r: Reader) -> ProjectStack:
        run, tallies = r.child("run"), r.child("counts") or Reader({}, r.where)
        return cls(run=TestRun.from_reader(run) if run else None, problem=r.opt_text("problem"),
                   counts={outcome: tallies.integer(outcome) for outcome in tallies.data}, junit=r.text("junit"))


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
    stacks: dict[str, ProjectStack]
    diffs: dict[str, OutcomeDiff]  # per candidate, against the baseline
    scan: ScanResults | None  # None when the scan did not run
    scan_problem: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "root": self.root, "install": list(self.install), "test": list(self.test), "allow": dict(self.allow),
            "stacks": {name: s.to_dict() for name, s in self.stacks.items()},
            "diffs": {name: d.to_dict() for name, d in self.diffs.items()},
            "scan": self.scan.to_dict() if self.scan else None,
            "scan_problem": self.scan_problem,
        }

    @classmethod
    def from_reader(cls, r: Reader) -> ProjectResults:
        scan, allow = r.child("scan"), r.child("allow") or Reader({}, r.where)
        return cls(root=r.text("root"), install=r.texts("install"), test=r.texts("test"),
                   allow={test: allow.text(test) for test in allow.data},
                   stacks={name: ProjectStack.from_reader(s) for name, s in r.entries("stacks").items()},
                   diffs={name: OutcomeDiff.from_reader(d) for name, d in r.entries("diffs").items()},
                   scan=ScanResults.from_reader(scan) if scan else None, scan_problem=r.opt_text("scan_problem"))


def gather_project(plan: Plan) -> ProjectResults | None:
    """What the project sessions wrote into the report folder; None without a project."""
    project = plan.settings.project
    if project is None:
        return None
    out = plan.settings.out_dir
    runs = {spec.name: _stack_tests(out, spec.name) for spec in plan.stacks}
    allow = dict(project.allow)
    base_problem, base_tests = runs[plan.baseline.name]
    diffs = {spec.name: diff_outcomes(base_tests, runs[spec.name][1], allow) for spec in plan.candidates
             if base_problem is None and runs[spec.name][0] is None}
    scan_file = layout.scan_file(out)
    scan, scan_problem = None, None
    try:
        scan = read_scan(scan_file)
    except FileNotFoundError:
        scan_problem = "the API scan did not run for this report (nox -s scan)"
    except (OSError, ValueError, RecordError) as error:
        scan_problem = f"{scan_file.relative_to(out)} is unreadable ({error}); run nox -s scan again"
    stacks = {name: ProjectStack(run=_read_run(out, name), problem=problem, counts=counts(tests),
                                 junit=(layout.project_dir(out, name) / "junit.xml").relative_to(out).as_posix())
              for name, (problem, tests) in runs.items()}
    return ProjectResults(root=str(project.root), install=project.install, test=project.test, allow=allow,
                          stacks=stacks, diffs=diffs, scan=scan, scan_problem=scan_problem)


def _read_run(out: Path, stack: str) -> TestRun | None:
    try:
        data = json.loads((layout.project_dir(out, stack) / "run.json").read_text())
        return TestRun.from_reader(Reader(data, f"project/{stack}/run.json"))
    except (OSError, ValueError, RecordError):
        return None


def _stack_tests(out: Path, stack: str) -> tuple[str | None, dict[str, CaseOutcome]]:
    """Why a stack has no test outcomes (None when it has them), and its outcomes."""
    folder = layout.project_dir(out, stack)
    try:
        run = TestRun.from_reader(Reader(json.loads((folder / "run.json").read_text()), f"project/{stack}/run.json"))
    except FileNotFoundError:
        return f'the project\'s tests did not run in {stack} for this report (nox -s "project({stack})")', {}
    except (OSError, ValueError, RecordError) as error:
        return f"project/{stack}/run.json is unreadable ({error})", {}
    if run.status == "install-failed":
        return f"the project does not install into {stack}: {run.install_error}", {}
    if run.status != "ran":
        return f"the tests did not finish in {stack}: {run.problem}", {}
    try:
        return None, read_junit(folder / "junit.xml")
    except (OSError, ValueError) as error:
        return f"no test outcomes from {stack}: {error}", {}
