"""The scan's rewrites of the team's files (compat/scan_rewrites.py) as one patch: ``migrate/project.diff``, never
applied to the team's files, and a copy of the project with it applied, where a candidate runs the project's tests
(`nox -s "project(<candidate>)"`, after the scan)."""

from __future__ import annotations

import difflib
import shutil
from dataclasses import dataclass
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


def patched_copy(root: Path, patch: Patch, target: Path) -> None:
    """The project's own files (project/source.py: no venv, report folder or cache) copied to ``target``, an empty
    folder, with the patch's files rewritten there."""
    for found in source.project_files(root):
        copied = target / found
        copied.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / found, copied)
    for name, text in patch.files.items():
        (target / name).write_text(text, encoding="utf-8")
