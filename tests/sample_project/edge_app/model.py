"""The classifier: a tiny CNN for 32×32 RGB crops, ten classes."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

NUM_CLASSES = 10
INPUT_SHAPE = (1, 3, 32, 32)
SEED = 0


class TinyNet(nn.Module):
    def __init__(self, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.classifier = nn.Linear(32, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(images), 1))


def build() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The model in eval mode with fixed weights, and an example input (upgrade-gate's factory)."""
    torch.manual_seed(SEED)  # the same weights and example every time
    model = TinyNet().eval()
    return model, (torch.rand(INPUT_SHAPE),)


def embed(model: TinyNet, images: torch.Tensor) -> torch.Tensor:
    """Unit-RMS image embeddings for the on-device similarity search."""
    features = torch.flatten(model.features(images), 1)
    # F.rms_norm is not in torch 2.2.
    return F.rms_norm(features, (features.shape[-1],))


def scores_bfloat16(model: TinyNet, images: torch.Tensor) -> torch.Tensor:
    """Class scores computed in bfloat16 where the CPU allows: the app's batch scoring on the server."""
    with torch.no_grad(), torch.cpu.amp.autocast():
        return model(images)
