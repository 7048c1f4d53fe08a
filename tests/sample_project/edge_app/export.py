"""How the model ships today: TorchScript → optimize_for_mobile → Lite Interpreter (.ptl)."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch.utils.mobile_optimizer import optimize_for_mobile

from edge_app.model import build


def export_lite(model: torch.nn.Module, example: tuple[torch.Tensor, ...], path: Path) -> Path:
    """Write the app's model file."""
    traced = torch.jit.trace(model, example)
    optimized = optimize_for_mobile(traced)
    optimized._save_for_lite_interpreter(str(path))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", type=Path, help="the .ptl to write")
    args = parser.parse_args()
    model, example = build()
    print(export_lite(model, example, args.out))


if __name__ == "__main__":
    main()
