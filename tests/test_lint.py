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
