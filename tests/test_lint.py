"""The code as ruff and mypy read it, with the configuration in pyproject.toml: the test
command runs them, so CI does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *command], cwd=REPO, capture_output=True, text=True, check=False)


pytestmark = pytest.mark.lint


def test_ruff_finds_nothing():
    result = run("ruff", "check", "--no-cache", "--output-format", "concise")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_finds_nothing():
    result = run("mypy", "--no-incremental")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_test_environment_is_pinned_and_its_drift_is_checked_weekly():
    """The README's test command (which .ci/run runs) installs with tests/constraints.txt, which pins every package
    pyproject.toml asks for; the weekly drift job, which installs without it, is a valid GitHub workflow."""
    import tomllib

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    readme_command = next(line for line in (REPO / "README.md").read_text().splitlines() if "pytest -m alone" in line)
    assert readme_command in (REPO / ".ci" / "run").read_text()
    assert "-c tests/constraints.txt" in readme_command
    pinned = {canonicalize_name(line.split("==")[0]): line.split("==")[1]
              for line in (REPO / "tests" / "constraints.txt").read_text().splitlines()
              if line and not line.startswith("#")}
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    for text in (*project["dependencies"], *project["optional-dependencies"]["test"]):
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"tests/constraints.txt pins no {name}: refresh it (the command is in its header)"
        assert requirement.specifier.contains(pinned[name]), f"{name}=={pinned[name]} is outside {requirement}"
    schema = run("check_jsonschema", "--builtin-schema", "vendor.github-workflows",
                 str(REPO / ".github" / "workflows" / "drift.yml"))
    assert schema.returncode == 0, schema.stdout + schema.stderr
    assert "constraints" not in (REPO / ".ci" / "drift").read_text().split("set -euo pipefail")[1]
