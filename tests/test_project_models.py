"""A team's own models, declared in its pyproject, through the real stacks."""

from __future__ import annotations

import getpass
import json
import textwrap
from pathlib import Path

import pytest
from helpers.runs import EXPLAINING, QUICK, ended_as, nox, user_project

pytestmark = [pytest.mark.integration, pytest.mark.shares_machine]

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


# A Hugging Face-style model: it returns a dict whose entries are not in sorted order and differ
# in shape. Its module prints 10 MB when imported (a chatty import, as some do): the logs of
# every worker that imports it must stay capped.
HEADS = textwrap.dedent('''
    import sys

    import torch
    from torch import nn

    sys.stdout.write(("chatty import " * 8 + "\\n") * 100_000)  # ≈ 10 MB


    class Heads(nn.Module):
        def __init__(self):
            super().__init__()
            self.trunk, self.zeta, self.alpha = nn.Linear(16, 32), nn.Linear(32, 8), nn.Linear(32, 4)

        def forward(self, x):
            h = torch.relu(self.trunk(x))
            return {"zeta": self.zeta(h), "alpha": self.alpha(h)}


    def heads():
        torch.manual_seed(2)
        return Heads(), (torch.randn(2, 16),)
''')


def team_project(tmp_path: Path, models: str) -> dict[str, str]:
    env = user_project(tmp_path, f'[tool.upgrade-gate]\nsuite = "none"\n{QUICK}[tool.upgrade-gate.models]\n{models}')
    for package in ("models", "compat"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "models" / "nets.py").write_text(NETS)
    (tmp_path / "compat" / "shapes.py").write_text("FEATURES = 16\n")
    (tmp_path / "models" / "heads.py").write_text(HEADS)
    return env


def ran(model: dict, stack: str) -> set[str]:
    """The statuses of a model's stages in a stack, but for those the quick settings turn off."""
    return {s["status"] for s in model["stacks"][stack]["stages"] if s["stage"] not in EXPLAINING}


def test_a_project_model_runs_through_both_stacks(tmp_path):
    env = team_project(tmp_path, 'tiny = "models.nets:tiny"\nheads = { factory = "models.heads:heads", variants = [] }\n')
    out = tmp_path / "report"
    env["UPGRADE_GATE_CACHE"] = str(tmp_path / "cache")  # its own, to count the logs stored there
    result = nox("-s", "compare", "--", "--out", str(out), "--fresh", env=env)
    assert (out / "verdict.json").is_file(), result.stderr[-4000:]
    # A GO — or, on a machine others keep busy, no latency verdict, and nothing else missing.
    busy = ended_as(result, out, 0, cache=tmp_path / "cache" / "results")
    verdict = json.loads((out / "verdict.json").read_text())
    results = json.loads((out / "results.json").read_text())
    models = {m["model"]: m for m in results["models"]}
    # A project's model is quantized too, unless it says variants = []
    assert set(models) == {"tiny", "tiny@int8", "heads"}
    model = models["tiny"]
    assert (model["model"], model["source"], model["factory"]) == ("tiny", "project", "models.nets:tiny")
    for stack in ("legacy", "candidate"):
        assert ran(model, stack) == ran(models["tiny@int8"], stack) == {"ok"}
    reference = next(c for c in model["comparisons"] if c["purpose"] == "candidate artifact vs reference")
    assert reference["worst_rel_l2"] < 1e-5
    assert verdict["verdict"] in ("GO", "GO-WITH-CONDITIONS") or (busy and verdict["verdict"] == "INCOMPLETE")
    # What torch leaves in the system's temporary folder (inductor's folder, which importing executorch's exporter
    # makes) went to the cache's: the workers' TMPDIR.
    assert (tmp_path / "cache" / "tmp" / f"torchinductor_{getpass.getuser()}").is_dir()

    # The dict's entries are matched by key in both stacks, whatever order each returns them in.
    heads = models["heads"]
    for stack in ("legacy", "candidate"):
        assert ran(heads, stack) == {"ok"}, heads["stacks"][stack]["stages"]
    shapes = {"forward.output_0[zeta]": [2, 8], "forward.output_1[alpha]": [2, 4]}
    for comparison in heads["comparisons"]:
        assert {o["name"]: o["shape"] for o in comparison["outputs"]} == shapes, comparison["purpose"]
        assert all(o["rel_l2"] < 1e-5 for o in comparison["outputs"]), comparison
    numerics = [g for g in verdict["gates"] if g["model"] == "heads" and g["gate"] == "numerics"]
    assert [g["status"] for g in numerics] == ["passed"], numerics

    # Its 10 MB import is in every log of its workers, capped at 1 MiB of head and 1 MiB of tail,
    # and each log is stored once in the report folder and once in the cache.
    files = [p for p in out.rglob("*") if p.is_file()]
    chatty = [p for p in files if "chatty import" in p.read_text(errors="replace")]
    # The workers that import it: the factories' check and the export, in each stack (the
    # runtime phase and the measurement load the artifact); no other file holds a copy.
    assert sorted(p.relative_to(out).as_posix() for p in chatty) == [
        "stacks/candidate/factories.log", "stacks/candidate/models/heads/export.log",
        "stacks/legacy/factories.log", "stacks/legacy/models/heads/export.log"]
    for log in chatty:
        assert log.stat().st_size < 2 * 2**20 + 4096, (log, log.stat().st_size)
        assert "bytes of this log dropped (its first 1 MiB and last 1 MiB are kept)]" in log.read_text(), log
    cached = [p for p in (tmp_path / "cache").rglob("*") if p.is_file() and "chatty import" in p.read_text(errors="replace")]
    assert sorted(p.name for p in cached) == ["export.log", "export.log"], cached  # each export's, once
    assert all(p.stat().st_size < 2 * 2**20 + 4096 for p in cached), cached


def test_a_bad_factory_exits_2_naming_the_entry(tmp_path):
    # One real stack: the worker's check of what the factory returned needs torch. How each other
    # error is worded is tests/test_pipeline.py's unit test (test_a_bad_project_factory_…).
    factory, error = ("models.nets:wrong_type", "TypeError: models.nets:wrong_type returned Linear; expected "
                      "(torch.nn.Module, tuple of tensors)")
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
