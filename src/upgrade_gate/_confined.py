"""Nothing outside the report folder and the result cache is written or deleted, whatever a link planted there
says: a model folder that links to ``/home/you`` would have its target's files deleted by the next export's
clean-up. So a run refuses to start on a folder that holds a link, and every removal checks, at the moment it
removes, that its target lies inside its own folder: a link itself is unlinked, never followed.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from upgrade_gate.errors import ConfigError


class PlantedLink(ConfigError):
    """A symbolic link where upgrade-gate writes only real files and folders: exit 2, naming it."""


class OutsideOwnFolder(ConfigError):
    """A removal that would reach outside the folder it belongs to."""


# Folders of a report folder that hold links by design: `nox -s releases`' venvs (a venv's bin/python
# is a link), made and removed by the run itself.
LINKS_ALLOWED_IN = (".venvs",)


def planted_links(folder: Path) -> list[Path]:
    """Every symbolic link below ``folder`` (not followed), but in the folders that hold them by design."""
    found: list[Path] = []
    if folder.is_symlink() or not folder.is_dir():
        return found
    for root, dirs, files in os.walk(folder, followlinks=False):
        here = Path(root)
        if here == folder:
            dirs[:] = [d for d in dirs if d not in LINKS_ALLOWED_IN]
        found += [here / name for name in (*dirs, *files) if (here / name).is_symlink()]
    return sorted(found)


def refuse_planted_links(folder: Path, what: str) -> None:
    """Raise PlantedLink naming the first link below ``folder`` (the report folder, the result cache)."""
    links = planted_links(folder)
    if links:
        more = f" (and {len(links) - 1} more)" if len(links) > 1 else ""
        raise PlantedLink(f"{links[0]} is a symbolic link (to {os.readlink(links[0])}){more}; upgrade-gate writes "
                          f"and deletes only real files in its {what} {folder}, and never follows a link there: "
                          "remove the link, or choose another folder")


def _check_inside(path: Path, root: Path) -> None:
    real_parent, real_root = path.parent.resolve(), root.resolve()
    if real_parent != real_root and not real_parent.is_relative_to(real_root):
        raise OutsideOwnFolder(f"{path} lies outside {root} (it resolves to {real_parent / path.name}); "
                               "upgrade-gate removes nothing outside its report folder and result cache: "
                               "remove the link that leads there")


def remove_tree(path: Path, *, within: Path) -> None:
    """Remove a folder of ``within``'s (nothing if absent); a link in its place is unlinked, not followed."""
    if path.is_symlink():
        _check_inside(path, within)
        path.unlink()
        return
    if not path.exists():
        return
    _check_inside(path, within)
    if path.resolve() == within.resolve():
        raise OutsideOwnFolder(f"{path}: removing it would remove all of {within}")
    shutil.rmtree(path, ignore_errors=True)  # rmtree unlinks the links below it, never what they point to


def remove_file(path: Path, *, within: Path) -> None:
    """Remove a file of ``within``'s (nothing if absent); a link is unlinked, not followed."""
    if not path.is_symlink() and not path.exists():
        return
    _check_inside(path, within)
    path.unlink(missing_ok=True)
