"""A report folder is one run's at a time: an exclusive ``flock`` on ``<out>/.upgrade-gate.lock``, held
until the process exits (the kernel drops it even after ``kill -9``)."""

from __future__ import annotations

import errno
import fcntl
import os
import sys
import time
from pathlib import Path

from upgrade_gate._atomic import naming_full_disk
from upgrade_gate._confined import PlantedLink


class FolderBusy(Exception):
    """Another run holds the report folder."""


# Report folders this process holds, by path: nox runs every session of `compare` in one process, and each asks.
HELD: dict[Path, int] = {}
LOCK_FILE = ".upgrade-gate.lock"
# Report folders this process made: one it leaves with a usage error (exit 2) holding only the lock
# file is removed again (release_if_unused), so a refused command leaves nothing behind.
MADE: set[Path] = set()


def lock_out_dir(out: Path) -> None:
    """Take the report folder for this process, or raise FolderBusy naming who has it: the second run refuses at
    once instead of waiting for one that can take an hour."""
    if out in HELD:
        return
    path = out / LOCK_FILE
    try:
        # O_NOFOLLOW: a lock file planted as a link would have its target truncated and overwritten.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as error:
        if error.errno != errno.ELOOP:
            raise
        raise PlantedLink(f"{path} is a symbolic link (to {os.readlink(path)}); upgrade-gate never writes "
                          "through a link in its report folder: remove the link, or choose another folder "
                          "with --out DIR") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 4096).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise FolderBusy(
            f"{out}: another upgrade-gate run is writing this report folder ({holder}); "
            "wait for it to finish, or choose another folder with --out DIR"
        ) from None
    holder = f"pid {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S')}: {' '.join(sys.argv)}"
    try:
        with naming_full_disk(path):  # os.write names no file: a full disk would be blamed on another
            os.ftruncate(fd, 0)
            os.write(fd, holder[:500].encode())
    except BaseException:
        os.close(fd)
        raise
    HELD[out] = fd
    sweep_interrupted_writes(out)


def sweep_interrupted_writes(out: Path) -> None:
    """The temporary files of a writer killed part-way (kill -9: nothing of it could clean up), removed now that
    this process holds the folder and no writer of it runs: hidden ``.<file>.<random>.tmp`` (upgrade_gate._atomic,
    compat/common.py) and ``.<file>.tmp.npz`` (compat/phases.py). Links are not followed."""
    for folder, _, files in os.walk(out):
        for name in files:
            path = Path(folder, name)
            if name.startswith(".") and name.endswith((".tmp", ".tmp.npz")) and not path.is_symlink():
                path.unlink(missing_ok=True)


def make_folder(folder: Path) -> None:
    """``mkdir -p``, remembering which folders it made (release_if_unused)."""
    missing = [p for p in (folder, *folder.parents) if not p.exists()]
    folder.mkdir(parents=True, exist_ok=True)
    MADE.update(missing)


def release_if_unused() -> None:
    """Remove the folders this process made that hold nothing but a lock file: a refused command leaves nothing."""
    for folder in sorted(MADE, key=lambda p: len(p.parts), reverse=True):
        try:
            if folder.is_symlink() or not folder.is_dir() or {p.name for p in folder.iterdir()} - {LOCK_FILE}:
                continue
            if folder in HELD:
                os.close(HELD.pop(folder))
            (folder / LOCK_FILE).unlink(missing_ok=True)
            folder.rmdir()
        except OSError:
            continue  # something appeared meanwhile, or it is not ours to remove: it stays
    MADE.clear()
