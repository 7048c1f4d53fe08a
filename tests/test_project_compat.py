"""A team's own project through both real stacks: tests/sample_project installed into each, its
tests run and diffed, its source scanned — by `nox -s compare` and by `nox -s compat`."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from xml.etree import ElementTree

import pytest
from helpers.readers import verdict_of
from helpers.runs import load, nox
from helpers.sample_project import BREAKS, PLANTED, SAMPLE_PROJECT, copy_sample_project, where_planted

from upgrade_gate.schema.verdict import GateStatus

pytestmark = [pytest.mark.integration, pytest.mark.shares_machine]

BFLOAT16 = "tests/test_model.py::test_bfloat16_scores_stay_close_to_float"
AUTOCAST_DEPRECATED = ("`torch.cpu.amp.autocast(args...)` is deprecated. Please use `torch.amp.autocast('cpu', "
                       "args...)` instead.")
AUTOCAST_LINE = where_planted("edge_app/model.py", "torch.cpu.amp.autocast()")[0]


@pytest.fixture(scope="module")
def team(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A copy of the sample project (the built-in stacks: it has no envs/ of its own)."""
    root = copy_sample_project(tmp_path_factory.mktemp("team"))
    return root, {"UPGRADE_GATE_CONFIG": str(root / "pyproject.toml")}




def test_compat_shows_each_changed_test_and_the_planted_calls_with_their_replacements(team, tmp_path_factory):
    root, env = team
    out = root / "compat-report"
    # --fresh: the tests and the scan run here whether or not the compare test ran them already.
    result = nox("-s", "compat", "--", "--out", str(out), "--fresh", env=env)
    assert result.returncode == 1, result.stderr[-4000:]
    assert "Project compatibility: NO-GO" in result.stdout
    compat = load(out, "compat.json")
    diff = compat["project"]["diffs"]["candidate"]
    newly_failing, = diff["newly_failing"]
    assert (newly_failing["test"], newly_failing["baseline"], newly_failing["candidate"]) == (BREAKS, "passed", "failed")
    # torch's own explanation, without its terminal colours.
    assert "In PyTorch 2.6, we changed the default value of the `weights_only` argument" in newly_failing["message"]
    assert "GLOBAL edge_app.checkpoint.TrainConfig was not an allowed global" in newly_failing["message"]
    assert "\x1b" not in newly_failing["message"] and "#x1B" not in newly_failing["message"]
    assert [c["test"] for c in diff["newly_passing"]] == ["tests/test_model.py::test_embeddings_have_unit_rms"]
    assert [(c["test"], c["baseline"], c["candidate"]) for c in diff["no_longer_skipped"]] == [
        ("tests/test_checkpoint.py::test_checkpoint_loads_weights_only_with_config_allowed", "skipped", "passed")]
    assert compat["project"]["stacks"]["legacy"]["counts"] == {"passed": 7, "failed": 1, "error": 0, "skipped": 1}
    markdown = (out / "compat.md").read_text()
    assert f"`{BREAKS}` on candidate:" in markdown

    # The warnings only the candidate raises, from the tests that raise them: torch 2.8 deprecates the
    # autocast the app scores with (torch 2.2 did not warn).
    new = {(w["category"], w["message"]): w for w in compat["project"]["new_warnings"]["candidate"]}
    autocast = new["FutureWarning", AUTOCAST_DEPRECATED]
    assert (autocast["tests"], autocast["location"]) == ([BFLOAT16], f"edge_app/model.py:{AUTOCAST_LINE}"), autocast
    assert not [w for w in new.values() if BFLOAT16 in w["tests"] and w is not autocast]
    for stack in ("legacy", "candidate"):
        assert compat["project"]["stacks"][stack]["warnings_problem"] is None
    assert compat["project"]["stacks"]["candidate"]["warnings"][BFLOAT16] >= 1
    assert BFLOAT16 not in compat["project"]["stacks"]["legacy"]["warnings"]
    assert f"| FutureWarning | {AUTOCAST_DEPRECATED} | `edge_app/model.py:{AUTOCAST_LINE}` |" in markdown
    # The test venvs' packages that differ: torch, and what the candidate's spec pins beside it.
    changes = compat["project"]["package_changes"]["candidate"]
    assert changes["torch"] == {"legacy": "2.2.2", "candidate": "2.8.0"} and "executorch" in changes
    assert "Packages whose versions differ between the two test venvs" in markdown
    # How far each stack's tests were, as they ran (one line per 15 s at most, and the end).
    for stack in ("legacy", "candidate"):
        assert re.search(rf"{stack}: project: tests exit status 1, 9/9 tests done", result.stderr), result.stderr[-3000:]
        progress = json.loads((out / "project" / stack / "progress.json").read_text())
        assert (progress["collected"], progress["done"], progress["finished"]) == (9, 9, True)

    # Every planted call at its line and column (and nothing else), with why and what to write instead.
    findings = compat["project"]["scan"]["findings"]
    found = [(f["file"], f["line"], f["column"], f["code"]) for f in findings]
    assert found == sorted((file, *where_planted(file, call), code) for file, call, code in PLANTED), findings
    assert all(f["why"] and f["replacement"] for f in findings), findings
    load_finding = next(f for f in findings if f["code"] == "TOR102")
    assert "weights_only=True" in load_finding["replacement"] and "2.6" in load_finding["why"]
    assert f"| edge_app/checkpoint.py:{load_finding['line']} | TOR102 ✎ |" in markdown  # ✎: project.diff writes it
    # The project's own files only: not the reports beside them in its folder (issue 37, item 7).
    scanned = json.loads((out / compat["project"]["scan_file"]).read_text())["files"]
    assert scanned and all(f.startswith(("edge_app/", "tests/")) for f in scanned), scanned

    # Issue 64, item 3: the deploy path (trace → optimize_for_mobile → .ptl; the Lite Interpreter loader) and
    # TorchFix's torch.load fix written for the candidate in migrate/project.diff, never applied to the team's
    # files; the tests run again in the candidate on a patched copy. The checkpoint's TrainConfig, which
    # torch.load (weights_only=True) refused in that run, is allowed where the project defines it, and the tests
    # run again: every test that passes on the baseline passes.
    patch_text = (out / "migrate" / "project.diff").read_text()
    for line in ("-    traced = torch.jit.trace(model, example)",
                 "+    traced = torch.export.export(model, (example,) if isinstance(example, torch.Tensor) else "
                 "tuple(example))",
                 "+    optimized = to_edge_transform_and_lower(traced, partitioner=[XnnpackPartitioner()]).to_executorch()",
                 "+    pathlib.Path(str(path)).write_bytes(optimized.buffer)",
                 "+    return _ExecuTorchModule(str(path))", "+    checkpoint = torch.load(path, weights_only=True)",
                 "+torch.serialization.add_safe_globals([TrainConfig])  # upgrade-gate: torch.load(..., "
                 "weights_only=True) reads it"):
        assert f"\n{line}\n" in patch_text, patch_text
    assert (root / "edge_app" / "export.py").read_text() == (SAMPLE_PROJECT / "edge_app" / "export.py").read_text()
    applied = tmp_path_factory.mktemp("applied")
    shutil.copytree(SAMPLE_PROJECT, applied, dirs_exist_ok=True)
    subprocess.run(["git", "apply", "--check", "-v", str(out / "migrate" / "project.diff")], cwd=applied, check=True)
    rewritten = {(f["file"], f["code"]) for f in findings if f.get("rewritten")}
    assert rewritten == {("edge_app/export.py", "UG101"), ("edge_app/export.py", "UG102"),
                         ("edge_app/export.py", "UG103"), ("edge_app/runtime.py", "UG104"),
                         ("edge_app/checkpoint.py", "TOR102")}, findings
    patched = compat["project"]["patched"]["candidate"]
    assert patched["stack"]["run"]["status"] == "ran", patched
    assert patched["diff"]["newly_failing"] == [] and patched["safe_globals"] == [
        "edge_app.checkpoint.TrainConfig"], patched
    assert "every test that passes on the baseline passes" in (out / "migrate" / "project.diff").read_text()
    outcomes = {case.get("name"): case for case in
                ElementTree.parse(out / patched["stack"]["junit"]).getroot().iter("testcase")}
    assert list(outcomes["test_lite_interpreter_matches_eager"]) == [], "the patched export failed"
    assert list(outcomes["test_checkpoint_round_trip"]) == [], "the patched checkpoint does not load"
    assert not (out / "project" / "patched" / "candidate" / "tree").exists()  # the copy is gone after its run
    assert "With `migrate/project.diff` applied to a copy of the project" in markdown

    # Issue 37, item 8: the same code again runs no test and no scan — the results come from the result
    # cache, by key, and the report says from where.
    again_out = root / "compat-again"
    again = nox("-s", "compat", "--", "--out", str(again_out), env=env)
    assert again.returncode == 1, again.stderr[-4000:]
    for said in ("legacy: project: tests reused from the result cache", "candidate: project: tests reused from "
                 "the result cache", "scan reused from the result cache",
                 "candidate: project: tests with project.diff reused from the result cache"):
        assert said in again.stderr, again.stderr[-4000:]
    assert not re.search(r"project: tests exit status", again.stderr)  # no pytest started
    reused = load(again_out, "compat.json")["project"]
    assert reused["diffs"] == compat["project"]["diffs"]
    assert reused["scan"]["findings"] == compat["project"]["scan"]["findings"]
    for stack in ("legacy", "candidate"):
        entry = Path(reused["stacks"][stack]["run"]["reused_from"])
        assert (entry / "junit.xml").read_bytes() == (again_out / "project" / stack / "junit.xml").read_bytes()
    text = (again_out / "compat.md").read_text()
    assert "| legacy | ran (reused) |" in text and "Reused from the result cache, their key unchanged" in text




def test_a_project_the_candidate_cannot_install_is_a_finding_not_a_crash(team, tmp_path):
    # A team that pinned torch below the candidate's: the baseline installs it, the candidate cannot.
    root, _ = team
    pinned = tmp_path / "pinned"
    shutil.copytree(root, pinned, ignore=shutil.ignore_patterns("report", "compat-report", ".pytest_cache"))
    pyproject = pinned / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace("dependencies = []", 'dependencies = ["torch<2.5"]')
                         .replace('test = "python -m pytest tests"', 'test = "python -m pytest tests/test_model.py"'))
    out = pinned / "report"
    result = nox("-s", "compat", "--", "--out", str(out), env={"UPGRADE_GATE_CONFIG": str(pyproject)})
    assert result.returncode == 1, result.stderr[-3000:]
    compat = load(out, "compat.json")
    assert compat["project"]["stacks"]["candidate"]["run"]["status"] == "install-failed"
    gate = next(g for g in verdict_of(out, "compat.json").gates if g.gate == "project-tests")
    assert gate.status is GateStatus.FAILED and gate.note.startswith("the project does not install into candidate: ")
    assert "torch" in gate.note and "2.5" in gate.note
    assert compat["project"]["stacks"]["legacy"]["run"]["status"] == "ran"
    assert json.loads((out / "project" / "legacy" / "run.json").read_text())["exit_code"] == 1  # rms_norm is 2.4+
