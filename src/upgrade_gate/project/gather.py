"""What the project sessions wrote into the report folder, read back as the project's results —
from copies named by their content, so a later run never changes what an earlier report cites."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from upgrade_gate import layout
from upgrade_gate._atomic import write_text_atomic
from upgrade_gate.config.plan import Plan
from upgrade_gate.config.project_settings import ProjectSettings, runs_pytest
from upgrade_gate.errors import RecordError
from upgrade_gate.invocation import command
from upgrade_gate.layout import JUNIT_FILE, LOG_FILE, RUN_FILE, WARNINGS_FILE
from upgrade_gate.project._diff import diff_outcomes, new_warnings, per_test
from upgrade_gate.project._junit import CaseOutcome, counts, read_junit
from upgrade_gate.project.patch import patch_of, with_safe_globals
from upgrade_gate.schema.project import PatchedTests, ProjectResults, ProjectStack, RaisedWarning, ScanResults, TestRun
from upgrade_gate.schema.reader import Reader
from upgrade_gate.schema.records import check_schema


def read_scan(path: Path) -> ScanResults:
    """scan.json; RecordError naming the key if it is not one of this schema."""
    reader = Reader(json.loads(path.read_text()), path.name)
    check_schema(reader)
    return ScanResults.from_reader(reader)


def allowing(scan: ScanResults, allow: dict[str, str]) -> ScanResults:
    """``scan`` with each finding a ``project.scan-allow`` key ("CODE PATTERN", the first that matches) allows given
    its reason, and the keys that allow none."""
    rules = [(key, *key.split(" ", 1)) for key in allow]  # its shape checked by config/project_settings.py
    keys = [next((key for key, code, files in rules if code == found.code and fnmatch.fnmatchcase(found.file, files)),
                 None) for found in scan.findings]
    findings = tuple(replace(found, allowed=allow[key]) if key else found for found, key in zip(scan.findings, keys))
    return replace(scan, findings=findings, unused_allow=tuple(key for key in allow if key not in keys))


def read_warnings(path: Path) -> tuple[bool, tuple[RaisedWarning, ...]]:
    """warnings.json: whether pytest recorded warnings at all, and those it recorded; RecordError if it is
    not a file of this schema."""
    try:
        reader = Reader(json.loads(path.read_text(encoding="utf-8")), path.name)
    except ValueError as error:
        raise RecordError(f"{path.name}: not valid JSON ({error})") from None
    check_schema(reader)
    return reader.flag("captured", True), tuple(RaisedWarning.from_reader(w) for w in reader.children("warnings"))


# -- the evidence a report cites ------------------------------------------------------

# A stack's files that a report's project section is made from, copied together (run.json first: a
# folder without it has nothing a report can cite).
EVIDENCE_FILES = (RUN_FILE, JUNIT_FILE, WARNINGS_FILE, LOG_FILE)


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


def keep_stack_evidence(out: Path, stack: str, *, patched: bool = False) -> Path:
    """The folder a report reads (and cites) a stack's test run from: a copy in project/evidence/<stack>-<digest>/
    named by its content, since `nox -s compat` and `nox -s compare` rewrite project/<stack>/ (issue 26). A stack
    without run.json (its tests did not run for this report) is read where it is: nothing to cite. ``patched``: its
    run with migrate/project.diff applied (project/patched/<stack>/)."""
    folder = layout.patched_project_dir(out, stack) if patched else layout.project_dir(out, stack)
    present = [folder / name for name in EVIDENCE_FILES if (folder / name).is_file()]
    if not present or present[0].name != RUN_FILE:
        return folder
    target = layout.stack_evidence_dir(out, f"{stack}-patched" if patched else stack, _digest(present))
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
    """What the project sessions wrote, read from copies no later run changes; None without a project."""
    project = plan.settings.project
    if project is None:
        return None
    out = plan.settings.out_dir
    folders = {spec.name: keep_stack_evidence(out, spec.name) for spec in plan.stacks}
    runs = {spec.name: _stack_tests(out, folders[spec.name], spec.name) for spec in plan.stacks}
    allow = dict(project.allow)
    base = runs[plan.baseline.name]
    diffs = {spec.name: diff_outcomes(base.tests, runs[spec.name].tests, allow) for spec in plan.candidates
             if base.problem is None and runs[spec.name].problem is None}
    scan_file = keep_scan_evidence(out)
    scan, scan_problem = None, None
    try:
        scan = allowing(read_scan(scan_file), dict(project.scan_allow))
    except FileNotFoundError:
        scan_problem = f"the API scan did not run for this report ({command('scan')})"
    except (OSError, ValueError, RecordError) as error:
        scan_problem = f"{scan_file.relative_to(out)} is unreadable ({error}); run {command('scan')} again"
    warned = {spec.name: _stack_warnings(out, folders[spec.name], runs[spec.name].problem, project)
              for spec in plan.stacks}
    stacks = {name: ProjectStack(run=found.run, problem=found.problem, counts=counts(found.tests),
                                 junit=(folders[name] / JUNIT_FILE).relative_to(out).as_posix(),
                                 warnings=per_test(warned[name][1]) if warned[name][0] is None else None,
                                 warnings_problem=warned[name][0])
              for name, found in runs.items()}
    patched = {spec.name: _patched(out, spec.name, scan, project, base, allow) for spec in plan.candidates
               if scan is not None and (layout.patched_project_dir(out, spec.name) / RUN_FILE).is_file()}
    base_warned = warned[plan.baseline.name]
    fresh = {spec.name: new_warnings(base_warned[1], warned[spec.name][1]) for spec in plan.candidates
             if base_warned[0] is None and warned[spec.name][0] is None}
    return ProjectResults(root=str(project.root), install=project.install, test=project.test, allow=allow,
                          stacks=stacks, diffs=diffs, scan=scan, scan_problem=scan_problem, new_warnings=fresh,
                          scan_file=scan_file.relative_to(out).as_posix(), patched=patched)


def _patched(out: Path, stack: str, scan: ScanResults, project: ProjectSettings, base: _StackTests,
             allow: dict[str, str]) -> PatchedTests:
    """A candidate's run of the tests with migrate/project.diff applied, diffed against the baseline's run."""
    folder = keep_stack_evidence(out, stack, patched=True)
    found = _stack_tests(out, folder, f"{stack} with project.diff")
    run = ProjectStack(run=found.run, problem=found.problem, counts=counts(found.tests),
                       junit=(folder / JUNIT_FILE).relative_to(out).as_posix())
    diff = diff_outcomes(base.tests, found.tests, allow) if base.problem is None and found.problem is None else None
    try:
        allowed = tuple(str(name) for name in json.loads((folder / RUN_FILE).read_text()).get("safe_globals", ()))
    except (OSError, ValueError):
        allowed = ()
    patch = with_safe_globals(patch_of(scan, project.root), project.root, allowed)
    return PatchedTests(stack=run, files=tuple(patch.files), diff=diff, safe_globals=allowed)


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


@dataclass(frozen=True, kw_only=True, slots=True)
class _StackTests:
    """One stack's test run as its folder holds it: run.json read once, and the outcomes or why there are none."""

    run: TestRun | None = None
    problem: str | None = None
    tests: dict[str, CaseOutcome] = field(default_factory=dict)


def _stack_tests(out: Path, folder: Path, stack: str) -> _StackTests:
    path = folder / RUN_FILE
    try:
        run = TestRun.from_reader(Reader(json.loads(path.read_text()), path.relative_to(out).as_posix()))
    except FileNotFoundError:
        return _StackTests(problem=f"the project's tests did not run in {stack} for this report "
                                   f"({command(f'project({stack})')})")
    except (OSError, ValueError, RecordError) as error:
        return _StackTests(problem=f"{path.relative_to(out).as_posix()} is unreadable ({error})")
    if run.status == "install-failed":
        return _StackTests(run=run, problem=f"the project does not install into {stack}: {run.install_error}")
    if run.status != "ran":
        return _StackTests(run=run, problem=f"the tests did not finish in {stack}: {run.problem}")
    try:
        tests = read_junit(folder / JUNIT_FILE)
    except (OSError, ValueError) as error:
        return _StackTests(run=run, problem=f"no test outcomes from {stack}: {error}")
    if not tests:  # pytest exits 5 when it collects nothing: a passing diff of no tests is no evidence
        return _StackTests(run=run, problem=f"no test outcomes from {stack}: its JUnit XML lists no test "
                                            f"(exit status {run.exit_code}); does the test command select any?")
    return _StackTests(run=run, tests=tests)
