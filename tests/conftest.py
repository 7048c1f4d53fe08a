from __future__ import annotations

import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
collect_ignore = ["sample_project"]  # a user project with its own tests, run inside the stacks


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A user project: a pyproject.toml and a copy of this repo's stack specs."""
    shutil.copytree(REPO / "envs", tmp_path / "envs")
    (tmp_path / "pyproject.toml").write_text('[tool.upgrade-gate]\nsuite = "smoke"\n')
    return tmp_path
