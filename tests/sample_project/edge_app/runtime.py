"""Runs the app's model file as the phone does: the Lite Interpreter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.jit.mobile import _load_for_lite_interpreter


def load(path: Path) -> Any:
    return _load_for_lite_interpreter(str(path))


def classify(module: Any, images: torch.Tensor) -> torch.Tensor:
    """Class indices, one per image."""
    with torch.no_grad():
        return module(images).argmax(dim=1)
