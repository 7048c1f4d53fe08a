"""A team whose test dependencies are a dependency group (PEP 735 ``[dependency-groups]``), not an
extra: ``install = ["-e", ".", "--group", "test"]`` in [tool.upgrade-gate.project], uv's own flag (issue 26)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import nox.virtualenv
import pytest

from upgrade_gate.config.plan import load_plan
from upgrade_gate.config.specs import load_spec
from upgrade_gate.errors import ConfigError
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


# PDM's older table, as timm declares its test packages (issue 37): uv does not read it.
PDM_GROUPED = GROUPED.replace("[dependency-groups]\n", "[tool.pdm.dev-dependencies]\n")


def settings_of(root: Path):
    return load_plan([], invoked_from=root, config_path=root / "pyproject.toml", models_required=False).settings.project


def test_a_pdm_dev_dependency_group_is_given_to_uv_as_its_packages(tmp_path):
    root = team(tmp_path)
    pdm = ('[tool.pdm.dev-dependencies]\ntest = ["iniconfig>=1", "-e file:///${PROJECT_ROOT}/plugins/fixtures#egg=fx",'
           ' "-e ./plugins/more", "helper @ file:///${PROJECT_ROOT}/wheels/helper-1.0-py3-none-any.whl"]\n')
    (root / "pyproject.toml").write_text((root / "pyproject.toml").read_text().replace(
        '[dependency-groups]\ntest = ["iniconfig"]\n', pdm))
    settings = settings_of(root)
    assert settings.install == ("-e", ".", "--group", "test")  # as written, and as the report shows it
    assert settings.uv_install == ("-e", ".", "iniconfig>=1", "-e", f"{root}/plugins/fixtures", "-e", "./plugins/more",
                                   f"helper @ {root.as_uri()}/wheels/helper-1.0-py3-none-any.whl")
    # PEP 735's own stays uv's to read, in its place; so does the "dev" group of tool.uv.dev-dependencies.
    (root / "pyproject.toml").write_text(GROUPED + '[tool.uv]\ndev-dependencies = ["pluggy"]\n[tool.upgrade-gate]\n'
                                         'suite = "none"\n[tool.upgrade-gate.project]\n'
                                         'install = ["--group=test", "-e", ".", "--group", "dev"]\n')
    assert settings_of(root).uv_install == ("--group=test", "-e", ".", "--group", "dev")


def test_a_group_found_nowhere_says_where_it_was_looked_for_and_what_to_write(tmp_path):
    root = team(tmp_path)
    (root / "pyproject.toml").write_text((root / "pyproject.toml").read_text().replace(
        '"--group", "test"', '"--group", "tests"') + '[tool.pdm.dev-dependencies]\nlint = ["ruff"]\n')
    with pytest.raises(ConfigError) as caught:
        settings_of(root)
    assert str(caught.value) == (
        f"{root / 'pyproject.toml'}: tool.upgrade-gate.project.install: --group tests: no dependency group 'tests' in "
        f"{root / 'pyproject.toml'}; looked in [dependency-groups] (test) and [tool.pdm.dev-dependencies] (lint); "
        'declare it as [dependency-groups] tests = ["pytest", …] (PEP 735, which uv reads), or list its packages in '
        "install")


@pytest.mark.shares_machine
@pytest.mark.integration
@pytest.mark.parametrize("declared", [GROUPED, PDM_GROUPED], ids=["dependency-groups", "pdm-dev-dependencies"])
def test_uv_installs_the_group_the_project_table_names(tmp_path, declared):
    root = team(tmp_path / "team")
    (root / "pyproject.toml").write_text((root / "pyproject.toml").read_text().replace(GROUPED, declared))
    settings = settings_of(root)
    assert settings is not None
    venv = tmp_path / "venv"
    subprocess.run([UV, "venv", "-q", "-p", "3.11", str(venv)], check=True, timeout=120)
    assert venvs.install(UV, venv / "bin", list(settings.uv_install), cwd=settings.root) is None
    listed = subprocess.run([UV, "pip", "list", "--python", str(venv / "bin" / "python")], capture_output=True,
                            text=True, check=True, timeout=120).stdout
    assert "iniconfig" in listed and "team" in listed
