from __future__ import annotations

from pathlib import Path

import pytest
import torch

from edge_app.checkpoint import TrainConfig, load_checkpoint, save_checkpoint
from edge_app.model import build


def test_checkpoint_round_trip(tmp_path: Path) -> None:
    model, _ = build()
    config = TrainConfig(learning_rate=3e-4, epochs=12)
    save_checkpoint(tmp_path / "last.pt", model, config)
    state_dict, loaded_config = load_checkpoint(tmp_path / "last.pt")
    assert loaded_config == config
    for name, tensor in model.state_dict().items():
        assert torch.equal(state_dict[name], tensor), name


@pytest.mark.skipif(not hasattr(torch.serialization, "safe_globals"),
                    reason="needs torch.serialization.safe_globals, which this torch lacks")
def test_checkpoint_loads_weights_only_with_config_allowed(tmp_path: Path) -> None:
    model, _ = build()
    save_checkpoint(tmp_path / "last.pt", model, TrainConfig())
    with torch.serialization.safe_globals([TrainConfig]):
        checkpoint = torch.load(tmp_path / "last.pt", weights_only=True)
    assert checkpoint["config"] == TrainConfig()
