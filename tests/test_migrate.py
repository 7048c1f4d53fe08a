"""upgrade_gate.migrate, what a GO hands the team (issue 64): a real compare of vit-smoke (fp32 and int8-dynamic),
a team's own model (fp32, and an int8-dynamic variant below its quantized gate: a soft gate, a condition) and a model
the candidate cannot export (a hard gate). Each model the verdict passes, as configured or with conditions, gets
migrate/<model>/export.py; run from an empty folder with the candidate stack's Python, it rebuilds the judged
artifact byte for byte (the SHA-256 verdict.json records), and MIGRATION.md's Python snippet, run as written, gives
the outputs the run stage recorded."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from helpers.runs import QUICK, nox, stack_shell, user_project

pytestmark = [pytest.mark.integration, pytest.mark.shares_machine]  # its subject is the files, not the timing

DATA = Path(__file__).resolve().parent / "data"
# llama-smoke: a multi-method program (prefill and decode, their weights stored once), rebuilt byte for byte too.
HANDED_OVER = ("vit-smoke", "vit-smoke@int8-dynamic", "team-outlier", "team-outlier@int8-dynamic", "llama-smoke")
MODELS = ",".join((*HANDED_OVER[:-1], "llama-smoke@fp32", "data-dependent-branch"))
TEAM = '[tool.upgrade-gate.models.team-outlier]\nfactory = "team_outlier:outlier"\nvariants = ["int8-dynamic"]\n'


@pytest.fixture(scope="module")
def migrated(tmp_path_factory):
    folder = tmp_path_factory.mktemp("migrate")
    shutil.copy(DATA / "team_outlier.py", folder / "team_outlier.py")
    env = user_project(folder, f"[tool.upgrade-gate]\n{QUICK}{TEAM}")
    out = folder / "report"
    result = nox("-s", "compare", "--", "--out", str(out), "--models", MODELS, env=env)
    assert result.returncode in (0, 1, 3), result.stderr[-3000:]
    return out, env


def candidate_python(out: Path) -> Path:
    return Path(json.loads((out / "results.json").read_text())["stacks"]["candidate"]["installed"]["executable"])


def run_in_candidate(out: Path, args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    python = candidate_python(out)
    env = stack_shell(python, cwd)
    return subprocess.run([str(python), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def judged(out: Path) -> dict[str, dict]:
    verdict = json.loads((out / "verdict.json").read_text())
    return {a["model"]: a for a in verdict["artifacts"] if a["stack"] == "candidate"}


@pytest.fixture(scope="module")
def rebuilt(migrated, tmp_path_factory):
    """Each handed-over model's export.py, run once from an empty folder of its own: the run, and the folder."""
    out, _ = migrated

    def rebuilt(model: str) -> tuple[subprocess.CompletedProcess[str], Path]:
        empty = tmp_path_factory.mktemp("rebuilt")
        return run_in_candidate(out, [str(out / "migrate" / model / "export.py")], cwd=empty), empty

    with ThreadPoolExecutor(2) as pool:  # each script is mostly torch's import: two at a time on 2 cores
        return dict(zip(HANDED_OVER, pool.map(rebuilt, HANDED_OVER)))


def test_each_model_the_verdict_passes_rebuilds_its_judged_artifact_from_an_empty_folder(migrated, rebuilt):
    out, _ = migrated
    artifacts = judged(out)
    assert set(artifacts) == set(HANDED_OVER), artifacts  # every artifact the candidate saved, judged
    for model, (ran, folder) in rebuilt.items():
        assert ran.returncode == 0, (model, ran.stderr[-3000:])
        written = folder / artifacts[model]["file"]
        assert hashlib.sha256(written.read_bytes()).hexdigest() == artifacts[model]["sha256"], model
        assert "the artifact upgrade-gate judged" in ran.stdout
    # Below its quantized gate, a soft one: handed over, the gate on its checklist.
    guide = (out / "migrate" / "team-outlier@int8-dynamic" / "MIGRATION.md").read_text()
    assert re.search(r"- \[ \] quantized-numerics failed: SNR = [\d.]+ dB", guide), guide
    # Its export failed, a hard gate: not handed over, and the index says why.
    assert not (out / "migrate" / "data-dependent-branch").exists()
    assert "- data-dependent-branch: not handed over — export failed" in (out / "migrate" / "README.md").read_text()


def test_an_export_script_whose_model_changed_says_it_is_not_the_judged_artifact(migrated, tmp_path):
    out, _ = migrated
    folder = tmp_path / "team-outlier"
    shutil.copytree(out / "migrate" / "team-outlier", folder)
    with np.load(folder / "weights.npz") as data:
        weights = {key: data[key] for key in data.files}
    weights["up.bias"] = weights["up.bias"] + 1  # the team's model as it is after a change
    np.savez(folder / "weights.npz", **weights)
    ran = run_in_candidate(out, [str(folder / "export.py"), "--out", str(tmp_path / "built")], cwd=tmp_path)
    assert ran.returncode == 1 and "this is not the artifact upgrade-gate judged" in ran.stderr, ran.stderr[-3000:]


def test_the_python_snippet_of_migration_md_gives_the_judged_outputs(migrated, rebuilt, tmp_path):
    out, _ = migrated
    model = "vit-smoke@int8-dynamic"
    folder = out / "migrate" / model
    guide = (folder / "MIGRATION.md").read_text()
    assert "- input 0: float32 [1, 3, 32, 32]" in guide and "- output 0: float32 [1, 32]" in guide, guide
    (snippet,) = re.findall(r"### Python [^\n]*\n.*?```python\n(.*?)```", guide, flags=re.S)  # the app's
    shutil.copy(folder / "inputs.npz", tmp_path / "inputs.npz")
    shutil.copy(rebuilt[model][1] / "forward.pte", tmp_path / "forward.pte")  # as export.py wrote it
    (tmp_path / "snippet.py").write_text(snippet + 'np.savez("got.npz", *[o.numpy() for o in outputs])\n')
    ran = run_in_candidate(out, ["snippet.py"], cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    with np.load(out / "stacks" / "candidate" / "models" / model / "artifact.npz") as recorded, \
            np.load(tmp_path / "got.npz") as got:
        expected = [recorded[key] for key in recorded.files if key.startswith("forward.")]
        assert len(got.files) == len(expected) == 1
        np.testing.assert_allclose(got["arr_0"], expected[0], rtol=1e-5, atol=1e-6)


# The team's model built as its factory builds it, with the weights and inputs every stack was judged with, as
# ``model`` and ``example_inputs``: what the legacy lines of MIGRATION.md are written against.
LEGACY_DRIVER = """\
import sys

import numpy as np
import torch
from torch.jit.mobile import _load_for_lite_interpreter

sys.path.insert(0, sys.argv[1])
from team_outlier import outlier

model, _ = outlier()
with np.load("weights.npz") as data:
    model.load_state_dict({key: torch.from_numpy(data[key]) for key in data.files})
with np.load("inputs.npz") as data:
    example_inputs = (torch.from_numpy(data["forward.input_0"]),)
exec(open("lines.py").read())
outputs = _load_for_lite_interpreter("forward.ptl")(*example_inputs)
np.savez("got.npz", outputs.numpy())
"""


@pytest.mark.parametrize("model", ["team-outlier", "team-outlier@int8-dynamic"])
def test_the_legacy_lines_of_migration_md_are_the_export_the_baseline_judged(migrated, tmp_path, model):
    """MIGRATION.md shows the team's export today, as the legacy adapter writes its lines; run as written in the
    legacy stack, they make a .ptl whose outputs are the legacy artifact's (the lines cannot drift from the recipe
    unseen)."""
    out, _ = migrated
    folder = out / "migrate" / model
    guide = (folder / "MIGRATION.md").read_text()
    (lines,) = re.findall(r"Today \(legacy\), `forward`[^\n]*\n\n```python\n(.*?)```", guide, flags=re.S)
    assert "torch.jit.trace(model, example_inputs" in lines and "_save_for_lite_interpreter" in lines, lines
    (tmp_path / "lines.py").write_text(lines)
    (tmp_path / "driver.py").write_text(LEGACY_DRIVER)
    shutil.copy(folder / "inputs.npz", tmp_path / "inputs.npz")
    shutil.copy(folder / "weights.npz", tmp_path / "weights.npz")
    python = Path(json.loads((out / "results.json").read_text())["stacks"]["legacy"]["installed"]["executable"])
    ran = subprocess.run([str(python), "driver.py", str(DATA)], cwd=tmp_path, capture_output=True, text=True,
                         timeout=600)
    assert ran.returncode == 0, ran.stderr[-3000:]
    with np.load(out / "stacks" / "legacy" / "models" / model / "artifact.npz") as recorded, \
            np.load(tmp_path / "got.npz") as got:
        (expected,) = [recorded[key] for key in recorded.files if key.startswith("forward.")]
        np.testing.assert_allclose(got["arr_0"], expected, rtol=1e-5, atol=1e-6)  # the run stage's threads, not these


def test_migrate_writes_the_folder_again_from_the_report_without_running_anything(migrated):
    out, env = migrated
    before = (out / "results.json").stat().st_mtime_ns
    result = nox("-s", "migrate", "--", "--out", str(out), "--models", "vit-smoke", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(p.name for p in (out / "migrate").iterdir()) == ["README.md", "vit-smoke"]
    assert (out / "results.json").stat().st_mtime_ns == before
    said = result.stdout + result.stderr
    assert "migrate: " in said and "export scripts for vit-smoke" in said, said[-3000:]


def test_migrate_without_the_result_cache_keeps_what_an_earlier_migrate_wrote(migrated, tmp_path):
    """The result cache cleared (or another machine's): a team's model's weights and inputs come from the folder the
    last migrate wrote, so refreshing it loses no export script."""
    out, env = migrated
    result = nox("-s", "migrate", "--", "--out", str(out), "--models", "team-outlier", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    before = {p.name: p.read_bytes() for p in (out / "migrate" / "team-outlier").iterdir()}
    emptied = {**env, "UPGRADE_GATE_CACHE": str(tmp_path / "empty-cache")}
    result = nox("-s", "migrate", "--", "--out", str(out), "--models", "team-outlier", env=emptied)
    assert result.returncode == 0, result.stderr[-3000:]
    assert {p.name: p.read_bytes() for p in (out / "migrate" / "team-outlier").iterdir()} == before
    # With no earlier folder either, the model is not handed over, and the index says where to run it.
    shutil.rmtree(out / "migrate")
    result = nox("-s", "migrate", "--", "--out", str(out), "--models", "team-outlier", env=emptied)
    assert result.returncode == 0, result.stderr[-3000:]
    assert not (out / "migrate" / "team-outlier").exists()
    assert "its weights and inputs are not in this machine's result cache" in (out / "migrate" / "README.md").read_text()
