"""A team's own model, declared in the explained run's pyproject (tests/conftest.py): an MLP one of whose
layers gets an outlier channel, so that its int8-dynamic variant fails the quantized gate until that layer
stays in float. Nothing of upgrade-gate is imported: it is found as any team's model is."""

import torch
from torch import nn


class PlantedOutlier(nn.Module):
    """A small MLP whose one defect for int8 is one layer's input: a channel 300 times the others, so that
    quantizing the activations of ``proj`` (one scale per tensor) rounds every other channel to zero.
    Left in float, ``proj`` alone brings the int8-dynamic variant over its gate; the other layers quantize well."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.proj, self.down = nn.Linear(32, 64), nn.Linear(64, 64), nn.Linear(64, 16)
        with torch.no_grad():
            self.up.weight[0] *= 300  # the outlier channel ...
            self.proj.weight[:, 0] /= 300  # ... which proj weighs back down: the float model is ordinary

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.proj(torch.relu(self.up(x)))))


def outlier():
    torch.manual_seed(0)
    return PlantedOutlier().eval(), (torch.randn(8, 32),)
