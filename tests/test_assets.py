"""Which assets a run builds: only those its models read (models/suite.toml ``assets``), issue 26."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from upgrade_gate import layout
from upgrade_gate.config.catalog import load_catalog
from upgrade_gate.config.plan import load_plan
from upgrade_gate.errors import ConfigError
from upgrade_gate.run import asset_build

REPO = Path(__file__).resolve().parents[1]


def plan_of(tmp_path: Path, table: str, *posargs: str):
    config = tmp_path / "pyproject.toml"
    config.write_text(table)
    (tmp_path / "team_nets.py").write_text("def tiny():\n    pass\n")
    return load_plan(list(posargs), invoked_from=tmp_path, config_path=config)


@pytest.mark.parametrize("table, posargs, needed", [
    # A team's own models alone read none of the built-in models' assets: nothing is built.
    ('[tool.upgrade-gate]\nsuite = "none"\n[tool.upgrade-gate.models]\ntiny = "team_nets:tiny"\n', [], []),
    ('[tool.upgrade-gate]\nsuite = "smoke"\n', [], ["photos"]),  # mobilenet-v3-small's photos
    ('[tool.upgrade-gate]\n', ["--models", "vit-smoke,llama-smoke"], []),
    ('[tool.upgrade-gate]\n', ["--models", "minilm-l6"], ["minilm"]),
    ('[tool.upgrade-gate]\n', ["--models", "nanovlm@fp32"], ["photos", "smollm2"]),
    ('[tool.upgrade-gate]\n', [], ["minilm", "photos", "smollm2"]),  # the default suite reads all three
])
def test_a_run_needs_only_its_models_assets(tmp_path, table, posargs, needed):
    assert plan_of(tmp_path, table, *posargs).assets == needed


def test_every_built_in_model_that_reads_an_asset_declares_it():
    # The factories' modules read assets through models.assets; the catalog says which model reads which.
    catalog = load_catalog()
    assert layout.ASSET_SOURCES == ("minilm", "photos", "smollm2")
    declared = {name for name, entry in catalog.items() if entry.assets}
    assert declared == {"vit-ti16", "vit-s14", "vit-b14", "mobilenet-v3-small", "resnet18", "smollm2-135m",
                        "minilm-l6", "nanovlm", "nanovlm-full"}
    for name in ("vit-smoke", "llama-smoke", "minilm-smoke", "nanovlm-smoke", "llama32-1b-dims"):
        assert catalog[name].assets == (), name


def test_the_assets_session_takes_the_names_compare_gives_it():
    assert asset_build.requested([]) == ["minilm", "photos", "smollm2"]  # `nox -s assets`: every source
    assert asset_build.requested(["--only", "photos,smollm2"]) == ["photos", "smollm2"]
    with pytest.raises(ConfigError) as caught:
        asset_build.requested(["--only", "photos,weights"])
    assert str(caught.value) == "--only: expected asset names among minilm, photos, smollm2, got 'weights'"


def test_build_only_runs_the_named_builders(tmp_path):
    # build.py itself, beside two builders: one that writes, one that would fail if it ran.
    sources = tmp_path / "sources"
    sources.mkdir()
    shutil.copy(REPO / "models" / "sources" / "build.py", sources / "build.py")
    (sources / "photos.py").write_text("def build(folder):\n    (folder / 'photo.npy').write_text('x')\n")
    (sources / "smollm2.py").write_text("def build(folder):\n    raise SystemExit('smollm2 was not asked for')\n")
    out = tmp_path / "assets"
    built = subprocess.run([sys.executable, "-c", asset_build.BUILD_ONLY, str(sources), str(out), "photos"],
                           capture_output=True, text=True, timeout=60)
    assert built.returncode == 0, built.stderr
    assert sorted(p.name for p in out.iterdir()) == ["photos"] and (out / "photos" / "photo.npy").is_file()
