"""What a model factory returns."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ModelCase:
    module: torch.nn.Module
    # Positional inputs of module.forward. Only the first stack to run the model
    # uses these tensors; it stores them, and every stack reads the stored copy.
    inputs: tuple[torch.Tensor, ...]
