"""Why a stack does not install on a target: each of its pins with no wheel for the target's platform, and the
first release that has one — asked of the index by uv here (``uv pip compile --python-platform``), so that the
report says "executorch 0.7.0: no wheel for linux aarch64; 1.0.0 is the first" where the target only had uv's
resolver error to give (issue 41, item 2)."""

from __future__ import annotations

import subprocess

from uv import find_uv_bin

from upgrade_gate.config.specs import StackSpec

# uv's --python-platform names, by the target's platform.system() and platform.machine().
UV_PLATFORMS = {("linux", "x86_64"): "x86_64-unknown-linux-gnu", ("linux", "aarch64"): "aarch64-unknown-linux-gnu",
                ("darwin", "arm64"): "aarch64-apple-darwin", ("darwin", "x86_64"): "x86_64-apple-darwin"}
INDEX_TIMEOUT_S = 60


def missing_wheels(spec: StackSpec, system: str, machine: str) -> list[str]:
    """Each ``==`` pin of the stack that has no wheel (nor a source uv could use) for the platform, said with the
    first later release that has one; empty for a platform uv has no name for, or when the index cannot be asked."""
    platform = UV_PLATFORMS.get((system.lower(), machine.lower()))
    if platform is None:
        return []
    said = []
    for requirement in spec.requirements:
        pins = spec.pinned(requirement.name)
        if not pins or _resolves(f"{requirement.name}=={pins[0]}", spec.python, platform) is not False:
            continue
        first = _resolves(f"{requirement.name}>{pins[0]}", spec.python, platform, lowest=True)
        said.append(f"{requirement.name} {pins[0]}: no wheel for {system.lower()} {machine.lower()}; "
                    + (f"{first} is the first" if isinstance(first, str) else "no later release has one either"))
    return said


def _resolves(requirement: str, python: str, platform: str, *, lowest: bool = False) -> str | bool | None:
    """The version uv picks for ``requirement`` alone on the platform (the lowest with ``lowest``), False when none
    fits, None when uv or the index could not answer."""
    command = [find_uv_bin(), "pip", "compile", "-", "--quiet", "--no-deps", "--no-header", "--python-platform",
               platform, "--python-version", python, *(["--resolution", "lowest"] if lowest else [])]
    try:
        done = subprocess.run(command, input=requirement, capture_output=True, text=True, timeout=INDEX_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return False if "unsatisfiable" in done.stderr else None
    pinned = [line.split("==", 1)[1].split()[0] for line in done.stdout.splitlines() if "==" in line]
    return pinned[0] if pinned else None
