"""What a venv has installed, read from its ``*.dist-info`` folders (no import, no subprocess): a test or model
that changed may owe it to a package pinned beside torch (`setuptools<81` brings back `pkg_resources`) or pulled
in by an extra requirement, so the report lists every package whose version differs between the stacks.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name


def dist_infos(venv: Path) -> Iterator[tuple[str, str]]:
    """(name as its folder spells it, version) of every distribution installed in a venv."""
    for site in venv.glob("lib/python*/site-packages"):
        for info in site.glob("*.dist-info"):
            name, _, version = info.name[: -len(".dist-info")].partition("-")
            yield name, version


def installed_versions(venv: Path) -> dict[str, str]:
    """Every distribution installed in a venv: canonical name → version, sorted by name."""
    return dict(sorted((canonicalize_name(name), version) for name, version in dist_infos(venv)))


def requirement_names(arguments: list[str] | tuple[str, ...], cwd: Path) -> list[tuple[str, str | None]]:
    """Each requirement of ``uv pip install`` arguments with the distribution it installs (None: cannot tell);
    a requirements file (``-r``) gives its lines, and options and their values are not requirements."""
    found: list[tuple[str, str | None]] = []
    pending = list(arguments)
    while pending:
        argument = pending.pop(0)
        if argument.startswith("-") and (" " in argument or "=" in argument):
            # One string for an option and its value, as a TOML list holds them: "-e .", "--editable=lib".
            option, _, value = argument.partition(" ") if " " in argument else argument.partition("=")
            pending[:0] = [option, value.strip()]
            continue
        if argument in ("-e", "--editable") and pending:
            target = pending.pop(0)
            found.append((f"{argument} {target}", _local_name(cwd / target)))
        elif argument in ("-r", "--requirement") and pending:
            found += _requirements_file(cwd / pending.pop(0))
        elif argument.startswith("-"):
            # An option; those that take a value (-c FILE, --index-url URL) take the next argument.
            if "=" not in argument and argument in _OPTIONS_WITH_VALUE and pending:
                pending.pop(0)
        else:
            found.append((argument, requirement_name(argument, cwd)))
    return found


_OPTIONS_WITH_VALUE = {"-c", "--constraint", "--override", "-i", "--index-url", "--extra-index-url", "-f",
                       "--find-links", "--python", "-p", "--index", "--default-index"}


def requirement_name(requirement: str, cwd: Path) -> str | None:
    """The canonical name of the distribution a requirement installs, or None."""
    try:
        return canonicalize_name(Requirement(requirement).name)
    except InvalidRequirement:
        return _local_name(cwd / requirement)


def _local_name(path: Path) -> str | None:
    """The distribution a folder, wheel or sdist holds: pyproject.toml's [project] name, or the file's name."""
    for suffix in (".whl", ".tar.gz", ".zip"):
        if path.name.endswith(suffix):
            return canonicalize_name(path.name.partition("-")[0])
    try:
        name = tomllib.loads((path / "pyproject.toml").read_text(encoding="utf-8")).get("project", {}).get("name")
    except (OSError, ValueError):
        return None
    return canonicalize_name(name) if isinstance(name, str) else None


def _requirements_file(path: Path) -> list[tuple[str, str | None]]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return [(f"-r {path.name}", None)]
    arguments = []
    for line in lines:
        line = line.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            arguments += line.split(maxsplit=1) if line.startswith("-") else [line]
    return requirement_names(arguments, path.parent)
