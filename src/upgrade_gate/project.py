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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from upgrade_gate import layout, supervisor
from upgrade_gate.runner import venv_env
from upgrade_gate.atomic import write_json_atomic
from upgrade_gate.config import REPO_ROOT, Plan, ProjectSettings, runs_pytest

SCHEMA_VERSION = "1.0"
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
    """The project does not install into this stack: a result, not a usage error (the candidate's pins may refuse it)."""
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
    full = {"schema_version": SCHEMA_VERSION, "stack": stack, "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            **record}
    write_json_atomic(layout.project_dir(plan.settings.out_dir, stack) / "run.json", full)
    return full


# -- the API scan (inside `nox -s scan`) ---------------------------------------------


def run_scan(settings: ProjectSettings, bin_dir: Path, target: Path) -> str | None:
    """Run compat/scan.py over the project's source in the scan venv; None, or the scanner's usage error."""
    target.parent.mkdir(parents=True, exist_ok=True)
    argv = [str(bin_dir / "python"), "-P", str(REPO_ROOT / "compat" / "scan.py"), "--root", str(settings.root),
            "--out", str(target), *settings.scan]
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode == 2:
        return result.stderr.strip().removeprefix("scan: error: ")
    if result.returncode != 0:
        raise RuntimeError(f"compat/scan.py failed (exit status {result.returncode}): {result.stderr[-2000:]}")
    return None


def read_scan(path: Path) -> dict[str, Any]:
    """scan.json, checked for the keys the report reads; ValueError otherwise."""
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or str(data.get("schema_version", "")).split(".")[0] != SCHEMA_VERSION.split(".")[0]:
        raise ValueError(f"{path.name}: not a scan record of schema {SCHEMA_VERSION}")
    for key in ("findings", "files_scanned", "errors"):
        if key not in data:
            raise ValueError(f"{path.name}: no {key!r}")
    return data


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


@dataclass(frozen=True, kw_only=True, slots=True)
class CaseChange:
    test_id: str
    baseline: CaseOutcome | None  # None: not in the baseline's run
    candidate: CaseOutcome | None
    allowed: str | None = None  # the allow-list's reason, for an accepted break

    def to_dict(self) -> dict[str, Any]:
        return {"test": self.test_id,
                "baseline": self.baseline.outcome if self.baseline else "absent",
                "candidate": self.candidate.outcome if self.candidate else "absent",
                "message": (self.candidate.message if self.candidate and self.candidate.outcome != "passed"
                            else self.baseline.message if self.baseline else ""),
                "allowed": self.allowed}


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

    def to_dict(self) -> dict[str, Any]:
        return {**{g: [c.to_dict() for c in getattr(self, g)] for g, _ in DIFF_GROUPS},
                "unused_allow": list(self.unused_allow)}


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
        allowed = allow.get(test_id) if group == "newly_failing" else None
        groups.setdefault(group, []).append(CaseChange(test_id=test_id, baseline=before, candidate=after,
                                                       allowed=allowed))
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


# -- evidence for the gates and the report -------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class StackOutcomes:
    """One stack's test run: its record and, when it ran, every test's outcome."""

    stack: str
    run: dict[str, Any] | None  # run.json; None when the project's tests did not run for this report
    tests: dict[str, CaseOutcome] = field(default_factory=dict)
    problem: str | None = None  # why there are no outcomes

    @property
    def has_results(self) -> bool:
        return self.problem is None


@dataclass(frozen=True, kw_only=True, slots=True)
class ProjectEvidence:
    settings: ProjectSettings
    stacks: dict[str, StackOutcomes]
    diffs: dict[str, OutcomeDiff]  # per candidate, against the baseline
    scan: dict[str, Any] | None  # scan.json; None when the scan did not run
    scan_problem: str | None = None

    def to_dict(self, out: Path) -> dict[str, Any]:
        return {
            "root": str(self.settings.root),
            "install": list(self.settings.install),
            "test": list(self.settings.test),
            "allow": dict(self.settings.allow),
            "stacks": {name: {"run": s.run, "problem": s.problem, "counts": counts(s.tests),
                              "junit": (layout.project_dir(out, name) / "junit.xml").relative_to(out).as_posix()}
                       for name, s in self.stacks.items()},
            "diffs": {name: d.to_dict() for name, d in self.diffs.items()},
            "scan": self.scan,
            "scan_problem": self.scan_problem,
        }


def gather_project(plan: Plan) -> ProjectEvidence | None:
    """What the project sessions wrote into the report folder; None without a project."""
    project = plan.settings.project
    if project is None:
        return None
    out = plan.settings.out_dir
    stacks = {spec.name: _stack_tests(out, spec.name) for spec in plan.stacks}
    allow = dict(project.allow)
    base = stacks[plan.baseline.name]
    diffs = {spec.name: diff_outcomes(base.tests, stacks[spec.name].tests, allow) for spec in plan.candidates
             if base.has_results and stacks[spec.name].has_results}
    scan_file = layout.scan_file(out)
    scan, scan_problem = None, None
    try:
        scan = read_scan(scan_file)
    except FileNotFoundError:
        scan_problem = "the API scan did not run for this report (nox -s scan)"
    except (OSError, ValueError) as error:
        scan_problem = f"{scan_file.relative_to(out)} is unreadable ({error}); run nox -s scan again"
    return ProjectEvidence(settings=project, stacks=stacks, diffs=diffs, scan=scan, scan_problem=scan_problem)


def _stack_tests(out: Path, stack: str) -> StackOutcomes:
    folder = layout.project_dir(out, stack)
    try:
        run = json.loads((folder / "run.json").read_text())
    except FileNotFoundError:
        return StackOutcomes(stack=stack, run=None,
                          problem=f'the project\'s tests did not run in {stack} for this report (nox -s "project({stack})")')
    except (OSError, ValueError) as error:
        return StackOutcomes(stack=stack, run=None, problem=f"project/{stack}/run.json is unreadable ({error})")
    if run.get("status") == "install-failed":
        return StackOutcomes(stack=stack, run=run, problem=f"the project does not install into {stack}: "
                                                        f"{run.get('install_error')}")
    if run.get("status") != "ran":
        return StackOutcomes(stack=stack, run=run, problem=f"the tests did not finish in {stack}: {run.get('problem')}")
    try:
        tests = read_junit(folder / "junit.xml")
    except (OSError, ValueError) as error:
        return StackOutcomes(stack=stack, run=run, problem=f"no test outcomes from {stack}: {error}")
    return StackOutcomes(stack=stack, run=run, tests=tests)
