"""A report folder is one run's at a time: an exclusive ``flock`` on ``<out>/.upgrade-gate.lock``, held
until the process exits (the kernel drops it even after ``kill -9``)."""

from __future__ import annotations

import fcntl
import os
import sys
import time
from pathlib import Path


class FolderBusy(Exception):
    """Another run holds the report folder."""


# Report folders this process holds, by path: nox runs every session of
# `compare` in one process, and each one asks again. Held until the process
# exits; the kernel releases the lock even after a kill -9.
HELD: dict[Path, int] = {}
LOCK_FILE = ".upgrade-gate.lock"


def lock_out_dir(out: Path) -> None:
    """Take the report folder for this process, or raise FolderBusy naming who has it.

    Two runs writing into one folder would interleave their records; the second
    one refuses at once instead of waiting for a run that can take an hour.
    """
    if out in HELD:
        return
    path = out / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 4096).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise FolderBusy(
            f"{out}: another upgrade-gate run is writing this report folder ({holder}); "
            "wait for it to finish, or choose another folder with --out DIR"
        ) from None
    os.ftruncate(fd, 0)
    holder = f"pid {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S')}: {' '.join(sys.argv)}"
    os.write(fd, holder[:500].encode())
    HELD[out] = fd
