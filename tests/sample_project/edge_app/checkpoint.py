"""Training checkpoints: the weights and the configuration they were trained with."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch


@dataclasses.dataclass
class TrainConfig:
    learning_rate: float = 1e-3
    epochs: int = 30
    batch_size: int = 64
    augment: bool = True


def save_checkpoint(path: Path, model: torch.nn.Module, config: TrainConfig) -> None:
    torch.save({"state_dict": model.state_dict(), "config": config}, path)


def load_checkpoint(path: Path) -> tuple[dict[str, torch.Tensor], TrainConfig]:
    """The state dict and the training configuration saved by save_checkpoint."""
    checkpoint = torch.load(path)
    return checkpoint["state_dict"], checkpoint["config"]
