"""Which files under the project's root are the team's own: what the API scan reads, and what keys the
project's results in the result cache. What is skipped, and why (issue 37): docs/compat.md, the `scan` paths.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from upgrade_gate._atomic import sha256_file
from upgrade_gate.layout import MANIFEST
from upgrade_gate.run._folder_lock import LOCK_FILE
from upgrade_gate.run.cache_folder import CACHE_TAG

SKIPPED_FOLDERS = frozenset({"__pycache__", "build", "dist", "site-packages", "node_modules"})
# A folder holding one of these is upgrade-gate's or another tool's, not the team's source.
MARKERS = (LOCK_FILE, MANIFEST, CACHE_TAG, "pyvenv.cfg")


class SourcePathError(ValueError):
    """A path the configuration names that is missing or outside the project's root."""


def is_skipped(folder: Path) -> bool:
    """Not the team's source: hidden, build output, a venv, a report folder, a cache."""
    name = folder.name
    return (name.startswith(".") or name in SKIPPED_FOLDERS or name.endswith(".egg-info")
            or any((folder / marker).exists() for marker in MARKERS))


def _walk(folder: Path, suffix: str | None) -> Iterator[Path]:
    for current, subfolders, files in os.walk(folder):
        here = Path(current)
        subfolders[:] = sorted(name for name in subfolders if not is_skipped(here / name))
        yield from (here / name for name in sorted(files) if suffix is None or name.endswith(suffix))


def project_files(root: Path, paths: Sequence[str] = (".",), suffix: str | None = None) -> list[Path]:
    """The files under ``paths`` (relative to ``root``; a file as it is), each once, in a fixed order, relative to
    ``root``, ending in ``suffix`` when given; SourcePathError for a path missing or outside the root."""
    root = root.resolve()
    found: dict[Path, None] = {}
    for given in paths:
        target = (root / given).resolve()
        if not target.exists():
            raise SourcePathError(f"{given!r} does not exist under {root}")
        if not target.is_relative_to(root):
            raise SourcePathError(f"{given!r} is outside the project's root {root}")
        files = [target] if target.is_file() else _walk(target, suffix)  # a folder named is walked: its own call
        found.update(dict.fromkeys(path.relative_to(root) for path in files))
    return list(found)


def files_digest(root: Path, files: Sequence[Path]) -> str:
    """The SHA-256 of each file's path (relative to ``root``) and content, in order: the same files with
    the same bytes give the same digest wherever the project is."""
    digest = hashlib.sha256()
    for path in files:
        digest.update(f"{path.as_posix()}\0{sha256_file(root / path)}\n".encode())
    return digest.hexdigest()
