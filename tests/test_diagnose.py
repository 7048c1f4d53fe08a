"""The diagnose phase in the real candidate stack (ExecuTorch 0.7 + XNNPACK), on a planted defect: a
small MLP whose one wrong operator is the tanh GELU the delegate computes as the exact one. The search
(compat/culprit.py, unit-tested in tests/test_culprit.py) names it, its remedy is checked by lowering
the model with the remedy's own code, and its reproducer runs standalone in the venv: exit 1 as lowered,
0 with the remedy."""

from __future__ import annotations

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers.runs import QUICK, REPO, nox, user_project

from upgrade_gate.run import runner

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def diagnosed(tmp_path_factory) -> tuple[Path, dict]:
    folder = tmp_path_factory.mktemp("diagnose")
    env = user_project(folder, f"[tool.upgrade-gate]\n{QUICK}")
    out = folder / "report"
    # The candidate's venv as `compare` builds it, and the model's export and runtime phases in it.
    built = nox("-s", "run(candidate)", "--", "--out", str(out), "--models", "planted-operator", env=env)
    assert built.returncode == 0, built.stderr[-3000:]
    model_dir = out / "stacks" / "candidate" / "models" / "planted-operator"
    job = {**json.loads((model_dir / "export-job.json").read_text()), "model_dir": str(model_dir / "diagnose"),
           "threshold": 1e-4, "methods": ["forward"], "budget_s": 300}
    (model_dir / "diagnose").mkdir()
    job_file = model_dir / "diagnose" / "diagnose-job.json"
    job_file.write_text(json.dumps(job))
    bin_dir = REPO / ".nox" / "run-candidate" / "bin"
    worker = subprocess.run(runner.worker_argv(bin_dir, "diagnose", job_file), env=runner.worker_env(bin_dir),
                            capture_output=True, text=True, timeout=900)
    assert worker.returncode == 0, worker.stderr[-3000:]
    record = json.loads((model_dir / "diagnose" / "diagnose.json").read_text())
    return model_dir / "diagnose", {s["stage"]: s for s in record["stages"]}


def test_the_planted_operator_is_named_with_its_line_and_backend(diagnosed):
    _, stages = diagnosed
    assert {name: s["status"] for name, s in stages.items()} == {
        "build": "ok", "eager": "ok", "parts": "ok", "alone": "ok", "search": "ok", "reproducer": "ok", "remedy": "ok"}
    finding = stages["search"]["details"]["methods"]["forward"]
    assert finding["status"] == "found" and finding["rel_l2"] > 1e-4
    (found,) = finding["culprits"]
    assert found["operator"] == "aten.gelu.default(approximate='tanh')" and found["backend"] == "XNNPACK delegate"
    code = "return self.down(torch.nn.functional.gelu(self.up(self.norm(x)), approximate=self.approximate))"
    line = next(n for n, text in enumerate((REPO / "models" / "smoke.py").read_text().splitlines(), 1) if code in text)
    assert [call["source"] for call in found["calls"]] == [f"smoke.py:{line} in forward: {code}"]
    # Keeping it out of the delegate takes off nearly all of the error; the linear layers alone are exact enough.
    assert found["share"] > 0.99 and found["rel_l2_without"] < 1e-6
    alone = stages["alone"]["details"]["rel_l2"]["forward"]
    assert alone["aten.gelu.default(approximate='tanh')"] > 1e-4 > alone["aten.linear.default"]


def test_the_remedy_is_code_that_passes_when_run_as_written(diagnosed):
    _, stages = diagnosed
    remedy = stages["remedy"]["details"]["methods"]["forward"]
    assert remedy["passes"] and remedy["rel_l2"] < 1e-6
    # The delegate's GELU config narrowed to the calls that are wrong: the exact GELU stays delegated.
    assert "class GeluConfigKeepingOut(GeluConfig):" in remedy["code"]
    assert "if node.kwargs.get('approximate') == 'tanh':" in remedy["code"]
    assert remedy["code"].rstrip().endswith(
        "partitioner = XnnpackPartitioner(configs=[GeluConfigKeepingOut if c is GeluConfig else c "
        "for c in ALL_PARTITIONER_CONFIGS])")


def test_the_reproducer_fails_as_lowered_and_passes_with_the_remedy(diagnosed):
    folder, stages = diagnosed
    written = stages["reproducer"]["details"]["methods"]["forward"]
    repro = folder / written["folder"] / "repro.py"
    # It stands alone: torch and executorch only, upgrade-gate nowhere on its path.
    source = repro.read_text()
    assert "upgrade_gate" not in source and (repro.parent / "inputs.pt").is_file()
    python = REPO / ".nox" / "run-candidate" / "bin" / "python"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(python), str(repro), *args], capture_output=True, text=True, timeout=600,
                              cwd=repro.parent, env={"PATH": "/usr/bin:/bin", "HOME": str(folder)})

    with ThreadPoolExecutor(2) as pool:
        lowered, remedied = pool.map(lambda args: run(*args), [(), ("--with-remedy",)])
    assert lowered.returncode == 1, lowered.stdout + lowered.stderr[-2000:]
    assert "aten.gelu.default(approximate='tanh') lowered to XNNPACK: relative L2 error " in lowered.stdout
    assert remedied.returncode == 0, remedied.stdout + remedied.stderr[-2000:]
    assert "lowered with the remedy: relative L2 error " in remedied.stdout
