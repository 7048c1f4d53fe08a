"""``[tool.upgrade-gate.project]``: the team's own project — how it installs, how its tests run, what the scan reads."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from upgrade_gate.config._kinds import finite, severity
from upgrade_gate.config.tomlfile import Table, read_toml

PROJECT_KEYS = {"root", "install", "test", "scan", "timeout", "severity", "scan-severity", "allow", "scan-allow",
                "test-patched"}
# A scan-allow key: a rule's code and a file pattern (fnmatch, relative to root): "TOR102 tools/*.py".
SCAN_ALLOW_KEY = re.compile(r"(?P<code>[A-Z]+\d+) (?P<files>\S+)")
# Where a non-pytest test command takes its JUnit XML output path.
JUNIT_PLACEHOLDER = "{junit}"
# `install`'s dependency groups: uv reads PEP 735's [dependency-groups], not PDM's older
# [tool.pdm.dev-dependencies] (timm's test packages), so such a group is passed to uv as its packages.
GROUP_OPTION = "--group"
PDM_ROOT_VARIABLE = "${PROJECT_ROOT}"  # how a PDM entry names the project's folder (-e file:///${PROJECT_ROOT}/x)


@dataclass(frozen=True, kw_only=True, slots=True)
class ProjectSettings:
    """``[tool.upgrade-gate.project]``: the team's own code, tested in every stack and scanned."""

    root: Path
    # `uv pip install` arguments as written, run in ``root``, beside the stack's own requirements.
    install: tuple[str, ...]
    # What uv is given: ``install`` with each PDM dev-dependency group as its packages (``uv_arguments``).
    uv_install: tuple[str, ...]
    # Run in ``root`` with the stack's venv first on PATH; JUnit XML goes where {junit} stands.
    test: tuple[str, ...]
    # Files and folders the API scan reads, relative to ``root``.
    scan: tuple[str, ...]
    timeout_s: float
    severity: str  # the project-tests gate
    scan_severity: str  # the api-scan gate
    # test id → why its failure on the candidate is known and accepted
    allow: tuple[tuple[str, str], ...] = ()
    # "CODE files" → why a scan finding of that rule in those files is not a migration item
    scan_allow: tuple[tuple[str, str], ...] = ()
    # The tests run again in each candidate with migrate/project.diff applied to a copy (a second run of them).
    test_patched: bool = True
    defined_in: Path | None = None

    def test_command(self, junit: Path) -> list[str]:
        """The test command with its JUnit XML output at ``junit``."""
        if any(JUNIT_PLACEHOLDER in arg for arg in self.test):
            return [arg.replace(JUNIT_PLACEHOLDER, str(junit)) for arg in self.test]
        # xunit1 records each test's file, from which the pytest node id is rebuilt.
        return [*self.test, f"--junitxml={junit}", "-o", "junit_family=xunit1"]

    def to_dict(self) -> dict[str, Any]:
        return {"root": str(self.root), "install": list(self.install), "test": list(self.test),
                "scan": list(self.scan), "timeout": self.timeout_s, "severity": self.severity,
                "scan-severity": self.scan_severity, "allow": dict(self.allow), "scan-allow": dict(self.scan_allow),
                "test-patched": self.test_patched}


def runs_pytest(command: list[str] | tuple[str, ...]) -> bool:
    """``pytest …``, ``py.test …`` or ``python -m pytest …``."""
    if not command:
        return False
    if Path(command[0]).name in ("pytest", "py.test"):
        return True
    return len(command) >= 3 and Path(command[0]).name.startswith("python") and list(command[1:3]) == ["-m", "pytest"]


def command_setting(table: Table, name: str, default: list[str]) -> list[str]:
    """A command as an array of arguments, or one string split like a shell would."""
    raw = table.data.get(name, default)
    if isinstance(raw, str):
        try:
            return shlex.split(raw)
        except ValueError as error:
            raise table.error(name, f"cannot split {raw!r} into arguments: {error}") from None
    return table.get_str_list(name, default)


def uv_arguments(install: list[str], root: Path, table: Table) -> list[str]:
    """``install`` as uv takes it: ``--group NAME`` stays where uv finds NAME, a group of PDM's
    [tool.pdm.dev-dependencies] becomes its packages; a group found in neither is a ConfigError saying
    where it was looked for and what to write instead."""
    wanted: list[tuple[int, int, str]] = []  # (where the option starts, how many arguments, the group)
    for index, argument in enumerate(install):
        if argument == GROUP_OPTION and index + 1 < len(install):
            wanted.append((index, 2, install[index + 1]))
        elif argument.startswith(f"{GROUP_OPTION}="):
            wanted.append((index, 1, argument.partition("=")[2]))
    wanted = [w for w in wanted if ":" not in w[2]]  # uv's own `path/pyproject.toml:name`: its to find
    if not wanted:
        return install
    path = root / "pyproject.toml"
    if not path.is_file():
        raise table.error("install", f"{GROUP_OPTION} {wanted[0][2]}: no pyproject.toml in {root} to read the group "
                                     "from; list its packages in install instead")
    document = read_toml(path)
    groups, tool = _subtable(document, "dependency-groups"), _subtable(document, "tool")
    uv_table, pdm = _subtable(tool, "uv"), _subtable(_subtable(tool, "pdm"), "dev-dependencies")
    arguments, done = [], 0
    for index, count, group in wanted:
        arguments += install[done:index]
        done = index + count
        if group in groups or (group == "dev" and "dev-dependencies" in uv_table):
            arguments += install[index:done]
        elif group in pdm:
            arguments += _pdm_group(pdm[group], root, table, group)
        else:
            raise table.error("install", (
                f"{GROUP_OPTION} {group}: no dependency group {group!r} in {path}; looked in [dependency-groups] "
                f"({', '.join(groups) or 'none'}) and [tool.pdm.dev-dependencies] ({', '.join(pdm) or 'none'}); "
                f"declare it as [dependency-groups] {group} = [\"pytest\", …] (PEP 735, which uv reads), or list "
                "its packages in install"))
    return arguments + install[done:]


def _subtable(table: dict[str, Any], key: str) -> dict[str, Any]:
    value = table.get(key)
    return value if isinstance(value, dict) else {}


def _pdm_group(entries: object, root: Path, table: Table, group: str) -> list[str]:
    """A [tool.pdm.dev-dependencies] group as uv arguments: requirements as written, ``-e PATH`` as two."""
    if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
        raise table.error("install", f"{GROUP_OPTION} {group}: [tool.pdm.dev-dependencies] {group} in "
                                     f"{root / 'pyproject.toml'} is not a list of requirement strings")
    arguments = []
    for entry in entries:
        entry = entry.replace(f"file:///{PDM_ROOT_VARIABLE}", root.as_uri()).replace(PDM_ROOT_VARIABLE, str(root))
        editable, _, target = entry.partition(" ")
        if editable == "-e":  # `-e file:///…/pkg#egg=pkg` or `-e ./pkg`: the folder, as uv's -e takes it
            arguments += ["-e", target.strip().removeprefix("file://").partition("#")[0]]
        else:
            arguments.append(entry)
    return arguments


def load_project(table: Table, base: Path, check_files: bool) -> ProjectSettings:
    table.reject_unknown(PROJECT_KEYS)
    root = (base / table.get("root", str, ".")).resolve()
    if check_files and not root.is_dir():
        raise table.error("root", f"{root} is not a folder; give the project's folder relative to {base}")
    install = command_setting(table, "install", ["."])
    if not install:
        raise table.error("install", 'nothing to install; e.g. ["-e", ".[test]"]')
    test = command_setting(table, "test", ["python", "-m", "pytest"])
    if not test:
        raise table.error("test", 'no command; e.g. "python -m pytest tests"')
    if not runs_pytest(test) and not any(JUNIT_PLACEHOLDER in arg for arg in test):
        raise table.error("test", f"cannot tell where {test[0]!r} writes JUnit XML; put {JUNIT_PLACEHOLDER} where the "
                                  "command takes that file's path (pytest commands get --junitxml added)")
    scan = table.get_str_list("scan", ["."])
    for path in scan if check_files else ():
        if not (root / path).exists():
            raise table.error("scan", f"{path!r} does not exist under {root}")
    allow = table.get_table("allow")
    for test_id in allow.data:
        if not allow.get(test_id, str, "").strip():
            raise allow.error(test_id, "give the reason the break is accepted, as a string")
    scan_allow = table.get_table("scan-allow")
    for finding in scan_allow.data:
        if not SCAN_ALLOW_KEY.fullmatch(finding):
            raise scan_allow.error(finding, 'name a rule and the files, "CODE PATTERN" (e.g. "UG101 export/onnx.py")')
        if not scan_allow.get(finding, str, "").strip():
            raise scan_allow.error(finding, "give the reason these findings are not migration items, as a string")
    timeout = finite(table, "timeout", 1800.0)
    if timeout <= 0:
        raise table.error("timeout", f"must be greater than 0, got {timeout!r}")
    return ProjectSettings(
        root=root, install=tuple(install), test=tuple(test), scan=tuple(scan), timeout_s=timeout,
        uv_install=tuple(uv_arguments(install, root, table) if check_files else install),
        severity=severity(table, "severity", "hard"), scan_severity=severity(table, "scan-severity", "soft"),
        allow=tuple((test_id, allow.data[test_id]) for test_id in allow.data), defined_in=table.path,
        scan_allow=tuple(scan_allow.data.items()), test_patched=table.get("test-patched", bool, True),
    )
