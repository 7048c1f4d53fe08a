"""The scan's rewrites of the team's files (compat/scan_rewrites.py) as one patch: ``migrate/project.diff``, never
applied to the team's files, and a copy of the project with it applied, where a candidate runs the project's tests
(`nox -s "project(<candidate>)"`, after the scan)."""

from __future__ import annotations

import ast
import difflib
import re
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from upgrade_gate._atomic import sha256_file
from upgrade_gate.project import source
from upgrade_gate.schema.project import ScanResults

# The head of migrate/project.diff: what it is and how to use it.
HEADER = """\
# upgrade-gate migrate: the project's calls that the move to the candidate changes, written for it (the API scan's
# rewrites: TorchFix's fixes and upgrade-gate's own, compat/scan_rewrites.py). Never applied by upgrade-gate:
# review it, then `git apply migrate/project.diff` at the project's root.
# {tested}
"""


@dataclass(frozen=True, kw_only=True, slots=True)
class Patch:
    """The files the patch changes (file → its rewritten source) and those whose rewrite it leaves out, with why."""

    files: dict[str, str]
    left_out: dict[str, str]

    def unified_diff(self, root: Path) -> str:
        """The patch as a unified diff against the files under ``root`` (`git apply` takes it at the root)."""
        return "".join("".join(difflib.unified_diff(
            (root / name).read_text(encoding="utf-8").splitlines(keepends=True), text.splitlines(keepends=True),
            f"a/{name}", f"b/{name}")) for name, text in self.files.items())


def patch_of(scan: ScanResults, root: Path) -> Patch:
    """The scan's rewrites of the files under ``root`` that are still as scanned and hold no finding the team allows
    (`project.scan-allow`: not a migration item, so not rewritten)."""
    allowed = {found.file: found for found in scan.findings if found.allowed and found.rewritten}
    files: dict[str, str] = {}
    left_out: dict[str, str] = {}
    for rewrite in scan.rewrites:
        path = root / rewrite.file
        if rewrite.file in allowed:
            found = allowed[rewrite.file]
            left_out[rewrite.file] = (f"it holds {found.code} at line {found.line}, which project.scan-allow allows "
                                      f"({found.allowed})")
        elif not path.is_file():
            left_out[rewrite.file] = "gone since the scan"
        elif sha256_file(path) != rewrite.sha256:
            left_out[rewrite.file] = "changed since the scan: run the scan again"
        else:
            files[rewrite.file] = rewrite.text
    return Patch(files=files, left_out=left_out)


# What torch.load(..., weights_only=True), torch 2.6's default, says of a class it will not unpickle.
REFUSED_GLOBAL = re.compile(r"Unsupported global: GLOBAL ([A-Za-z_][\w.]*)\.([A-Za-z_]\w*)")
ALLOW = "torch.serialization.add_safe_globals([{name}])  # upgrade-gate: torch.load(..., weights_only=True) reads it"


def refused_globals(messages: Iterable[str]) -> tuple[str, ...]:
    """The classes torch.load refused to unpickle in the tests' failures, by dotted name, first refused first."""
    return tuple(dict.fromkeys(f"{module}.{name}" for text in messages
                               for module, name in REFUSED_GLOBAL.findall(text)))


def with_safe_globals(patch: Patch, root: Path, refused: Sequence[str]) -> Patch:
    """The patch with each class torch.load refused (``refused``: the patched run's own words) allowed where the
    project defines it: ``torch.serialization.add_safe_globals`` after its class statement, in its module (one that
    imports torch), so that a load the patch gave ``weights_only=True`` reads the checkpoints the project writes
    (the sample project's TrainConfig). A class defined elsewhere is left to the team."""
    files = dict(patch.files)
    for dotted in refused:
        module, _, name = dotted.rpartition(".")
        found = next((f"{base}{module.replace('.', '/')}.py" for base in ("", "src/")
                      if (root / f"{base}{module.replace('.', '/')}.py").is_file()), None)
        text = files.get(found) or (root / found).read_text(encoding="utf-8") if found else ""
        if found and (amended := _allowed_after_class(text, name)) is not None:
            files[found] = amended
    return replace(patch, files=files)


def _allowed_after_class(text: str, name: str) -> str | None:
    """``text`` with ``name``'s class allowed after its statement; None where the module defines no such class at
    its top, or does not import torch."""
    tree = ast.parse(text)
    torch = any(isinstance(node, ast.Import) and any(alias.name == "torch" for alias in node.names)
                for node in tree.body)
    found = next((node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == name), None)
    if found is None or not torch or found.end_lineno is None:
        return None
    line = ALLOW.format(name=name)
    lines = text.splitlines(keepends=True)
    end = found.end_lineno
    return text if line in text else "".join([*lines[:end], "\n\n", line + "\n", *lines[end:]])


def patched_copy(root: Path, patch: Patch, target: Path) -> None:
    """The project's own files (project/source.py: no venv, report folder or cache) copied to ``target``, an empty
    folder, with the patch's files rewritten there."""
    for found in source.project_files(root):
        copied = target / found
        copied.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / found, copied)
    for name, text in patch.files.items():
        (target / name).write_text(text, encoding="utf-8")
