"""Small models that exercise failure paths in tests."""

from __future__ import annotations

import torch
from torch import nn

from .case import ModelCase


class DataDependentBranch(nn.Module):
    """Branches on a tensor's value: TorchScript tracing bakes in one branch,
    torch.export refuses the data-dependent condition."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        if y.sum() > 0:
            return y.relu()
        return -y


def data_dependent_branch() -> ModelCase:
    return ModelCase(DataDependentBranch().eval(), (torch.randn(2, 16),))


class Segfault(nn.Module):
    """Kills its own process with SIGSEGV, like a native crash in a kernel."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import os
        import signal

        os.kill(os.getpid(), signal.SIGSEGV)
        return x


def segfault() -> ModelCase:
    return ModelCase(Segfault().eval(), (torch.zeros(1),))
