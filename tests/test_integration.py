"""End to end through the real stacks: nox builds both venvs with uv, the real
exporters write .ptl and .pte files, the real runtimes load and run them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.integration


def nox(*args: str, env: dict[str, str] | None = None, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nox", "--noxfile", str(REPO / "noxfile.py"), "--no-color", *args],
        capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})},
    )


def load(out: Path, name: str) -> dict:
    return json.loads((out / name).read_text())


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("smoke") / "report"
    result = nox("-s", "compare", "--", "--out", str(out), "--models", "vit-smoke")
    return out, result


def test_compare_go_on_a_small_vit(smoke_run):
    out, result = smoke_run
    assert result.returncode == 0, result.stderr[-4000:]
    for name in ("report.md", "results.json", "verdict.json"):
        assert (out / name).is_file()

    results = load(out, "results.json")
    legacy, candidate = results["stacks"]["legacy"]["installed"], results["stacks"]["candidate"]["installed"]
    assert Version(legacy["distributions"]["torch"]).release[:2] == (2, 2)
    assert Version(candidate["distributions"]["torch"]).release[:2] == (2, 8)
    assert Version(candidate["distributions"]["executorch"]).release[:2] == (0, 7)
    assert candidate["torch_version"].startswith("2.8.")

    model, = results["models"]
    for stack, suffix in (("legacy", ".ptl"), ("candidate", ".pte")):
        record = model["stacks"][stack]
        assert [s["status"] for s in record["stages"]] == ["ok"] * 8, record["stages"]
        artifact = out / record["record_dir"] / f"model{suffix}"
        assert artifact.stat().st_size == record["artifact"]["bytes"] > 100_000
        assert record["latency"]["runs"] == 50 and record["latency"]["p50_ms"] > 0
        assert record["runtime_peak_rss_bytes"] > 0 and record["export_peak_rss_bytes"] > 0
        # The artifact's outputs came from the runtime and are real numbers, not zeros.
        with np.load(out / record["record_dir"] / "artifact.npz") as outputs:
            assert outputs["output_0"].shape == (1, 32) and np.abs(outputs["output_0"]).max() > 1e-3

    assert model["fixtures"]["legacy"] == model["fixtures"]["candidate"]
    for comparison in model["comparisons"]:
        assert comparison["worst_rel_l2"] < 1e-4, comparison

    verdict = load(out, "verdict.json")
    assert verdict["verdict"] == "GO", verdict
    assert {g["gate"] for g in verdict["gates"]} == {"same-inputs", "export", "artifact-size", "numerics", "latency"}
    report = (out / "report.md").read_text()
    assert report.splitlines()[2] == "## Verdict: **GO**"
    assert "Verdict: GO" in result.stdout + result.stderr


def test_an_unexportable_model_is_a_record_and_a_no_go(tmp_path):
    out = tmp_path / "report"
    result = nox("-s", "compare", "--", "--out", str(out), "--models", "data-dependent-branch,vit-smoke")
    assert result.returncode == 1, result.stderr[-4000:]

    verdict = load(out, "verdict.json")
    assert verdict["verdict"] == "NO-GO"
    gates = {(g["model"], g["gate"]): g for g in verdict["gates"]}
    export = gates[("data-dependent-branch", "export")]
    assert export["status"] == "FAILED"
    assert export["measured"].startswith("export failed: torch.fx.experimental.symbolic_shapes.GuardOnDataDependentSymNode")
    # The other model's results are complete and pass.
    assert all(g["status"] == "passed" for (model, _), g in gates.items() if model == "vit-smoke")

    results = load(out, "results.json")
    branch = next(m for m in results["models"] if m["model"] == "data-dependent-branch")
    legacy_stages = {s["stage"]: s["status"] for s in branch["stacks"]["legacy"]["stages"]}
    candidate_stages = {s["stage"]: s["status"] for s in branch["stacks"]["candidate"]["stages"]}
    assert legacy_stages["export"] == "ok"  # tracing bakes in one branch
    assert (candidate_stages["export"], candidate_stages["save"], candidate_stages["load"]) == (
        "failed", "skipped", "skipped")
    failed = next(s for s in branch["stacks"]["candidate"]["stages"] if s["stage"] == "export")
    assert failed["error"]["traceback_tail"] and "data-dependent" in failed["error"]["message"]


def user_project(tmp_path: Path, config: str) -> dict[str, str]:
    (tmp_path / "envs").mkdir()
    for spec in ("legacy.toml", "candidate.toml"):
        (tmp_path / "envs" / spec).write_text((REPO / "envs" / spec).read_text())
    (tmp_path / "pyproject.toml").write_text(config)
    return {"UPGRADE_GATE_CONFIG": str(tmp_path / "pyproject.toml")}


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("[tool.upgrade-gate]\nmodels = [\n", "pyproject.toml: invalid TOML at line 2, column 0: unexpected end of file"),
        ("[tool.upgrade-gate.gates]\nlatency-ratio = 1.1\n", "pyproject.toml: tool.upgrade-gate.gates.latency-ratio: unknown key"),
        ('[tool.upgrade-gate]\nbaseline = "torch22"\n', "pyproject.toml: tool.upgrade-gate.baseline: no stack spec torch22.toml"),
    ],
)
def test_bad_configuration_exits_2_and_writes_nothing(tmp_path, config, message):
    env = user_project(tmp_path, config)
    out = tmp_path / "report"
    result = nox("-s", "compare", "--", "--out", str(out), env=env, timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("upgrade-gate: error:")]
    assert len(errors) == 1 and message in errors[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert not out.exists()


def test_malformed_stack_spec_exits_2(tmp_path):
    env = user_project(tmp_path, "[tool.upgrade-gate]\n")
    (tmp_path / "envs" / "candidate.toml").write_text('python = "3.11"\nrequirements = ["torch==2.8.0"\n')
    result = nox("-s", "compare", "--", "--out", str(tmp_path / "report"), env=env, timeout=300)
    assert result.returncode == 2
    assert f"upgrade-gate: error: {tmp_path / 'envs' / 'candidate.toml'}: invalid TOML at line 2" in result.stderr
    assert not (tmp_path / "report").exists()


def test_a_version_that_does_not_exist_names_the_spec(tmp_path):
    env = user_project(tmp_path, "[tool.upgrade-gate]\nmodels = [\"vit-smoke\"]\n")
    spec = tmp_path / "envs" / "broken.toml"
    spec.write_text('python = "3.11"\nrequirements = ["torch==2.8.0", "executorch==0.0.42"]\nadapter = "executorch_xnnpack"\n')
    result = nox("-s", "run(broken)", "--", "--out", str(tmp_path / "report"), env=env, timeout=600)
    assert result.returncode == 2
    assert f"upgrade-gate: error: {spec}: requirements: uv could not install" in result.stderr
    assert "executorch==0.0.42" in result.stderr and "Traceback" not in result.stderr


def test_a_crashing_worker_is_recorded_and_the_run_goes_on(tmp_path):
    out = tmp_path / "report"
    result = nox("-s", "run(legacy)", "--", "--out", str(out), "--models", "segfault,vit-smoke")
    assert result.returncode == 0, result.stderr[-4000:]
    models = out / "stacks" / "legacy" / "models"
    crashed = json.loads((models / "segfault" / "export.json").read_text())
    eager = next(s for s in crashed["stages"] if s["stage"] == "eager")
    assert eager["status"] == "crashed"
    assert eager["error"]["message"] == "worker killed by signal SIGSEGV"
    assert [s["status"] for s in crashed["stages"]] == ["ok", "crashed"]
    # The next model ran in full.
    for phase in ("export", "runtime"):
        record = json.loads((models / "vit-smoke" / f"{phase}.json").read_text())
        assert record["complete"] and {s["status"] for s in record["stages"]} == {"ok"}
