"""Build every missing asset folder: ``python models/sources/build.py OUT_DIR``.

Runs in the assets venv (``nox -s assets``). Each source module here has
``build(folder)``; its folder is filled under a temporary name and renamed into
place, so an interrupted build leaves nothing that looks finished.
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

# Run as a script, this folder is sys.path[0]: the sources import by their names.
SOURCES = ("photos", "smollm2", "minilm")


def main(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    for name in SOURCES:
        target = out / name
        if target.is_dir():
            print(f"assets: {name}: present", flush=True)
            continue
        start = time.monotonic()
        staging = Path(tempfile.mkdtemp(dir=out, prefix=f".{name}."))
        try:
            importlib.import_module(name).build(staging)
            os.rename(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        print(f"assets: {name}: built in {time.monotonic() - start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
