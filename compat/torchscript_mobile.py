"""Legacy stack: TorchScript → optimize_for_mobile → Lite Interpreter (.ptl)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.jit.mobile import _load_for_lite_interpreter
from torch.utils.mobile_optimizer import optimize_for_mobile

SUFFIX = ".ptl"


def lower(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> tuple[Any, dict[str, Any]]:
    optimized = optimize_for_mobile(torch.jit.trace(module, inputs))
    return optimized, {"operators": len(torch.jit.export_opnames(optimized))}


def save(lowered: Any, path: Path, *, keep: bool = False) -> None:
    # Saving leaves a TorchScript module as it was: `keep` needs nothing here.
    # The Lite Interpreter allocates as it runs: there is no memory plan to report.
    lowered._save_for_lite_interpreter(str(path))


def load(path: Path) -> Any:
    return _load_for_lite_interpreter(str(path))


def run(program: Any, inputs: tuple[torch.Tensor, ...]) -> Any:
    with torch.no_grad():
        return program(*inputs)


def set_threads(count: int) -> None:
    torch.set_num_threads(count)
