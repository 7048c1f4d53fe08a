"""The project's tests diffed per test, its gates, its configuration and its report section (no stacks)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from upgrade_gate import layout
from upgrade_gate.document import to_markdown
from upgrade_gate.errors import ConfigError
from upgrade_gate.plan import load_plan
from upgrade_gate.policy import project_gates
from upgrade_gate.project import CaseOutcome, ProjectResults, case_id, diff_outcomes, gather_project, read_junit
from upgrade_gate.records import Reader
from upgrade_gate.report import project_blocks
from upgrade_gate.results import GateStatus, Quantity, Severity, Unit
from upgrade_gate.settings import runs_pytest

REPO = Path(__file__).resolve().parents[1]

# What pytest writes with -o junit_family=xunit1: each case names its file and line.
XUNIT1 = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="1" failures="1" skipped="1" tests="5" time="3.2">
<testcase classname="tests.test_checkpoint" name="test_round_trip" file="tests/test_checkpoint.py" line="10" time="0.5">
<failure message="_pickle.UnpicklingError: Weights only load failed. [+1 more line; full report in element text]">def test_round_trip(tmp_path):
&gt;       restored = load_checkpoint(path)
E       _pickle.UnpicklingError: Weights only load failed. #x1B[1mdo those steps only if you trust the source#x1B[0m.
E       	(1) In PyTorch 2.6, we changed the default</failure></testcase>
<testcase classname="tests.test_plain" name="test_no_e_lines" file="tests/test_plain.py" line="1" time="0.0">
<failure message="assert 1 == 2">line one
line two</failure></testcase>
<testcase classname="tests.test_export.TestLite" name="test_ptl[cpu]" file="tests/test_export.py" line="3" time="1.0"/>
<testcase classname="tests.test_ops" name="test_rms_norm" file="tests/test_ops.py" line="7" time="0.1">
<skipped type="pytest.skip" message="needs torch 2.4">tests/test_ops.py:7: needs torch 2.4</skipped></testcase>
<testcase classname="" name="tests.test_broken" time="0.0"><error message="collection failure">ImportError: no module named gone</error></testcase>
<testcase classname="tests.test_ok" name="test_ok" file="tests/test_ok.py" line="1" time="0.0"/>
</testsuite></testsuites>
"""


def test_junit_cases_become_pytest_node_ids_with_outcome_and_message(tmp_path):
    path = tmp_path / "junit.xml"
    path.write_text(XUNIT1)
    tests = read_junit(path)
    assert {t: o.outcome for t, o in tests.items()} == {
        "tests/test_checkpoint.py::test_round_trip": "failed",
        "tests/test_export.py::TestLite::test_ptl[cpu]": "passed",
        "tests/test_ops.py::test_rms_norm": "skipped",
        "tests.test_broken": "error",
        "tests/test_ok.py::test_ok": "passed",
        "tests/test_plain.py::test_no_e_lines": "failed",
    }
    failure = tests["tests/test_checkpoint.py::test_round_trip"]
    # pytest's "E" lines, whole, without the terminal colours torch puts in its message.
    assert failure.message == ("_pickle.UnpicklingError: Weights only load failed. do those steps only if you trust "
                               "the source.\n(1) In PyTorch 2.6, we changed the default")
    assert tests["tests/test_plain.py::test_no_e_lines"].message == "assert 1 == 2\nline one\nline two"
    assert failure.duration_s == 0.5
    assert tests["tests/test_ops.py::test_rms_norm"].message.startswith("needs torch 2.4")


@pytest.mark.parametrize(("classname", "name", "file", "expected"), [
    ("tests.test_a", "test_x", "tests/test_a.py", "tests/test_a.py::test_x"),
    ("tests.test_a.TestK.TestInner", "test_x", "tests/test_a.py", "tests/test_a.py::TestK::TestInner::test_x"),
    ("tests.test_a", "test_x", None, "tests.test_a::test_x"),  # xunit2: no file
    ("suite", "case", "other.py", "suite::case"),  # a file that is not the class's module
    ("", "lonely", None, "lonely"),
])
def test_case_ids(classname, name, file, expected):
    assert case_id(classname, name, file) == expected


@pytest.mark.parametrize("text", ["not xml <", "<html><body/></html>"])
def test_a_file_that_is_not_junit_is_refused(tmp_path, text):
    path = tmp_path / "junit.xml"
    path.write_text(text)
    with pytest.raises(ValueError, match="junit.xml"):
        read_junit(path)


def outcomes(**by_id: str) -> dict[str, CaseOutcome]:
    return {t: CaseOutcome(test_id=t, outcome=o, message=f"{o} message" if o != "passed" else "")
            for t, o in by_id.items()}


# baseline outcome, candidate outcome (None: absent) → the group it lands in (None: unchanged).
@pytest.mark.parametrize(("before", "after", "group"), [
    ("passed", "passed", None),
    ("passed", "failed", "newly_failing"),
    ("passed", "error", "newly_failing"),
    ("passed", None, "newly_failing"),  # did not run: a collection error on the candidate
    ("failed", "passed", "newly_passing"),
    ("error", "passed", "newly_passing"),
    ("failed", "error", "still_failing"),
    ("passed", "skipped", "newly_skipped"),
    ("failed", "skipped", "newly_skipped"),
    ("skipped", "passed", "no_longer_skipped"),
    ("skipped", "failed", "no_longer_skipped"),
    ("skipped", "skipped", None),
    ("failed", None, "only_baseline"),
    ("skipped", None, "only_baseline"),
    (None, "passed", "only_candidate"),
    (None, "failed", "only_candidate"),
])
def test_every_pair_of_outcomes_lands_in_one_group(before, after, group):
    baseline = outcomes(**({"t": before} if before else {}), other="passed")
    candidate = outcomes(**({"t": after} if after else {}), other="passed")
    diff = diff_outcomes(baseline, candidate)
    found = {name: [c.test_id for c in changes] for name, changes in diff.to_dict().items()
             if name != "unused_allow" and changes for changes in [getattr(diff, name)]}
    assert found == ({group: ["t"]} if group else {})


def test_the_allow_list_accepts_a_break_with_its_reason_and_names_unused_entries():
    baseline = outcomes(a="passed", b="passed", c="passed")
    candidate = outcomes(a="failed", b="error", c="passed")
    diff = diff_outcomes(baseline, candidate, {"a": "pickled configs are migrated in release 7", "zzz": "typo"})
    assert [c.test_id for c in diff.breaking] == ["b"]
    assert [(c.test_id, c.allowed) for c in diff.accepted] == [("a", "pickled configs are migrated in release 7")]
    assert diff.unused_allow == ("zzz",)
    assert diff.to_dict()["newly_failing"][1] == {"test": "b", "baseline": "passed", "candidate": "error",
                                                 "message": "error message", "allowed": None}


@pytest.mark.parametrize(("command", "expected"), [
    (["pytest", "tests"], True), (["python", "-m", "pytest"], True), (["python3.11", "-m", "pytest", "-x"], True),
    (["/venv/bin/py.test"], True), (["tox"], False), (["python", "-m", "unittest"], False), ([], False),
])
def test_pytest_commands_are_recognised(command, expected):
    assert runs_pytest(command) is expected


def project_config(tmp_path: Path, table: str) -> Path:
    (tmp_path / "team").mkdir(exist_ok=True)
    (tmp_path / "team" / "src").mkdir(exist_ok=True)
    config = tmp_path / "pyproject.toml"
    config.write_text(f'[tool.upgrade-gate]\nenvs = "{Path(__file__).parents[1] / "envs"}"\nsuite = "none"\n'
                      f"[tool.upgrade-gate.project]\n{table}")
    return config


def plan_of(tmp_path: Path, table: str, *posargs: str):
    return load_plan(list(posargs), invoked_from=tmp_path, config_path=project_config(tmp_path, table),
                     models_required=False)


def test_project_settings_and_the_junit_argument_pytest_gets(tmp_path):
    plan = plan_of(tmp_path, 'root = "team"\ninstall = "-e .[test]"\ntest = "python -m pytest tests -q"\n'
                             'scan = ["src"]\n[tool.upgrade-gate.project.allow]\n"tests/t.py::test_a" = "known"\n')
    project = plan.settings.project
    assert project.root == tmp_path / "team" and project.install == ("-e", ".[test]")
    assert project.test_command(Path("/o/junit.xml")) == [
        "python", "-m", "pytest", "tests", "-q", "--junitxml=/o/junit.xml", "-o", "junit_family=xunit1"]
    assert (project.scan, project.allow, project.severity, project.scan_severity, project.timeout_s) == (
        ("src",), (("tests/t.py::test_a", "known"),), "hard", "soft", 1800.0)
    assert plan.models == ()  # `nox -s compat` runs no models
    other = plan_of(tmp_path, 'root = "team"\ntest = ["tox", "--", "--junit={junit}"]\n').settings.project
    assert other.test_command(Path("/o/j.xml")) == ["tox", "--", "--junit=/o/j.xml"]


@pytest.mark.parametrize(("table", "message"), [
    ('root = "nowhere"\n', "tool.upgrade-gate.project.root: "),
    ('root = "team"\ntest = "make check"\n', "tool.upgrade-gate.project.test: cannot tell where 'make' writes JUnit XML"),
    ('root = "team"\ntest = "pytest \'unclosed"\n', "tool.upgrade-gate.project.test: cannot split"),
    ('root = "team"\ninstall = []\n', "tool.upgrade-gate.project.install: nothing to install"),
    ('root = "team"\nscan = ["lib"]\n', "tool.upgrade-gate.project.scan: 'lib' does not exist"),
    ('root = "team"\ntests = "pytest"\n', "tool.upgrade-gate.project.tests: unknown key"),
    ('root = "team"\nseverity = "fatal"\n', "tool.upgrade-gate.project.severity: expected one of hard, soft, off"),
    ('root = "team"\n[tool.upgrade-gate.project.allow]\n"t::a" = ""\n',
     'tool.upgrade-gate.project.allow.t::a: give the reason'),
])
def test_bad_project_tables_name_the_key(tmp_path, table, message):
    with pytest.raises(ConfigError) as caught:
        plan_of(tmp_path, table)
    assert message in str(caught.value) and "pyproject.toml" in str(caught.value)


def test_compare_still_needs_models_but_compat_does_not(tmp_path):
    config = project_config(tmp_path, 'root = "team"\n')
    with pytest.raises(ConfigError, match="no models to run"):
        load_plan([], invoked_from=tmp_path, config_path=config)


def write_project_run(out: Path, stack: str, junit: str | None, **run: object) -> None:
    folder = layout.project_dir(out, stack)
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"schema_version": "1.0", "stack": stack, "status": "ran",
                                                 "command": ["python", "-m", "pytest"], "duration_s": 2.5, **run}))
    if junit is not None:
        (folder / "junit.xml").write_text(junit)


def junit_of(**by_name: str) -> str:
    cases = []
    for name, outcome in by_name.items():
        inner = {"passed": "", "failed": "<failure message='AssertionError: boom'>&gt;  check()\nE   AssertionError: boom</failure>",
                 "skipped": "<skipped message='later'/>", "error": "<error message='fixture'/>"}[outcome]
        cases.append(f"<testcase classname='tests.test_m' name='{name}' file='tests/test_m.py' line='1'>{inner}</testcase>")
    return f"<testsuites><testsuite name='pytest'>{''.join(cases)}</testsuite></testsuites>"


SCAN = {"schema_version": "1.0", "scanner": {"torchfix": "0.7.0", "rules": 9}, "root": "/team", "paths": ["."],
        "files_scanned": 4, "errors": [],
        "findings": [{"file": "edge_app/export.py", "line": 7, "column": 12, "code": "UG101", "source": "upgrade-gate",
                      "name": "torch.jit.trace", "call": "torch.jit.trace(model, example)", "summary": "TorchScript",
                      "why": "TorchScript is not the candidate's export path", "replacement": "torch.export.export"},
                     {"file": "edge_app/checkpoint.py", "line": 20, "column": 12, "code": "TOR102",
                      "source": "torchfix", "name": "torch.load", "call": "torch.load(path)", "summary": "unsafe",
                      "why": "weights_only defaults to True since 2.6", "replacement": "torch.load(path, weights_only=True)"}]}


def test_a_newly_failing_test_fails_the_hard_gate_and_the_report_shows_its_message(tmp_path):
    plan = plan_of(tmp_path, 'root = "team"\n', "--out", "report")
    out = plan.settings.out_dir
    write_project_run(out, "legacy", junit_of(test_a="passed", test_b="passed", test_c="failed", test_d="skipped"))
    write_project_run(out, "candidate", junit_of(test_a="failed", test_b="passed", test_c="passed", test_d="skipped"))
    layout.scan_file(out).write_text(json.dumps(SCAN))
    evidence = gather_project(plan)
    tests, scan = project_gates(plan, plan.candidates[0], evidence)
    assert (tests.gate, tests.model, tests.severity, tests.status) == (
        "project-tests", "project", Severity.HARD, GateStatus.FAILED)
    assert tests.measured == Quantity(value=1, unit=Unit.COUNT)
    assert tests.measured_text == ("newly failing tests = 1 (tests/test_m.py::test_a (AssertionError: boom); "
                                   "2/4 passed on candidate)")
    assert tests.threshold_text == ("newly failing tests = 0, no test that passes on legacy fails, errors or goes "
                                    "missing on candidate")
    assert (scan.gate, scan.severity, scan.status) == ("api-scan", Severity.SOFT, GateStatus.FAILED)
    assert scan.measured == Quantity(value=2, unit=Unit.COUNT) and scan.note == "in 4 files: TOR102 ×1, UG101 ×1"

    # What results.json holds of the project reads back as it was, and renders.
    again = ProjectResults.from_reader(Reader(json.loads(json.dumps(evidence.to_dict())), "project"))
    assert again == evidence
    text = to_markdown(project_blocks(again, "legacy", ["candidate"]))
    assert "| `tests/test_m.py::test_a` | passed | failed | AssertionError: boom |  |" in text
    assert "Newly passing (failed on legacy): 1" in text
    assert "`tests/test_m.py::test_a` on candidate:\n\n```\nAssertionError: boom\n```" in text
    assert "| edge_app/export.py:7 | UG101 | `torch.jit.trace(model, example)` | TorchScript is not the " in text
    assert "| candidate | ran | 2 | 1 | 0 | 1 | 2.5 s | project/candidate/junit.xml |" in text


def test_allowed_breaks_pass_and_a_missing_run_fails_saying_which(tmp_path):
    plan = plan_of(tmp_path, 'root = "team"\nscan-severity = "off"\n[tool.upgrade-gate.project.allow]\n'
                             '"tests/test_m.py::test_a" = "accepted: configs migrate in 7.0"\n', "--out", "report")
    out = plan.settings.out_dir
    write_project_run(out, "legacy", junit_of(test_a="passed"))
    write_project_run(out, "candidate", junit_of(test_a="failed"))
    gate, = project_gates(plan, plan.candidates[0], gather_project(plan))
    assert gate.status is GateStatus.PASSED and gate.measured == Quantity(value=0, unit=Unit.COUNT)
    assert gate.note == "1 accepted; 0/1 passed on candidate"
    assert gate.threshold_text.endswith("; 1 on the allow-list")

    layout.project_dir(out, "candidate").joinpath("run.json").write_text(json.dumps(
        {"status": "install-failed", "install_error": "torch==2.8.0 and edge-app depend on torch<2.5"}))
    gate, = project_gates(plan, plan.candidates[0], gather_project(plan))
    assert gate.status is GateStatus.FAILED and gate.measured is None
    assert gate.note == "the project does not install into candidate: torch==2.8.0 and edge-app depend on torch<2.5"


def test_nothing_passes_unmeasured_and_what_did_not_run_is_incomplete(tmp_path):
    # The sessions did not run for this report: the tool's gap, not the candidate's failure.
    plan = plan_of(tmp_path, 'root = "team"\n', "--out", "report")
    tests, scan = project_gates(plan, plan.candidates[0], gather_project(plan))
    assert tests.status is GateStatus.INCOMPLETE and "did not run in legacy" in tests.note
    assert scan.status is GateStatus.INCOMPLETE
    assert scan.note == "the API scan did not run for this report (nox -s scan)"


def test_the_scan_venv_and_the_test_extras_pin_the_same_torchfix():
    import tomllib

    from upgrade_gate.project import SCAN_REQUIREMENTS

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    assert set(SCAN_REQUIREMENTS) <= set(extras)


def test_every_migration_rule_is_documented():
    import tomllib

    rules = tomllib.loads((REPO / "compat" / "migration_rules.toml").read_text())
    codes = [code for code in rules if code != "torchfix"] + list(rules.get("torchfix", {}))
    documented = (REPO / "docs" / "compat.md").read_text()
    assert codes and [c for c in codes if f"| {c} " not in documented] == []
