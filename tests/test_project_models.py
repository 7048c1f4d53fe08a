"""A team's own models, declared in its pyproject, through the real stacks."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from test_integration import nox, user_project

pytestmark = pytest.mark.integration

# The user's package is called `models`, like this repository's suite, and a
# sibling is called `compat`: both must import as the user's, not ours.
NETS = textwrap.dedent('''
    import torch
    from torch import nn

    from compat.shapes import FEATURES


    def tiny():
        torch.manual_seed(1)
        model = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, 4))
        return model, (torch.randn(3, FEATURES),)


    def raises():
        raise RuntimeError("weights file checkpoints/tiny.pt not found")


    def wrong_type():
        return nn.Linear(FEATURES, 4)
''')


def team_project(tmp_path: Path, models: str) -> dict[str, str]:
    env = user_project(tmp_path, f'[tool.upgrade-gate]\nsuite = "none"\n[tool.upgrade-gate.models]\n{models}')
    for package in ("models", "compat"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "models" / "nets.py").write_text(NETS)
    (tmp_path / "compat" / "shapes.py").write_text("FEATURES = 16\n")
    return env


def test_a_project_model_runs_through_both_stacks(tmp_path):
    env = team_project(tmp_path, 'tiny = "models.nets:tiny"\n')
    out = tmp_path / "report"
    result = nox("-s", "compare", "--", "--out", str(out), "--fresh", env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    results = json.loads((out / "results.json").read_text())
    models = {m["model"]: m for m in results["models"]}
    assert set(models) == {"tiny", "tiny@int8"}  # a project's model is quantized too, unless it says variants = []
    model = models["tiny"]
    assert (model["model"], model["source"], model["factory"]) == ("tiny", "project", "models.nets:tiny")
    for stack in ("legacy", "candidate"):
        assert {s["status"] for s in model["stacks"][stack]["stages"]} == {"ok"}
        assert {s["status"] for s in models["tiny@int8"]["stacks"][stack]["stages"]} == {"ok"}
    reference = next(c for c in model["comparisons"] if c["purpose"] == "candidate artifact vs reference")
    assert reference["worst_rel_l2"] < 1e-5
    assert json.loads((out / "verdict.json").read_text())["verdict"] in ("GO", "GO-WITH-CONDITIONS")


@pytest.mark.parametrize(
    ("factory", "error"),
    [
        ("models.nets:missing", "AttributeError: module 'models.nets' has no attribute 'missing'"),
        ("models.network:tiny", "ModuleNotFoundError: No module named 'models.network'"),
        ("models.nets:raises", "RuntimeError: weights file checkpoints/tiny.pt not found"),
        ("models.nets:wrong_type", "TypeError: models.nets:wrong_type returned Linear; expected (torch.nn.Module, "
                                   "tuple of tensors)"),
    ],
)
def test_a_bad_factory_exits_2_naming_the_entry(tmp_path, factory, error):
    env = team_project(tmp_path, f'mine = "{factory}"\n')
    out = tmp_path / "report"
    result = nox("-s", "run(legacy)", "--", "--out", str(out), env=env, timeout=600)
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("upgrade-gate: error:")]
    assert len(errors) == 1, result.stderr[-3000:]
    assert errors[0].startswith(
        f"upgrade-gate: error: {tmp_path / 'pyproject.toml'}: tool.upgrade-gate.models.mine: "
        f"factory {factory!r} failed in stack 'legacy': {error}"
    ), errors[0]
    assert "Traceback" not in result.stderr
    assert not (out / "stacks" / "legacy" / "models").exists()
