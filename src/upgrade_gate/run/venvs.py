"""A stack's venv made exactly its recipe: the spec's Python and requirements (and a team's extra
requirements or project), installed with uv; a reused venv emptied first when its recipe changed."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from upgrade_gate._atomic import sha256_file, write_json_atomic
from upgrade_gate.config.project_settings import ProjectSettings
from upgrade_gate.config.specs import StackSpec
from upgrade_gate.run import packages
from upgrade_gate.run.guard import fail_usage


def install_stack_or_exit(uv: str, spec: StackSpec, bin_dir: Path) -> None:
    """Install a stack spec's requirements into a venv; exit 2 quoting uv when it cannot."""
    error = install(uv, bin_dir, [str(r) for r in spec.requirements], cwd=spec.path.parent)
    if error:
        fail_usage(f"{spec.path}: requirements: uv could not install them: {error}; fix the versions in the spec")


def install_project(uv: str, settings: ProjectSettings, spec: StackSpec, bin_dir: Path) -> str | None:
    """The stack, then the project with the stack's requirements as constraints: it may add, never move them."""
    install_stack_or_exit(uv, spec, bin_dir)
    constraints = bin_dir.parent / "stack-constraints.txt"
    constraints.write_text("".join(f"{r}\n" for r in spec.requirements))
    return install(uv, bin_dir, ["--constraint", str(constraints), *settings.uv_install], cwd=settings.root)


# What a reused venv was last made from, beside its bin/.
VENV_RECIPE = "upgrade-gate-recipe.json"


# Venvs this process uses: a shared flock held until it exits (the kernel drops it even after kill -9).
# Emptying a venv whose recipe changed takes it alone: a second run with another configuration once emptied
# a venv under a first run's exports, which failed "No module named 'torch'".
USING: dict[Path, int] = {}
VENV_LOCK = "upgrade-gate-venv.lock"


def use_venv(bin_dir: Path) -> int:
    """This process uses the venv: a shared lock on it (waiting while another run re-makes it)."""
    venv = bin_dir.parent.resolve()
    if venv not in USING:
        fd = os.open(venv / VENV_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_SH)
        USING[venv] = fd
    return USING[venv]


def empty_venv_unless_made_from(uv: str, bin_dir: Path, recipe: dict[str, Any]) -> None:
    """Make a reused venv hold its recipe and nothing else: ``uv pip install`` only adds, so a requirement
    dropped from a spec would stay. A venv last made from another recipe is emptied first (uv links from its
    cache: reinstalling costs seconds), unless another run is using it: exit 2."""
    fd = use_venv(bin_dir)
    marker = bin_dir.parent / VENV_RECIPE
    try:
        made_from = json.loads(marker.read_text())
    except (OSError, ValueError):
        made_from = None
    if made_from == recipe:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # until recipe_installed: nobody imports from it meanwhile
    except BlockingIOError:
        fcntl.flock(fd, fcntl.LOCK_SH)  # converting gave the shared lock up: take it back
        fail_usage(f"{bin_dir.parent}: another upgrade-gate run is using this stack's venv, made from another "
                   "recipe (spec, extra requirements or project); emptying it would pull its packages from under "
                   "that run: wait for it to finish, or give this run venvs of its own with --envdir DIR")
    marker.unlink(missing_ok=True)
    installed = list(packages.installed_versions(bin_dir.parent))
    if installed:
        subprocess.run([uv, "pip", "uninstall", "--python", str(bin_dir / "python"), *installed],
                       capture_output=True, check=False)


def recipe_installed(bin_dir: Path, recipe: dict[str, Any]) -> None:
    write_json_atomic(bin_dir.parent / VENV_RECIPE, recipe)
    fcntl.flock(use_venv(bin_dir), fcntl.LOCK_SH)  # made: other runs of the same recipe may use it too


def venv_recipe(spec: StackSpec, installs: list[str], cwd: Path) -> dict[str, Any]:
    """The spec's Python and requirements, ``installs`` (from ``cwd``), and the metadata of the local projects
    among them (``-e .``), whose own dependencies change with it."""
    local = {}
    for argument in installs:
        folder = cwd / argument.split("[", 1)[0]
        if argument.startswith("-") or not folder.is_dir():
            continue
        for name in ("pyproject.toml", "setup.py", "setup.cfg"):
            if (folder / name).is_file():
                local[str((folder / name).resolve())] = sha256_file(folder / name)
    if "--group" in installs and (cwd / "pyproject.toml").is_file():  # uv reads [dependency-groups] from it
        local[str((cwd / "pyproject.toml").resolve())] = sha256_file(cwd / "pyproject.toml")
    # The folder only matters to the installs' relative paths: without installs, a run from another
    # folder (each team's project, each test's) reuses the venv as it is, where it had emptied it.
    return {"python": spec.python, "requirements": [str(r) for r in spec.requirements], "installs": installs,
            "from": str(cwd) if installs else None, "local": local}


def install(uv: str, bin_dir: Path, requirements: list[str], *, cwd: Path) -> str | None:
    """``uv pip install`` into a stack's venv; None, or uv's error on one line to quote."""
    result = subprocess.run([uv, "pip", "install", "--python", str(bin_dir / "python"), *requirements],
                            cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode == 0:
        return None
    # uv draws its error as a tree (× … ╰─▶ …): keep the words, not which venv it was (the caller names it).
    lines = [line.strip(" \t×╰─▶│") for line in result.stderr.splitlines()
             if not line.startswith("Using Python ")]
    return " ".join(line for line in lines if line) or f"exit status {result.returncode}"


# What a venv that could not be built failed on: the spec's requirements, or the project's extra ones after them.
SPEC_REQUIREMENTS, EXTRA_REQUIREMENTS = "requirements", "tool.upgrade-gate.extra-requirements"


def build_venv(uv: str, spec: StackSpec, folder: Path, wheels: Path | None = None, *, extra: Sequence[str] = (),
               team_folder: Path | None = None) -> tuple[str, str] | None:
    """A venv of exactly the spec's recipe (uv links it from its cache, or from ``wheels``, a cache of its own), then
    the project's ``extra`` requirements, run in ``team_folder``, as `nox -s run` installs them; None, or what it
    failed on (SPEC_REQUIREMENTS or EXTRA_REQUIREMENTS) and uv's error."""
    bin_dir, team_folder = folder / "bin", team_folder or spec.path.parent
    if not (bin_dir / "python").is_file():
        made = subprocess.run([uv, "venv", "--quiet", "--python", spec.python, str(folder)],
                              capture_output=True, text=True, check=False)
        if made.returncode != 0:
            return SPEC_REQUIREMENTS, " ".join(line.strip() for line in made.stderr.splitlines() if line.strip())
    recipe = venv_recipe(spec, list(extra), team_folder)
    empty_venv_unless_made_from(uv, bin_dir, recipe)
    own_cache = ["--cache-dir", str(wheels)] if wheels else []
    error = install(uv, bin_dir, [*own_cache, *(str(r) for r in spec.requirements)], cwd=spec.path.parent)
    if error is not None:
        return SPEC_REQUIREMENTS, error
    error = install(uv, bin_dir, [*own_cache, *extra], cwd=team_folder) if extra else None
    if error is not None:
        return EXTRA_REQUIREMENTS, error
    recipe_installed(bin_dir, recipe)
    return None
