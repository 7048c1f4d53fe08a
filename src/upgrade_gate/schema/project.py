"""The project's part of the results (results.json "project", compat.json): each stack's test run,
the per-test diff, the new warnings and the API scan's findings."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from upgrade_gate.judge.records import Reader
from upgrade_gate.run import packages

# Outside any test: the plugin's empty node id, by when pytest recorded the warning.
OUTSIDE_TESTS = {"collect": "(collection)", "config": "(configuration)"}



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
NOT_IN_RUN = "absent"  # a test's outcome in a run that does not have it


@dataclass(frozen=True, kw_only=True, slots=True)
class CaseChange:
    """One test whose outcome differs between the baseline's run and a candidate's."""

    test_id: str
    baseline: str  # its outcome there, or NOT_IN_RUN
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
