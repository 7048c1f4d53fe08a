"""A model whose code sets torch's grad and autocast modes for a region of its own, as transformers' rotary
embeddings do (LlamaRotaryEmbedding, Qwen2RotaryEmbedding: `@torch.no_grad()` on forward, the angles computed in
`torch.autocast(…, enabled=False)`)."""

from __future__ import annotations

import torch
from torch import nn

from .case import ModelCase


class RotaryAngles(nn.Module):
    """The cosines of a rotary embedding's angles, kept out of autocast under no_grad. torch 2.8's capture for PT2E
    (export_for_training, grad on) makes each region a higher-order submodule, the autocast one inside the no_grad
    one, and PT2E's convert loses the inner one ("DuplicateDQPass … references nonexistent attribute submod_1")."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.register_buffer("inverse_frequencies", torch.arange(1, width + 1, dtype=torch.float32) / width)
        self.width = width

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", enabled=False):
            return (x.float()[..., : self.width] * self.inverse_frequencies).cos()


class RotatedProjection(nn.Module):
    """A projection whose first half is scaled by the cosines of its own rotary angles: int8-dynamic quantizes the
    projection, and the recipe raises on the regions of RotaryAngles, which quantizes nothing of its own."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.projection = nn.Linear(width, width)
        self.angles = RotaryAngles(width // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.projection(x)
        return y[..., : y.shape[-1] // 2] * self.angles(y)


def planted_regions() -> ModelCase:
    torch.manual_seed(29)
    return ModelCase(RotatedProjection().eval(), (torch.randn(2, 16),))
