"""The project's part of the results (results.json "project", compat.json): each stack's test run,
the per-test diff, the new warnings and the API scan's findings."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from upgrade_gate.schema import codec

# Outside any test: the plugin's empty node id, by when pytest recorded the warning.
OUTSIDE_TESTS = {"collect": "(collection)", "config": "(configuration)"}

# -- installed packages ----------------------------------------------------------------

# name → {stack: version, None where that stack's venv lacks it}
Differences = dict[str, dict[str, str | None]]


def differing(by_stack: dict[str, dict[str, str]]) -> Differences:
    """The packages whose version is not the same in every venv (None where one lacks it), by name."""
    names = sorted({name for packages in by_stack.values() for name in packages})
    rows = {name: {stack: packages.get(name) for stack, packages in by_stack.items()} for name in names}
    return {name: versions for name, versions in rows.items() if len(set(versions.values())) > 1}


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
class CaseChange(codec.Record):
    """One test whose outcome differs between the baseline's run and a candidate's."""

    test_id: str = field(metadata=codec.key("test"))
    baseline: str  # its outcome there, or NOT_IN_RUN
    candidate: str
    message: str  # why it did not pass (the candidate's message, else the baseline's)
    allowed: str | None = None  # the allow-list's reason, for an accepted break


@dataclass(frozen=True, kw_only=True, slots=True)
class OutcomeDiff(codec.Record):
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


# -- warnings (the plugin's warnings.json) -------------------------------------------

# What differs between two runs of the same warning: object addresses, pytest's numbered temporary folders.
_RUN_SPECIFIC = ((re.compile(r"0x[0-9a-fA-F]{6,}"), "0x…"), (re.compile(r"pytest-\d+"), "pytest-N"))


@dataclass(frozen=True, kw_only=True, slots=True)
class RaisedWarning(codec.Record):
    """A warning the tests raised, as the plugin counted it."""

    # The pytest node id, or OUTSIDE_TESTS' name for one raised while collecting or configuring.
    test: str = field(metadata=codec.custom(
        read=lambda r, key: r.text(key) or OUTSIDE_TESTS.get(r.text("when"), "(session)")))
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


@dataclass(frozen=True, kw_only=True, slots=True)
class NewWarning(codec.Record):
    """A warning a candidate's tests raise and the baseline's do not (category and message)."""

    category: str
    message: str
    location: str  # where the candidate's first one was raised
    count: int  # how often, on the candidate
    tests: tuple[str, ...]  # the tests that raised it


# -- the project's part of the results (results.json "project", compat.json) ---------


@dataclass(frozen=True, kw_only=True, slots=True)
class TestRun(codec.Record):
    """run.json: how one stack's test run went (or why it did not)."""

    __test__ = False  # not a pytest test class

    status: str  # ran, install-failed, not-started, timed-out, out-of-memory, no-results
    command: tuple[str, ...] = ()
    exit_code: int | None = None
    duration_s: float = 0.0
    problem: str | None = None
    install_error: str | None = None
    installed: dict[str, str] = field(default_factory=dict)  # the project venv's packages: name → version
    # The result cache's entry these outcomes were copied from (the same key: files, packages, command).
    reused_from: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class ProjectStack(codec.Record):
    """One stack's test run: its record and the outcomes counted, or why there are none."""

    run: TestRun | None  # None when the project's tests did not run for this report
    problem: str | None = None
    counts: dict[str, int]
    junit: str  # relative to the report folder
    # Warnings per test (OUTSIDE_TESTS' names for those raised outside any); None: not counted, and why.
    warnings: dict[str, int] | None = None
    warnings_problem: str | None = None

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def warning_total(self) -> int | None:
        return sum(self.warnings.values()) if self.warnings is not None else None


@dataclass(frozen=True, kw_only=True, slots=True)
class PatchedTests(codec.Record):
    """A candidate's run of the project's tests on a copy of the project with ``migrate/project.diff`` applied (the
    team's files are never changed): its outcomes, and what still breaks against the baseline."""

    stack: ProjectStack
    files: tuple[str, ...]  # the files the diff changes
    diff: OutcomeDiff | None  # against the baseline's run; None where either has no outcomes
    # The classes torch.load refused in a first run, which the diff then allows where the project defines them
    # (project/patch.py allowing): the run above is the run with them allowed.
    safe_globals: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class Finding(codec.Record):
    """A call in the project's source that the candidate changes, deprecates or removes (compat/scan.py)."""

    file: str
    line: int
    column: int
    code: str
    call: str
    # What the rule says of it, where the scanner wrote one.
    summary: str = field(metadata=codec.absent(""))
    why: str = field(metadata=codec.absent(""))
    replacement: str = field(metadata=codec.absent(""))
    # Why the candidate never meets it (a version guard skips it, compat/scan_guards.py): not counted.
    set_aside: str = field(default="", metadata=codec.absent(""))
    # The team's reason, from `project.scan-allow`: not a migration item, not counted.
    allowed: str = field(default="", metadata=codec.absent(""))
    # Written for the candidate in its file's rewrite (migrate/project.diff).
    rewritten: bool = field(default=False, metadata=codec.absent(False))


@dataclass(frozen=True, kw_only=True, slots=True)
class Rewrite(codec.Record):
    """One file of the team's with the findings that have a rewrite written for the candidate (compat/scan.py,
    compat/scan_rewrites.py): what ``migrate/project.diff`` is made of."""

    file: str  # relative to the project's root
    sha256: str  # of the file as it was scanned: a file changed since is not patched
    text: str  # its source, rewritten


@dataclass(frozen=True, kw_only=True, slots=True)
class ScanResults(codec.Record):
    """scan.json: the API scan of the project's source."""

    torchfix: str = field(metadata=codec.group("scanner") | codec.absent("?"))  # TorchFix's version
    # upgrade-gate's own rules (compat/migration_rules.toml)
    rules: int = field(metadata=codec.group("scanner") | codec.absent(0))
    files_scanned: int
    findings: tuple[Finding, ...]
    set_aside: tuple[Finding, ...] = ()  # absent from a scan before 2.12
    torch: tuple[str, ...] = ()  # the candidates' releases its version guards were read for
    unused_allow: tuple[str, ...] = ()  # `project.scan-allow` keys that matched no finding
    # (file, why it could not be read or parsed), each written as {"file", "error"}.
    errors: tuple[tuple[str, str], ...] = field(metadata=codec.custom(
        write=lambda s: [{"file": file, "error": error} for file, error in s.errors],
        read=lambda r, key: tuple((e.text("file"), e.text("error")) for e in r.children(key))))
    # The result cache's entry this scan was copied from (the same files, scanner and venv).
    reused_from: str | None = None
    rewrites: tuple[Rewrite, ...] = ()  # absent from a scan before issue 64

    @property
    def to_change(self) -> tuple[Finding, ...]:
        """What the api-scan gate counts: the findings the team has not allowed."""
        return tuple(f for f in self.findings if not f.allowed)


@dataclass(frozen=True, kw_only=True, slots=True)
class ProjectResults(codec.Record):
    """The team's project in every stack: what ran, what changed per test, what the scan found."""

    root: str
    install: tuple[str, ...]
    test: tuple[str, ...]
    allow: dict[str, str]  # test id → why its break is accepted
    stacks: dict[str, ProjectStack]  # baseline first
    diffs: dict[str, OutcomeDiff]  # per candidate, against the baseline
    # Per candidate whose warnings and the baseline's were both counted: the kinds only it raises.
    new_warnings: dict[str, tuple[NewWarning, ...]] = field(default_factory=dict)
    scan: ScanResults | None  # None when the scan did not run
    scan_problem: str | None = None
    # The scan record the report cites, relative to the report folder (a copy named by its content).
    scan_file: str = "project/scan.json"  # absent from a 2.1 file before issue 26
    # Per candidate: its tests run again with the scan's rewrites (migrate/project.diff) applied to a copy.
    patched: dict[str, PatchedTests] = field(default_factory=dict)

    # Derived from each run's installed packages, for readers of the file.
    DERIVED = (codec.derived("package_changes", after="new_warnings",
                             get=lambda p: {name: p.package_changes(name) for name in list(p.stacks)[1:]}),)

    def package_changes(self, candidate: str) -> Differences:
        """Between the baseline's test venv and a candidate's ({} when either venv's were not recorded)."""
        runs = {name: s.run.installed for name, s in self.stacks.items()
                if name in (next(iter(self.stacks)), candidate) and s.run and s.run.installed}
        return differing(runs) if len(runs) == 2 else {}
