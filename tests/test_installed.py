"""upgrade-gate as a team uses it: installed from a wheel into a venv of its own, run in the team's
repository by the ``upgrade-gate`` command, with nothing of this checkout importable."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import nox.virtualenv
import pytest
from helpers.readers import validate_junit, verdict_of
from helpers.runs import load
from helpers.sample_project import BREAKS, copy_sample_project

from upgrade_gate import cli
from upgrade_gate.schema.verdict import GateStatus, Severity

REPO = Path(__file__).resolve().parents[1]
UV = nox.virtualenv.find_uv()[1]


def outside_this_checkout() -> dict[str, str]:
    """The environment of a shell in the team's repository: no path into this checkout."""
    return {name: value for name, value in os.environ.items() if name not in ("PYTHONPATH", "UPGRADE_GATE_CONFIG")}


@pytest.mark.shares_machine
@pytest.mark.integration
def test_an_installed_upgrade_gate_judges_a_teams_repository(tmp_path):
    # The sdist, then the wheel built from it: what `pip install upgrade-gate` or a git URL gets.
    built = subprocess.run([UV, "build", "--out-dir", str(tmp_path / "dist"), str(REPO)], capture_output=True,
                           text=True, timeout=600, check=False)
    assert built.returncode == 0, built.stderr[-3000:]
    wheel, = (tmp_path / "dist").glob("upgrade_gate-*.whl")
    tool = tmp_path / "tool"
    subprocess.run([UV, "venv", "-q", "-p", "3.11", str(tool)], check=True, timeout=120)
    subprocess.run([UV, "pip", "install", "-q", "--python", str(tool / "bin" / "python"), str(wheel)], check=True,
                   timeout=600)
    team = copy_sample_project(tmp_path / "team")  # its own model, tests and pyproject.toml; no envs/
    env = outside_this_checkout()
    where = subprocess.run([str(tool / "bin" / "python"), "-c", "import upgrade_gate.layout as l; print(l.TOOL_ROOT)"],
                           cwd=team, env=env, capture_output=True, text=True, check=True)
    tool_root = Path(where.stdout.strip())
    assert tool_root.is_relative_to(tool) and (tool_root / "compat" / "worker.py").is_file()
    # The benchmarks are a tool of this repository: the wheel does not carry them, and the command says so.
    assert not [name for name in zipfile.ZipFile(wheel).namelist() if "benchmark" in name or "scripted" in name]
    refused = subprocess.run([str(tool / "bin" / "upgrade-gate"), "benchmark", "--", "gate"], cwd=team, env=env,
                             capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and refused.stderr.splitlines()[-1] == (
        "upgrade-gate: error: the benchmarks run from a checkout of upgrade-gate: they and their stacks are in its "
        f"tests/benchmarks/, which an installed package does not carry ({tool_root / 'tests' / 'benchmarks'})")

    # From a folder inside the team's repository: the command finds its pyproject.toml above.
    # --fresh: the workers from the wheel export and run, whatever the cache holds.
    result = subprocess.run([str(tool / "bin" / "upgrade-gate"), "compare", "--", "--fresh"], cwd=team / "tests",
                            env=env, capture_output=True, text=True, timeout=1800)
    # NO-GO: a test of the team's that passes on the baseline fails on the candidate (tests/test_project_compat.py).
    assert result.returncode == 1, result.stderr[-4000:]
    verdict = json.loads((team / "report" / "verdict.json").read_text())
    assert verdict["verdict"] == "NO-GO"
    gates = {(g["model"], g["gate"]): g["status"] for g in verdict["gates"]}
    assert gates[("edge-classifier", "export")] == gates[("edge-classifier", "numerics")] == "passed"
    assert gates[("project", "project-tests")] == "failed"
    results = json.loads((team / "report" / "results.json").read_text())
    assert results["settings"]["envs"] == str(team / "envs")  # absent: the built-in stacks, from the wheel
    assert list(results["stacks"]) == ["legacy", "candidate"]
    # The stacks' venvs are the team's (nox names a folder by a hash when its path is long), each
    # made from its recipe: run and project, per stack.
    recipes = [json.loads(path.read_text()) for path in (team / ".nox").glob("*/upgrade-gate-recipe.json")]
    assert sorted(r["requirements"][0] for r in recipes) == ["torch==2.2.2", "torch==2.2.2", "torch==2.8.0",
                                                            "torch==2.8.0"]

    # What the compare says of the team's project, as tests/test_project_compat.py's compat session says it: the
    # same report a checkout's `nox -s compare` writes (one run of the team's tests in both stacks serves both).
    out = team / "report"
    gates = verdict_of(out).gates
    hard = [(g.model, g.gate) for g in gates if g.status is GateStatus.FAILED and g.severity is Severity.HARD]
    assert hard == [("project", "project-tests")], hard
    scan = next(g for g in gates if g.gate == "api-scan")
    assert (scan.status, scan.severity) == (GateStatus.FAILED, Severity.SOFT)  # the migration's to-do list
    # The team's model went through both stacks like a built-in one.
    assert {g.gate for g in gates if g.model == "edge-classifier" and g.status is GateStatus.PASSED} >= {
        "export", "numerics", "same-inputs"}
    tests = next(g for g in gates if g.gate == "project-tests")
    assert tests.measured.value == 1
    assert tests.note.startswith(f"{BREAKS} (_pickle.UnpicklingError: Weights only load failed.")

    results = load(out, "results.json")
    project = results["project"]
    for stack in ("legacy", "candidate"):
        run = project["stacks"][stack]["run"]
        assert run["status"] == "ran" and run["exit_code"] == 1, run  # pytest: a test failed
        assert (out / "project" / stack / "junit.xml").is_file() and (out / "project" / stack / "test.log").is_file()
    report = (out / "report.md").read_text()
    assert "## Project compatibility" in report
    assert f"| `{BREAKS}` | passed | failed | _pickle.UnpicklingError: Weights only load failed." in report
    assert re.search(r"\| Project compatibility: the team's tests; calls to migrate \| 7/9 tests passed \| "
                     r"8/9 tests passed; 1 newly failing, 1 newly passing; \d+ calls to migrate "
                     r"\[FAILED\] \[condition\] \|", report)
    # The model stacks: every package that differs, and the extra requirement with its version.
    assert results["package_differences"]["torch"] == {"legacy": "2.2.2", "candidate": "2.8.0"}
    assert results["package_differences"]["executorch"] == {"legacy": None, "candidate": "0.7.0"}
    for stack in ("legacy", "candidate"):
        assert results["stacks"][stack]["extra_requirements"] == [
            {"requirement": "-e .", "distribution": "edge-app", "version": "0.3.0"}]
    assert "- extra requirements ([tool.upgrade-gate.extra-requirements]): `-e .` (edge-app 0.3.0)" in report
    assert "| torch | 2.2.2 | 2.8.0 |" in report[report.index("## Stacks"):]
    cases = {(c.get("classname"), c.get("name")): c for c in validate_junit(out / "junit.xml").iter("testcase")}
    assert cases[("candidate.project", "project-tests")].find("failure").get("type") == "hard gate"
    assert "id='model-project'" in (out / "report.html").read_text()


def test_the_command_runs_the_sessions_it_is_given_with_its_own_noxfile(tmp_path):
    config = tmp_path / "pyproject.toml"
    assert cli.nox_arguments(["compare"], config) == [
        "--noxfile", str(REPO / "noxfile.py"), "--envdir", str(tmp_path / ".nox"), "--sessions", "compare"]
    assert cli.nox_arguments(["assets", "run(legacy)", "measure", "--", "--shard", "1/2"], config)[4:] == [
        "--sessions", "assets", "run(legacy)", "measure", "--", "--shard", "1/2"]
    assert cli.nox_arguments(["-l"], config)[4:] == ["-l"]
    assert cli.nox_arguments(["report", "--no-color", "--", "shards/a"], config)[4:] == [
        "--sessions", "report", "--no-color", "--", "shards/a"]
    # A results file first, then its options: all of them the command's own, with or without `--`.
    for typed in (["device-results", "r.jsonl", "--out", "rep"], ["device-results", "--", "r.jsonl", "--out", "rep"]):
        assert cli.nox_arguments(typed, config)[4:] == ["--sessions", "device-results", "--", "r.jsonl", "--out", "rep"]


def test_the_command_finds_the_nearest_pyproject_or_says_there_is_none(tmp_path):
    (tmp_path / "team" / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "team" / "pyproject.toml").write_text("[project]\nname = 'team'\n")
    assert cli.find_config(tmp_path / "team" / "src" / "pkg") == tmp_path / "team" / "pyproject.toml"
    env = {**outside_this_checkout(), "PYTHONPATH": str(REPO / "src")}
    result = subprocess.run([sys.executable, "-m", "upgrade_gate", "compare"], cwd="/", env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr == ("upgrade-gate: error: no pyproject.toml in / or any folder above it; run from your "
                             "repository, or create one (a [tool.upgrade-gate] table in it is optional: see the README)\n")


def test_one_line_adds_the_sessions_to_a_teams_noxfile_and_keeps_its_defaults(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[tool.upgrade-gate]\n")
    (tmp_path / "noxfile.py").write_text(
        "import nox\n\nimport upgrade_gate.sessions  # noqa: F401\n\nnox.options.sessions = ['lint']\n\n\n"
        "@nox.session(python=False)\ndef lint(session):\n    session.log('linting')\n")
    env = {**outside_this_checkout(), "PYTHONPATH": str(REPO / "src")}
    listed = subprocess.run([sys.executable, "-m", "nox", "-l", "--noxfile", str(tmp_path / "noxfile.py")],
                            env=env, capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr[-3000:]
    lines = listed.stdout.splitlines()
    assert "* lint" in lines  # still the team's default
    for session in ("compare", "compat", "run(legacy)", "run(candidate)", "report", "diff"):
        assert any(line.startswith(f"- {session} -> ") for line in lines), (session, listed.stdout)


# -- issue 26: the command speaks upgrade-gate, not nox ------------------------------------------------

def upgrade_gate(*argv: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**outside_this_checkout(), "PYTHONPATH": str(REPO / "src"), **(env or {})}
    env.pop("UPGRADE_GATE_COMMAND", None)
    return subprocess.run([sys.executable, "-m", "upgrade_gate", *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_help_is_upgrade_gates_own_and_a_bare_command_starts_nothing(tmp_path):
    for flag in ("--help", "-h", "compare -h"):
        shown = upgrade_gate(*flag.split(), cwd=tmp_path)  # no pyproject.toml needed to ask
        assert shown.returncode == 0 and shown.stdout == cli.USAGE and shown.stderr == ""
    assert cli.USAGE.startswith("usage: upgrade-gate COMMAND [NOX_OPTION ...] [-- OPTION ...]\n")
    for command in ("compare", "compat", '"project(<stack>)"', "scan", "report", "diff", "releases", "-l"):
        assert f"\n  {command} " in cli.USAGE, command
    # Issue 37: the commands the docs tell a team to type are the ones --help lists.
    for doc in ("README.md", "docs/compat.md"):
        text = (REPO / doc).read_text()
        code = "\n".join([*re.findall(r"```.*?```", text, re.DOTALL), *re.findall(r"`([^`\n]+)`", text)])
        for typed in re.findall(r"(?:^|\s)upgrade-gate (\"?-?[a-z-]+(?:\(\w+\))?)", code, re.MULTILINE):
            listed = re.sub(r"\(\w+\)", "(<stack>)", typed) + ('"' if typed.startswith('"') else "")
            assert f"\n  {listed} " in cli.USAGE, (doc, typed)
    (tmp_path / "pyproject.toml").write_text("[tool.upgrade-gate]\n")
    bare = upgrade_gate(cwd=tmp_path)
    assert bare.returncode == 2 and bare.stderr == cli.USAGE and bare.stdout == ""
    assert not (tmp_path / ".nox").exists() and not (tmp_path / "report").exists()


def test_a_session_that_does_not_exist_is_a_usage_error_listing_them(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[tool.upgrade-gate]\n")
    result = upgrade_gate("nosuchsession", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines()[-1] == (
        "upgrade-gate: error: no command 'nosuchsession'; the commands: compare, compat, assets, run(legacy), "
        "run(candidate), project(legacy), project(candidate), scan, compat-report, measure, prune-cache, report, migrate, "
        "bundle, targets, device-results, releases, upgrade-path, diff, benchmark (`upgrade-gate --help` says what each "
        "does)")
    assert cli.unknown_sessions(["run(legacy)", "compare"], [("run", ["run(legacy)"]), ("compare", [])]) is None


def test_listing_the_sessions_needs_no_configuration(tmp_path):
    listed = upgrade_gate("-l", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    for session in ("compare", '"run(legacy)"', '"run(candidate)"', '"project(candidate)"', "scan", "report", "diff",
                    "releases"):
        assert any(re.fullmatch(rf"  upgrade-gate {re.escape(session)} +[A-Z`].+", line) for line in lines), (
            session, listed.stdout)
    # Issue 37: the commands as this command runs them, not nox's (`nox -s …`, a noxfile's path).
    assert "nox" not in listed.stdout and "->" not in listed.stdout, listed.stdout
    assert lines[0] == ("The commands of upgrade-gate (options after `--`: `upgrade-gate COMMAND -- --help`; "
                        "README.md has them all):")


def test_a_broken_stack_spec_is_named_by_the_session_that_needs_it(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[tool.upgrade-gate]\n")
    (tmp_path / "envs").mkdir()
    (tmp_path / "envs" / "candidate.toml").write_text('python = "3.11"\nrequirements = ["torch==2.8.0"]\n')
    message = (f"upgrade-gate: error: {tmp_path / 'envs' / 'candidate.toml'}: adapter: missing; every stack spec "
               "needs python, requirements and adapter")
    installed = upgrade_gate("run(candidate)", cwd=tmp_path)
    assert installed.returncode == 2 and installed.stderr.splitlines()[-1] == message, installed.stderr
    env = {**outside_this_checkout(), "PYTHONPATH": str(REPO / "src"), "UPGRADE_GATE_CONFIG": str(tmp_path / "pyproject.toml")}
    env.pop("UPGRADE_GATE_COMMAND", None)
    with_nox = subprocess.run([sys.executable, "-m", "nox", "--noxfile", str(REPO / "noxfile.py"), "-s",
                               "run(candidate)"], env=env, capture_output=True, text=True, timeout=300)
    assert with_nox.returncode == 2 and with_nox.stderr.splitlines()[-1] == message, with_nox.stderr
    assert not (tmp_path / ".nox").exists()  # no venv made for a session that cannot run


def test_advice_and_relative_folders_are_the_users(project):
    from helpers.stack_records import report_on

    report_on(project, "old", error=0.01, candidate_ms=1.0, size=1000, memory=100 * 2**20)
    report_on(project, "new", error=0.0, candidate_ms=1.0, size=1000, memory=100 * 2**20)
    missing = upgrade_gate("report", "--", "--out", "nowhere", cwd=project)
    assert missing.returncode == 2
    assert missing.stderr.splitlines()[-1] == (
        f"upgrade-gate: error: {project / 'nowhere'}: no such report folder; run `upgrade-gate compare -- --out "
        f"{project / 'nowhere'}` first, or give the folder a run wrote with --out DIR")
    changed = upgrade_gate("diff", "--", "old", "new", cwd=project)
    assert changed.returncode == 0, changed.stderr
    assert f"# upgrade-gate diff: {project / 'old'} → {project / 'new'}" in changed.stdout
    # A verdict ends with the verdict, not with nox's "Session report aborted".
    judged = upgrade_gate("report", "--", "--out", "old", cwd=project)
    assert judged.returncode == 1, judged.stderr
    assert "aborted" not in judged.stdout + judged.stderr and "Verdict" in judged.stdout + judged.stderr
