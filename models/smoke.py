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


class Hang(nn.Module):
    """Never returns, like seed 002's vision encoder whose forward() hangs."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import time

        while True:
            time.sleep(1.0)


def hang() -> ModelCase:
    return ModelCase(Hang().eval(), (torch.zeros(1),))


class MemoryHog(nn.Module):
    """Allocates and touches memory until stopped, like an export that runs out
    of memory (seed 000). Gives up at 16 GiB, so that a broken memory limit
    fails a test instead of taking the machine down."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import time

        held = []
        for _ in range(64):
            held.append(torch.ones(256 * 2**20 // 4))  # 256 MiB, written
            time.sleep(0.05)
        return x + len(held)


def memory_hog() -> ModelCase:
    return ModelCase(MemoryHog().eval(), (torch.zeros(1),))
