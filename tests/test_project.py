"""The project's tests diffed per test, its gates, its configuration and its report section (no stacks)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import time
from pathlib import Path

import pytest
from helpers.stack_records import junit_of, warning, write_project_run

from upgrade_gate import layout
from upgrade_gate.config.plan import load_plan
from upgrade_gate.config.project_settings import runs_pytest
from upgrade_gate.errors import ConfigError
from upgrade_gate.judge._project_gates import project_gates
from upgrade_gate.project._diff import diff_outcomes
from upgrade_gate.project._junit import CaseOutcome, case_id, read_junit
from upgrade_gate.project.gather import gather_project
from upgrade_gate.report._project_section import project_blocks, scan_blocks
from upgrade_gate.report.render import to_markdown
from upgrade_gate.schema.project import ProjectResults
from upgrade_gate.schema.reader import Reader
from upgrade_gate.schema.verdict import GateStatus, Quantity, Severity, Unit

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
    ('root = "team"\n[tool.upgrade-gate.project.scan-allow]\n"export/onnx.py" = "ONNX"\n',
     'tool.upgrade-gate.project.scan-allow.export/onnx.py: name a rule and the files, "CODE PATTERN"'),
    ('root = "team"\n[tool.upgrade-gate.project.scan-allow]\n"UG101 export/*.py" = " "\n',
     'tool.upgrade-gate.project.scan-allow.UG101 export/*.py: give the reason these findings are not migration'),
])
def test_bad_project_tables_name_the_key(tmp_path, table, message):
    with pytest.raises(ConfigError) as caught:
        plan_of(tmp_path, table)
    assert message in str(caught.value) and "pyproject.toml" in str(caught.value)


def test_compare_still_needs_models_but_compat_does_not(tmp_path):
    config = project_config(tmp_path, 'root = "team"\n')
    with pytest.raises(ConfigError, match="no models to run"):
        load_plan([], invoked_from=tmp_path, config_path=config)


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
    cuda = "User provided device_type of 'cuda', but CUDA is not available. Disabling ({} at 0x7f3a{}c0)"
    write_project_run(out, "legacy", junit_of(test_a="passed", test_b="passed", test_c="failed", test_d="skipped"),
                      warnings=[warning("tests/test_m.py::test_b", "UserWarning", cuda.format("autocast", "11"), 2)],
                      installed={"edge-app": "0.3.0", "numpy": "1.26.4", "torch": "2.2.2"})
    autocast = "`torch.cpu.amp.autocast(args...)` is deprecated. Please use `torch.amp.autocast('cpu', args...)` instead."
    write_project_run(out, "candidate", junit_of(test_a="failed", test_b="passed", test_c="passed", test_d="skipped"),
                      warnings=[warning("tests/test_m.py::test_b", "UserWarning", cuda.format("autocast", "22"), 2),
                                warning("tests/test_m.py::test_b", "FutureWarning", autocast),
                                warning("tests/test_m.py::test_c", "FutureWarning", autocast, 2),
                                warning("", "DeprecationWarning", "torch.ao.quantization is deprecated", when="collect",
                                        location="<venv>/lib/python3.11/site-packages/torch/ao/__init__.py:9")],
                      installed={"edge-app": "0.3.0", "executorch": "0.7.0", "numpy": "1.26.4", "setuptools": "80.9.0",
                                 "torch": "2.8.0"})
    layout.scan_file(out).write_text(json.dumps(SCAN))
    evidence = gather_project(plan)
    # Per test; the UserWarning is the same on both (its object's address aside): not new.
    assert evidence.stacks["candidate"].warnings == {"tests/test_m.py::test_b": 3, "tests/test_m.py::test_c": 2,
                                                     "(collection)": 1}
    assert [(w.category, w.count, w.tests) for w in evidence.new_warnings["candidate"]] == [
        ("FutureWarning", 3, ("tests/test_m.py::test_b", "tests/test_m.py::test_c")),
        ("DeprecationWarning", 1, ("(collection)",))]
    assert evidence.package_changes("candidate") == {"executorch": {"legacy": None, "candidate": "0.7.0"},
                                                     "setuptools": {"legacy": None, "candidate": "80.9.0"},
                                                     "torch": {"legacy": "2.2.2", "candidate": "2.8.0"}}
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
    # Each rule explained once, in a legend; the finding cites it (one finding each here: all is the rule's).
    assert ("- **UG101** (1): TorchScript — TorchScript is not the candidate's export path. Instead: "
            "torch.export.export") in text
    assert "| edge_app/export.py:7 | UG101 | `torch.jit.trace(model, example)` |  |  |" in text
    cited = re.search(r"\| candidate \| ran \| 2 \| 1 \| 0 \| 1 \| 6 \| 2\.5 s \| (\S+) \|", text)
    assert cited and re.fullmatch(r"project/evidence/candidate-[0-9a-f]{16}/junit\.xml", cited[1])
    assert (out / cited[1]).read_text() == junit_of(test_a="failed", test_b="passed", test_c="passed", test_d="skipped")
    assert "Warnings new on candidate (not raised by the tests on legacy): 2" in text
    assert (f"| FutureWarning | {autocast.replace('|', '')} | `edge_app/model.py:40` | 3 | `tests/test_m.py::test_b`, "
            "`tests/test_m.py::test_c` |") in text
    assert ("| DeprecationWarning | torch.ao.quantization is deprecated | "
            "`<venv>/lib/python3.11/site-packages/torch/ao/__init__.py:9` | 1 | `(collection)` |") in text
    assert ("Packages whose versions differ between the two test venvs (a test that changed may owe it to one of "
            "these rather than to torch): 3\n\n| Package | legacy | candidate |\n|---|---|---|\n| executorch | — | "
            "0.7.0 |\n| setuptools | — | 80.9.0 |\n| torch | 2.2.2 | 2.8.0 |") in text
    assert evidence.to_dict()["package_changes"]["candidate"]["torch"] == {"legacy": "2.2.2", "candidate": "2.8.0"}


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


def test_scan_findings_on_the_allow_list_or_set_aside_are_shown_with_their_reason_and_not_counted(tmp_path):
    plan = plan_of(tmp_path, 'root = "team"\n[tool.upgrade-gate.project.scan-allow]\n'
                             '"UG101 edge_app/*.py" = "the ONNX export path, not the phone\'s"\n'
                             '"TOR102 tools/*.py" = "no such file"\n', "--out", "report")
    out = plan.settings.out_dir
    guarded = {**SCAN["findings"][1], "line": 31, "set_aside": "`TORCH_2_4` is True on the candidate's torch 2.8.0: "
                                                               "this branch never runs there"}
    layout.scan_file(out).parent.mkdir(parents=True)
    layout.scan_file(out).write_text(json.dumps({**SCAN, "torch": ["2.8.0"], "set_aside": [guarded]}))
    evidence = gather_project(plan)
    assert [(f.code, f.allowed) for f in evidence.scan.findings] == [("UG101", "the ONNX export path, not the phone's"),
                                                                     ("TOR102", "")]
    assert evidence.scan.unused_allow == ("TOR102 tools/*.py",)
    _, scan = project_gates(plan, plan.candidates[0], evidence)
    assert scan.status is GateStatus.FAILED and scan.measured == Quantity(value=1, unit=Unit.COUNT)
    assert scan.note == ("in 4 files: TOR102 ×1; 1 on the scan allow-list; 1 set aside (never run on the "
                         "candidate)")
    again = ProjectResults.from_reader(Reader(json.loads(json.dumps(evidence.to_dict())), "project"))
    assert again == evidence
    text = to_markdown(scan_blocks(again))
    assert "1 calls to change in 4 files" in text and "| edge_app/export.py:7 |" not in text
    assert ("- edge_app/export.py:7 UG101 `torch.jit.trace(model, example)`: the ONNX export path, not the phone's"
            in text)
    assert ("- edge_app/checkpoint.py:31 TOR102 `torch.load(path)`: `TORCH_2_4` is True on the candidate's torch "
            "2.8.0: this branch never runs there") in text
    assert "`project.scan-allow` keys that allowed no finding: `TOR102 tools/*.py`" in text


def test_nothing_passes_unmeasured_and_what_did_not_run_is_incomplete(tmp_path):
    # The sessions did not run for this report: the tool's gap, not the candidate's failure.
    plan = plan_of(tmp_path, 'root = "team"\n', "--out", "report")
    tests, scan = project_gates(plan, plan.candidates[0], gather_project(plan))
    assert tests.status is GateStatus.INCOMPLETE and "did not run in legacy" in tests.note
    assert scan.status is GateStatus.INCOMPLETE
    assert scan.note == "the API scan did not run for this report (nox -s scan)"


# Issue 37, item 15: what a stack's run left (run.json's status; junit_of's outcomes, or none) → the gate.
RAN, NONE = junit_of(test_a="passed"), None
STUCK = {"status": "timed-out", "problem": "killed after 20 s (project.timeout)"}
ENDED = {"status": "no-results", "problem": "exit status 0 and no JUnit XML; see project/x/test.log"}


@pytest.mark.parametrize(("baseline", "candidate", "expected"), [
    ((RAN, {}), (RAN, {}), GateStatus.PASSED),
    ((RAN, {}), (NONE, STUCK), GateStatus.FAILED),  # a hang on the candidate only: its own failure
    ((RAN, {}), (NONE, ENDED), GateStatus.FAILED),
    ((RAN, {}), (junit_of(), {"exit_code": 5}), GateStatus.FAILED),  # no test at all where the baseline had one
    ((NONE, STUCK), (NONE, STUCK), GateStatus.INCOMPLETE),  # hung in both: no outcomes to compare, no pass
    ((NONE, ENDED), (NONE, ENDED), GateStatus.INCOMPLETE),  # os._exit in both
    ((NONE, STUCK), (RAN, {}), GateStatus.INCOMPLETE),
    ((junit_of(), {"exit_code": 5}), (junit_of(), {"exit_code": 5}), GateStatus.INCOMPLETE),  # collected nothing
    ((NONE, STUCK), (NONE, {"status": "install-failed", "install_error": "torch<2.5"}), GateStatus.FAILED),
])
def test_a_stack_without_outcomes_never_passes_the_tests_gate(tmp_path, baseline, candidate, expected):
    plan = plan_of(tmp_path, 'root = "team"\nscan-severity = "off"\n', "--out", "report")
    for stack, (junit, run) in (("legacy", baseline), ("candidate", candidate)):
        write_project_run(plan.settings.out_dir, stack, junit, **run)
    gate, = project_gates(plan, plan.candidates[0], gather_project(plan))
    assert gate.status is expected, gate.note


# A team test module whose one test ends the run before pytest writes its JUnit XML, or never returns.
ENDS_THE_RUN = {
    "os._exit": "import os\n\ndef test_fine():\n    pass\n\ndef test_stops():\n    os._exit(0)\n",
    "hang": "import time\n\ndef test_fine():\n    pass\n\ndef test_stops():\n    time.sleep(600)\n",
}


@pytest.mark.parametrize("how", list(ENDS_THE_RUN))
def test_tests_that_do_not_finish_in_either_stack_are_incomplete_not_go(tmp_path, monkeypatch, how):
    # Issue 37, item 15: a test calling os._exit(0), or hanging past project.timeout, in both stacks gave
    # "Project compatibility: GO", exit 0. Real pytest runs (this Python stands for each stack's venv).
    import sys

    from upgrade_gate.pipeline import compat_report
    from upgrade_gate.project.session import run_tests

    monkeypatch.setenv("UPGRADE_GATE_COMMAND", "upgrade-gate")  # as the installed command runs it: its advice
    plan = plan_of(tmp_path, 'root = "team"\ntimeout = 2\nscan-severity = "off"\n', "--out", "report")
    (tmp_path / "team" / "test_team.py").write_text(ENDS_THE_RUN[how])
    for stack in ("legacy", "candidate"):
        run = run_tests(plan, plan.settings.project, stack, Path(sys.executable).parent, log=lambda _: None)
        assert run["status"] == {"os._exit": "no-results", "hang": "timed-out"}[how], run
    problem = {"os._exit": "exit status 0 and no JUnit XML; the run ended during team/test_team.py::test_stops (a "
                           "test that calls os._exit or kills its process?); see project/legacy/test.log",
               "hang": "killed after 2 s (project.timeout) during team/test_team.py::test_stops"}[how]
    gate, = project_gates(plan, plan.candidates[0], gather_project(plan))
    assert gate.status is GateStatus.INCOMPLETE and gate.measured is None
    assert gate.note == (f"the tests did not finish in legacy: {problem}; no outcomes on legacy to compare "
                         "candidate's with (candidate's did not either): make its tests finish there (the test "
                         "named, or project.timeout) and run upgrade-gate compat again")
    assert compat_report(plan) == 3  # INCOMPLETE: the tool could not decide; neither GO (0) nor NO-GO (1)
    assert json.loads((plan.settings.out_dir / "compat.json").read_text())["verdict"] == "INCOMPLETE"
    assert ("(`upgrade-gate compat`: the project alone; `upgrade-gate compare` judges it with the models)"
            in (plan.settings.out_dir / "compat.md").read_text())


def test_the_report_quotes_the_project_commands_so_they_can_be_pasted(tmp_path):
    # Issue 37: `python -m pytest tests -k not slow and not gpu` ran something else when pasted.
    plan = plan_of(tmp_path, 'root = "team"\ninstall = ["-e", ".[test]"]\n'
                             "test = 'python -m pytest tests -k \"not slow and not gpu\"'\n", "--out", "report")
    for stack in ("legacy", "candidate"):
        write_project_run(plan.settings.out_dir, stack, junit_of(test_a="passed"))
    text = to_markdown(project_blocks(gather_project(plan), "legacy", ["candidate"]))
    assert (f"The team's project at `{tmp_path / 'team'}`: `uv pip install -e '.[test]'` into "
            "each stack, then `python -m pytest tests -k 'not slow and not gpu'`.") in text
    pasted = re.search(r"then `([^`]+)`\.", text)
    assert pasted and tuple(shlex.split(pasted[1])) == plan.settings.project.test


def test_the_scan_venv_and_the_test_extras_pin_the_same_torchfix():
    import tomllib

    from upgrade_gate.project.session import SCAN_REQUIREMENTS

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    assert set(SCAN_REQUIREMENTS) <= set(extras)


def test_every_migration_rule_is_documented():
    import tomllib

    rules = tomllib.loads((REPO / "compat" / "migration_rules.toml").read_text())
    codes = [code for code in rules if code != "torchfix"] + list(rules.get("torchfix", {}))
    documented = (REPO / "docs" / "compat.md").read_text()
    assert codes and [c for c in codes if f"| {c} " not in documented] == []


def test_warnings_not_counted_are_said_so_and_not_compared(tmp_path):
    plan = plan_of(tmp_path, 'root = "team"\ntest = ["tox", "--", "--junitxml={junit}"]\n', "--out", "report")
    out = plan.settings.out_dir
    write_project_run(out, "legacy", junit_of(test_a="passed"))  # no warnings.json: tox ran no pytest we loaded into
    write_project_run(out, "candidate", junit_of(test_a="passed"), warnings=[])
    evidence = gather_project(plan)
    legacy = evidence.stacks["legacy"]
    assert (legacy.warnings, legacy.warning_total) == (None, None)
    assert legacy.warnings_problem == ("the test command is not pytest; upgrade-gate counts warnings with a pytest "
                                       "plugin, which only a pytest command loads (-p)")
    assert evidence.stacks["candidate"].warnings == {} and evidence.new_warnings == {}
    text = to_markdown(project_blocks(evidence, "legacy", ["candidate"]))
    assert "| legacy | ran | 1 | 0 | 0 | 0 | not counted | 2.5 s |" in text
    assert "Warnings not counted:\n\n- legacy: the test command is not pytest;" in text
    assert "Warnings not compared: they were not counted in both runs (above)." in text
    assert "Packages whose versions differ" not in text  # neither run recorded its packages

    # pytest run with -p no:warnings records none: unknown, not zero.
    layout.project_dir(out, "legacy").joinpath("warnings.json").write_text(json.dumps(
        {"schema_version": "1.0", "captured": False, "warnings": [], "dropped": 0}))
    assert gather_project(plan).stacks["legacy"].warnings_problem == (
        "the team's pytest runs without its warnings plugin (-p no:warnings)")


# A team's test module for the plugin's test: warnings at import, in tests, in a loop; a test that
# reads the progress file while it runs and checks the environment the team's tests see.
TEAM_TESTS = '''
import json, os, warnings
import pytest

warnings.warn("module-level", DeprecationWarning)


def test_warns_twice():
    warnings.warn("old API at 0x7f00aa11", FutureWarning)
    warnings.warn("old API at 0x7f00aa11", FutureWarning)


def test_warns_in_a_loop():
    warnings.simplefilter("always")  # else Python records one per place (pytest restores the filters)
    for _ in range(50):
        warnings.warn("loop", UserWarning)


def test_fails():
    assert 1 == 2


@pytest.mark.skip(reason="later")
def test_skipped():
    pass


def test_sees_its_progress_and_the_teams_environment():
    progress = json.loads(open(os.environ["PROGRESS_SEEN_AT"]).read())
    assert (progress["collected"], progress["done"], progress["running"]) == (
        5, 4, ["test_team.py::test_sees_its_progress_and_the_teams_environment"])
    assert os.environ.get("PYTHONPATH") is None and os.environ["PYTEST_PLUGINS"] == "team_plugin"
    assert "upgrade_gate_pytest" not in os.environ["PYTEST_PLUGINS"]
    assert not [name for name in os.environ if name.startswith("UPGRADE_GATE_PYTEST")]
'''


def test_the_pytest_plugin_counts_warnings_and_writes_progress_without_changing_outcomes(tmp_path, monkeypatch):
    import subprocess
    import sys

    from upgrade_gate.project._diff import per_test
    from upgrade_gate.project.gather import read_warnings
    from upgrade_gate.project.session import TestProgress, project_env, watched_command

    team, folder = tmp_path / "team", tmp_path / "out"
    team.mkdir()
    folder.mkdir()
    (team / "test_team.py").write_text(TEAM_TESTS)
    (team / "team_plugin.py").write_text("")  # the team's own PYTEST_PLUGINS entry: kept
    monkeypatch.setenv("PYTEST_PLUGINS", "team_plugin")
    monkeypatch.setenv("PROGRESS_SEEN_AT", str(folder / "progress.json"))
    monkeypatch.delenv("PYTHONPATH", raising=False)
    settings = plan_of(tmp_path, f'root = "team"\ntest = "{sys.executable} -m pytest -p no:cacheprovider --rootdir . test_team.py"\n'
                       ).settings.project
    outcomes_of = {}
    for name, env in (("alone", dict(os.environ)), ("watched", project_env(Path(sys.executable).parent, folder))):
        junit = folder / f"{name}.xml"
        command = watched_command(settings, junit) if name == "watched" else settings.test_command(junit)
        done = subprocess.run(command, cwd=team, env=env, capture_output=True, text=True, check=False, timeout=120)
        assert done.returncode == 1, done.stdout[-3000:]
        outcomes_of[name] = {t: o.outcome for t, o in read_junit(junit).items()}
    # Alone, the progress test cannot find the file: the only difference the plugin makes is the file.
    assert outcomes_of["alone"].pop("test_team.py::test_sees_its_progress_and_the_teams_environment") == "failed"
    assert outcomes_of["watched"].pop("test_team.py::test_sees_its_progress_and_the_teams_environment") == "passed"
    assert outcomes_of["alone"] == outcomes_of["watched"] == {
        "test_team.py::test_warns_twice": "passed", "test_team.py::test_warns_in_a_loop": "passed",
        "test_team.py::test_fails": "failed", "test_team.py::test_skipped": "skipped"}

    captured, warnings = read_warnings(folder / "warnings.json")
    assert captured
    assert per_test(warnings) == {"(collection)": 1, "test_team.py::test_warns_twice": 2,
                                  "test_team.py::test_warns_in_a_loop": 50}
    assert [(w.category, w.message, w.location, w.count) for w in warnings if w.test.endswith("twice")] == [
        ("FutureWarning", "old API at 0x7f00aa11", "test_team.py:9", 1),
        ("FutureWarning", "old API at 0x7f00aa11", "test_team.py:10", 1)]
    looped, = (w for w in warnings if w.test.endswith("loop"))
    assert (looped.category, looped.location, looped.count) == ("UserWarning", "test_team.py:16", 50)
    progress = json.loads((folder / "progress.json").read_text())
    assert (progress["collected"], progress["done"], progress["running"], progress["finished"]) == (5, 5, [], True)
    assert TestProgress(folder / "progress.json").poll() == "5/5 tests done"
    assert [p.name for p in folder.iterdir() if p.name.startswith(".")] == []  # no temporary file left


def test_progress_text_from_the_plugins_file(tmp_path):
    from upgrade_gate.project.session import TestProgress

    path = tmp_path / "progress.json"
    watch = TestProgress(path)
    assert watch.poll() is None  # pytest has not started (or the command is not pytest)
    path.write_text(json.dumps({"collected": None, "done": 0, "running": []}))
    assert watch.poll() == "collecting"
    path.write_text(json.dumps({"collected": 40, "done": 12, "running": ["tests/test_io.py::test_load"]}))
    os.utime(path, ns=(1, 2))  # a new mtime, whatever the file system's resolution
    assert watch.poll() == "12/40 tests done · tests/test_io.py::test_load"
    assert watch.poll() is None  # unchanged
    path.write_text(json.dumps({"collected": 40, "done": 12, "running": ["a", "b", "c"]}))
    os.utime(path, ns=(3, 4))
    assert watch.poll() == "12/40 tests done · a (+2 more)"
    path.write_text("{not json")
    os.utime(path, ns=(5, 6))
    assert watch.poll() is None and watch.last == "12/40 tests done · a (+2 more)"


def test_the_plugin_and_the_parent_name_the_same_variables():
    import importlib.util

    from upgrade_gate.project import session as project

    spec = importlib.util.spec_from_file_location("upgrade_gate_pytest", project.PLUGIN_DIR / f"{project.PLUGIN}.py")
    assert spec is not None and spec.loader is not None
    plugin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plugin)
    assert (plugin.PROGRESS_ENV, plugin.WARNINGS_ENV, plugin.RESTORE_ENV) == (
        project.PROGRESS_ENV, project.WARNINGS_ENV, project.RESTORE_ENV)
    assert sorted(p.name for p in project.PLUGIN_DIR.glob("*.py")) == [f"{project.PLUGIN}.py"]  # alone on the path


def test_new_warnings_are_kinds_the_baseline_never_raised():
    from upgrade_gate.project._diff import new_warnings
    from upgrade_gate.schema.project import RaisedWarning

    def raised(test, category, message, count=1):
        return RaisedWarning(test=test, category=category, message=message, location="m.py:1", count=count)

    baseline = (raised("t1", "UserWarning", "at 0x7f00aa11 in /tmp/pytest-of-root/pytest-3/t1"),)
    candidate = (raised("t1", "UserWarning", "at 0x7f99bb22 in /tmp/pytest-of-root/pytest-8/t1"),  # the same
                 raised("t1", "UserWarning", "other"), raised("t2", "UserWarning", "other", 4),
                 raised("t2", "FutureWarning", "at 0x7f00aa11 in /tmp/pytest-of-root/pytest-3/t1"))  # another category
    assert [(w.category, w.message, w.count, w.tests) for w in new_warnings(baseline, candidate)] == [
        ("UserWarning", "other", 5, ("t1", "t2")),
        ("FutureWarning", "at 0x7f00aa11 in /tmp/pytest-of-root/pytest-3/t1", 1, ("t2",))]


def test_a_test_run_shows_its_progress_and_records_warnings_and_packages(tmp_path, monkeypatch):
    import sys

    from upgrade_gate.project import session as project
    from upgrade_gate.project.session import run_tests

    plan = plan_of(tmp_path, 'root = "team"\n', "--out", "report")
    (tmp_path / "team" / "test_team.py").write_text(
        "import time, warnings\n\ndef test_slow():\n    time.sleep(1.0)\n\n"
        "def test_warns():\n    warnings.warn('use the new API', FutureWarning)\n")
    monkeypatch.setattr(project, "PROGRESS_LINES_EVERY_S", 0.0)  # every change a line (CI gets one per 15 s)
    lines: list[str] = []
    run = run_tests(plan, plan.settings.project, "legacy", Path(sys.executable).parent, log=lines.append)
    assert (run["status"], run["exit_code"]) == ("ran", 0), lines
    # Node ids from pytest's rootdir, the folder of the configuration here.
    assert any(line.endswith("legacy: project: tests: 0/2 tests done · team/test_team.py::test_slow") for line in lines), lines
    assert lines[-2].endswith("legacy: project: tests exit status 0, 2/2 tests done"), lines
    # What the tests ran with, read from the venv's dist-info folders: this Python's own packages.
    assert run["installed"]["pytest"] == __import__("pytest").__version__
    evidence = gather_project(plan).stacks["legacy"]
    assert evidence.warnings == {"team/test_team.py::test_warns": 1} and evidence.run.installed == run["installed"]


def test_a_later_run_does_not_change_the_evidence_an_earlier_report_cites(tmp_path):
    # Issue 26: `compat` after `compare` ran the project sessions again into project/<stack>/ and
    # project/scan.json, and compare's report pointed at files that no longer said what it did.
    plan = plan_of(tmp_path, 'root = "team"\n', "--out", "report")
    out = plan.settings.out_dir
    first_junit = junit_of(test_a="passed", test_b="failed")
    write_project_run(out, "legacy", junit_of(test_a="passed", test_b="passed"), warnings=[])
    write_project_run(out, "candidate", first_junit, warnings=[])
    (layout.project_dir(out, "candidate") / "test.log").write_text("1 failed, 1 passed\n")
    layout.scan_file(out).write_text(json.dumps(SCAN))
    earlier = gather_project(plan)
    earlier_gates = project_gates(plan, plan.candidates[0], earlier)

    def cited(evidence, gates):
        junits = [s.junit for s in evidence.stacks.values()]
        in_gates = [part for g in gates for part in g.evidence.split(" vs ")]
        assert set(in_gates) == {*junits, evidence.scan_file}  # the gates cite what the tables cite
        return {path: (out / path).read_bytes() for path in {*junits, evidence.scan_file}}

    before = cited(earlier, earlier_gates)
    assert before[earlier.stacks["candidate"].junit] == first_junit.encode()
    assert json.loads(before[earlier.scan_file]) == SCAN

    # The later run: other outcomes on the candidate, another scan; the legacy run gives the same files.
    shutil.rmtree(layout.project_dir(out, "candidate"))
    write_project_run(out, "candidate", junit_of(test_a="passed", test_b="passed"), warnings=[], duration_s=3.0)
    (layout.project_dir(out, "candidate") / "test.log").write_text("2 passed\n")
    layout.scan_file(out).write_text(json.dumps({**SCAN, "findings": SCAN["findings"][:1]}))
    later = gather_project(plan)
    later_gates = project_gates(plan, plan.candidates[0], later)
    after = cited(later, later_gates)

    # The earlier report's files are as they were, and still give its outcomes and findings.
    assert {path: (out / path).read_bytes() for path in before} == before
    assert read_junit(out / earlier.stacks["candidate"].junit)["tests/test_m.py::test_b"].outcome == "failed"
    assert (out / earlier.stacks["candidate"].junit).with_name("test.log").read_text() == "1 failed, 1 passed\n"
    assert [g.status for g in earlier_gates] == [GateStatus.FAILED, GateStatus.FAILED]
    # The later one cites its own; the same content is one copy, not two.
    assert [g.status for g in later_gates] == [GateStatus.PASSED, GateStatus.FAILED]
    assert later.stacks["candidate"].junit != earlier.stacks["candidate"].junit
    assert later.scan_file != earlier.scan_file and len(json.loads(after[later.scan_file])["findings"]) == 1
    assert later.stacks["legacy"].junit == earlier.stacks["legacy"].junit
    evidence_dir = out / "project" / "evidence"
    assert sorted(p.name.split("-")[0] for p in evidence_dir.iterdir()) == [
        "candidate", "candidate", "legacy", "scan", "scan"]
    # And results.json keeps what it cites.
    assert ProjectResults.from_reader(Reader(json.loads(json.dumps(earlier.to_dict())), "project")) == earlier


# -- results reused by content (issue 37, item 8: `compat` right after `compare` ran both suites and the scan
# again, 6 minutes, on unchanged code) ------------------------------------------------------------------------

COUNTED_TESTS = '''
import pathlib

def test_ok():
    with open(pathlib.Path(__file__).parents[1] / "runs.txt", "a") as runs:  # outside the project: not its source
        runs.write("ran\\n")

def test_no():
    assert 1 == 2
'''


def test_a_test_run_on_unchanged_code_is_reused_by_key_and_the_report_says_from_where(tmp_path, monkeypatch):
    import sys

    from upgrade_gate.project.session import run_tests
    from upgrade_gate.run.cache_folder import reached_entries

    monkeypatch.setenv("UPGRADE_GATE_CACHE", str(tmp_path / "ug"))  # a result cache of the test's own
    (tmp_path / "team").mkdir()
    (tmp_path / "team" / "test_team.py").write_text(COUNTED_TESTS)
    bin_dir = Path(sys.executable).parent  # this Python stands for the stack's venv: its packages, its key

    def run(*posargs: str) -> tuple[dict, list[str]]:
        plan = plan_of(tmp_path, 'root = "team"\n', "--out", "report", *posargs)
        lines: list[str] = []
        return run_tests(plan, plan.settings.project, "legacy", bin_dir, log=lines.append), lines

    def runs() -> int:
        return len((tmp_path / "runs.txt").read_text().splitlines())

    out = tmp_path / "report"
    first, _ = run()
    assert (first["status"], runs(), "reused_from" in first) == ("ran", 1, False)
    key_record = json.loads((out / "project" / "legacy" / "tests.cache.json").read_text())
    entry = tmp_path / "ug" / "results" / "legacy" / "project" / "tests" / key_record["key"]
    assert key_record["stored"] and key_record["entry"] == ["legacy", "project", "tests"]
    junit = (out / "project" / "legacy" / "junit.xml").read_bytes()

    second, lines = run()
    assert runs() == 1  # the tests did not run again
    assert second["reused_from"] == str(entry) and second["exit_code"] == 1 and second["status"] == "ran"
    assert (out / "project" / "legacy" / "junit.xml").read_bytes() == junit
    stored = time.strftime("%Y-%m-%d %H:%M", time.localtime(json.loads((entry / "manifest.json").read_text())["stored_at"]))
    assert lines == [f"legacy: project: tests reused from the result cache (entry {key_record['key'][:12]}, stored "
                     f"{stored}: the same project files, packages and command; --fresh runs it again) → {entry}"]
    # The report says so, and where from; prune-cache keeps the entry the report folder used.
    plan = plan_of(tmp_path, 'root = "team"\n', "--out", "report")
    write_project_run(out, "candidate", junit_of(test_a="passed"))
    evidence = gather_project(plan)
    assert evidence.stacks["legacy"].run.reused_from == str(entry)
    text = to_markdown(project_blocks(evidence, "legacy", ["candidate"]))
    assert "| legacy | ran (reused) | 1 | 1 | 0 | 0 |" in text
    assert (f"Reused from the result cache, their key unchanged (the project's files, the installed packages, the "
            f"command or scanner): legacy's tests (`{entry}`). `--fresh` runs them again.") in text
    assert ("legacy", "project", "tests", key_record["key"]) in reached_entries(out)

    # Any file of the project changes the key (data a test reads, not only code); --fresh runs them anyway.
    (tmp_path / "team" / "expected.csv").write_text("a,b\n")
    third, _ = run()
    assert (runs(), "reused_from" in third) == (2, False)
    fourth, _ = run("--fresh")
    assert (runs(), "reused_from" in fourth) == (3, False)
    # A run without outcomes is not kept: the next one runs again.
    (tmp_path / "team" / "test_team.py").write_text(COUNTED_TESTS + "\nimport os\n\ndef test_stop():\n    os._exit(0)\n")
    assert [run()[0]["status"] for _ in range(2)] == ["no-results", "no-results"] and runs() == 5


def test_the_scan_reads_the_teams_source_alone_and_is_reused_while_it_is_unchanged(tmp_path, monkeypatch):
    # Issue 37, item 7: a report folder inside the repository had its diagnose reproducer scanned (TOR102 in
    # report/stacks/…/repro.py), and the count moved with whether a diagnose ran. Item 8: no work done twice.
    import sys

    from upgrade_gate.pipeline import take_folders_or_exit
    from upgrade_gate.project.gather import read_scan
    from upgrade_gate.project.session import run_scan

    team = tmp_path / "team"
    team.mkdir()
    monkeypatch.setenv("UPGRADE_GATE_CACHE", str(team / "ug-cache"))  # configured inside the repository
    # Issue 63: a call a version guard keeps from the candidate's torch (envs/candidate.toml pins 2.8.0) is set aside.
    (team / "app.py").write_text("import torch\nstate = torch.load(path)\nif not TORCH_2_4:\n    torch.jit.trace(m, x)\n")
    bin_dir = Path(sys.executable).parent  # has torchfix and libcst, as the scan venv does

    def scanned(*posargs: str) -> tuple[object, list[str]]:
        plan = plan_of(tmp_path, 'root = "team"\n', "--out", "team/report", *posargs)
        take_folders_or_exit(plan.settings.out_dir, plan.settings.cache_dir)  # what every session does first
        lines: list[str] = []
        assert run_scan(plan, bin_dir, log=lines.append) is None
        return read_scan(plan.settings.out_dir / "project" / "scan.json"), lines

    repro = team / "report" / "stacks" / "candidate" / "models" / "m" / "diagnose" / "repro" / "forward" / "repro.py"
    repro.parent.mkdir(parents=True)
    repro.write_text("import torch\nx = torch.load('inputs.pt')\n")
    first, lines = scanned()
    assert [(f.file, f.code) for f in first.findings] == [("app.py", "TOR102")] and first.files_scanned == 1
    assert (first.torch, [(f.line, f.code) for f in first.set_aside]) == (("2.8.0",), [(4, "UG101")])
    assert first.reused_from is None and any(re.fullmatch(r"\[1/1 \d+:\d\d\] scan 1 files in \d+ s", line)
                                             for line in lines), lines
    # The cache inside the repository holds the scan's own record now: tagged, so not read either.
    assert (team / "ug-cache" / "results" / "CACHEDIR.TAG").is_file()

    second, lines = scanned()
    key = json.loads((team / "report" / "project" / "scan.cache.json").read_text())["key"]
    assert second.reused_from == str(team / "ug-cache" / "results" / "scan" / "project" / "scan" / key)
    assert second.findings == first.findings and len(lines) == 1 and "scan reused from the result cache" in lines[0]
    (team / "lib.py").write_text("import torch\ntorch.jit.script(f)\n")
    third, _ = scanned()
    assert third.reused_from is None and [f.code for f in third.findings] == ["TOR102", "UG101"]
    assert scanned("--fresh")[0].reused_from is None


def test_scan_progress_text_from_the_scanners_file(tmp_path):
    from upgrade_gate.project.session import ScanProgress

    path = tmp_path / "scan-progress.json"
    watch = ScanProgress(path)
    assert watch.poll() is None  # the scanner is still importing libcst
    path.write_text(json.dumps({"done": 120, "total": 412, "file": "timm/layers/patch_embed.py"}))
    assert watch.poll() == "120/412 files · timm/layers/patch_embed.py"
    assert watch.poll() is None  # unchanged
    path.write_text("{half")
    assert watch.poll() is None and watch.last == "120/412 files · timm/layers/patch_embed.py"
