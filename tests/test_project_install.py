"""A team whose test dependencies are a dependency group (PEP 735 ``[dependency-groups]``), not an
extra: ``install = ["-e", ".", "--group", "test"]`` in [tool.upgrade-gate.project], uv's own flag (issue 26)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import nox.virtualenv
import pytest

from upgrade_gate.config.plan import load_plan
from upgrade_gate.config.specs import load_spec
from upgrade_gate.run import venvs

REPO = Path(__file__).resolve().parents[1]
UV = nox.virtualenv.find_uv()[1]
GROUPED = ('[project]\nname = "team"\nversion = "0"\n[dependency-groups]\ntest = ["iniconfig"]\n'
           '[build-system]\nrequires = ["hatchling"]\nbuild-backend = "hatchling.build"\n')


def team(tmp_path: Path) -> Path:
    (tmp_path / "src" / "team").mkdir(parents=True)
    (tmp_path / "src" / "team" / "__init__.py").write_text("")
    (tmp_path / "pyproject.toml").write_text(GROUPED + '[tool.upgrade-gate]\nsuite = "none"\n'
                                             '[tool.upgrade-gate.project]\ninstall = ["-e", ".", "--group", "test"]\n')
    return tmp_path


def test_a_dependency_group_is_part_of_the_project_venvs_recipe(tmp_path):
    settings = load_plan([], invoked_from=tmp_path, config_path=team(tmp_path) / "pyproject.toml",
                         models_required=False).settings.project
    assert settings is not None and settings.install == ("-e", ".", "--group", "test")
    spec = load_spec(REPO / "envs" / "legacy.toml", adapters_dir=REPO / "compat", is_baseline=True)
    before = venvs.venv_recipe(spec, ["--group", "test"], tmp_path)
    assert list(before["local"]) == [str(tmp_path / "pyproject.toml")]
    # A changed group empties and remakes the venv, as a changed extra does.
    (tmp_path / "pyproject.toml").write_text((tmp_path / "pyproject.toml").read_text().replace(
        '["iniconfig"]', '["iniconfig", "pluggy"]'))
    assert venvs.venv_recipe(spec, ["--group", "test"], tmp_path) != before


@pytest.mark.integration
def test_uv_installs_the_group_the_project_table_names(tmp_path):
    root = team(tmp_path / "team")
    settings = load_plan([], invoked_from=root, config_path=root / "pyproject.toml",
                         models_required=False).settings.project
    assert settings is not None
    venv = tmp_path / "venv"
    subprocess.run([UV, "venv", "-q", "-p", "3.11", str(venv)], check=True, timeout=120)
    assert venvs.install(UV, venv / "bin", list(settings.install), cwd=settings.root) is None
    listed = subprocess.run([UV, "pip", "list", "--python", str(venv / "bin" / "python")], capture_output=True,
                            text=True, check=True, timeout=120).stdout
    assert "iniconfig" in listed and "team" in listed
