"""Result files are replaced whole: a reader never sees half of one; and a file is known by its content's
SHA-256 (``sha256_file``), the digest the result cache and the report's evidence name it by."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from upgrade_gate.errors import RunIncomplete


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _current_umask()


# A write that fails on these ran out of room on the disk it was writing to.
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


@contextlib.contextmanager
def naming_full_disk(target: Path) -> Iterator[None]:
    """A full disk met while writing ``target`` names ``target``: a write names no file, and shutil's copy names
    its *source*, so a message built from the error would name the disk that has room."""
    try:
        yield
    except OSError as error:
        if error.errno in DISK_FULL_ERRNOS:
            error.filename, error.filename2 = str(target), None
        raise


def write_text_atomic(path: Path, text: str) -> None:
    with naming_full_disk(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; a report is for everyone who reads the folder
        try:
            # A text a worker recorded may hold a lone surrogate (a file name not in UTF-8, decoded by
            # os.fsdecode), which UTF-8 cannot write: it is written as its escape, never the end of the report.
            with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as stream:
                stream.write(text)
                stream.flush()
                os.fsync(stream.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def read_own_json(path: Path, *, again: str) -> Any:
    """A JSON file upgrade-gate wrote, read back; one that does not read was damaged from outside, never a
    candidate's failure: RunIncomplete (exit 3) naming it and what writes it again (``again``)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise RunIncomplete(f"{path} is damaged: it is not the JSON upgrade-gate wrote ({error}); {again}") from None


def write_json_atomic(path: Path, data: Any, *, indent: int | None = 2) -> None:
    """``data`` as JSON, whole or not at all; ``indent=None``: on one line (a file of many numbers)."""
    write_text_atomic(path, json.dumps(to_json(data), indent=indent, allow_nan=False) + "\n")


def to_json(value: Any) -> Any:
    """Plain JSON values; non-finite floats become "inf", "-inf", "nan" (JSON has none)."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def sha256_file(path: Path) -> str:
    # compat/common.py has the same function on purpose: the worker cannot import this package.
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
