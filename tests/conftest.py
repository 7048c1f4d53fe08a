from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
collect_ignore = ["sample_project"]  # a user project with its own tests, run inside the stacks


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A user project: a pyproject.toml and its own copy of the built-in stack specs, for tests to edit."""
    shutil.copytree(REPO / "envs", tmp_path / "envs")
    (tmp_path / "pyproject.toml").write_text('[tool.upgrade-gate]\nsuite = "smoke"\n')
    return tmp_path


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB file system: room for the records, not for the artifacts."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], capture_output=True,
                             text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small file system here ({mounted.stderr.strip()}); the README's test command "
                    "runs as root")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)
