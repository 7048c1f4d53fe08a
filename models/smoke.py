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


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class ValueGate(nn.Module):
    """Passes its input through only where the batch's mean is positive: a
    data-dependent branch, which torch.export cannot capture."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.scale = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.scale(x)
        if y.mean() > 0:
            return y
        return x


class GatedBlock(Block):
    def __init__(self, width: int) -> None:
        super().__init__(width)
        self.gate = ValueGate(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gate(super().forward(x))


class BlockStack(nn.Module):
    """A stem, blocks and a head: the shape of a real model, for a block that breaks the export."""

    def __init__(self, blocks: list[nn.Module], width: int = 32) -> None:
        super().__init__()
        self.stem = nn.Linear(16, width)
        self.blocks = nn.ModuleList(blocks)
        self.head = nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def broken_submodule(width: int = 32) -> ModelCase:
    """Exports fine except in one place, two levels down: blocks.1.gate."""
    model = BlockStack([Block(width), GatedBlock(width), Block(width)], width)
    return ModelCase(model.eval(), (torch.randn(2, 16),))


@torch.fx.wrap
def apply_mask(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Called, not traced, by FX graphs (torch.fx.wrap): it asks whether there is a mask."""
    return scores if mask is None else scores.masked_fill(mask, float("-inf"))


class TokenMixer(nn.Module):
    """Called the way third-party attention is (``mask=None``, keywords). With ``repeat_positive``
    it repeats the features whose mean is positive and keeps the first ``width``: a slice of a
    data-dependent width, which torch.export cannot bound."""

    def __init__(self, width: int, repeat_positive: bool = False) -> None:
        super().__init__()
        self.mix = nn.Linear(width, width)
        self.repeat_positive = repeat_positive

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, scale: float = 1.0) -> torch.Tensor:
        y = apply_mask(self.mix(x) * scale, mask)
        if self.repeat_positive:
            repeated = y.repeat_interleave((y.mean(0) > 0).long() + 1, dim=-1)
            y = repeated[:, : y.shape[-1]]
        return y


def fx_traced(module: nn.Module) -> torch.fx.GraphModule:
    """``module`` as FX graph mode quantization traces it: generated code, each node's stack trace kept."""
    tracer = torch.fx.Tracer()
    tracer.record_stack_traces = True
    return torch.fx.GraphModule(module, tracer.trace(module))


class MixBlock(nn.Module):
    def __init__(self, width: int, repeat_positive: bool = False) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mixer = fx_traced(TokenMixer(width, repeat_positive))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mixer(self.norm(x), mask=None, scale=0.5)


def traced_submodule(width: int = 32) -> ModelCase:
    """Exports fine except in blocks.1.mixer: FX-generated code, called with ``mask=None``."""
    model = BlockStack([MixBlock(width), MixBlock(width, repeat_positive=True), MixBlock(width)], width)
    return ModelCase(model.eval(), (torch.randn(2, 16),))


class Segfault(nn.Module):
    """Kills its own process with SIGSEGV, like a native crash in a kernel."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import os
        import signal

        os.kill(os.getpid(), signal.SIGSEGV)
        return x


def segfault() -> ModelCase:
    return ModelCase(Segfault().eval(), (torch.zeros(1),))


class KilledFromOutside(nn.Module):
    """Its worker gets a SIGKILL that upgrade-gate did not send, while the kernel counts
    no out-of-memory kill: as someone's ``kill -9`` or a CI runner's clean-up does."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import os
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
        return x


def killed_from_outside() -> ModelCase:
    return ModelCase(KilledFromOutside().eval(), (torch.zeros(1),))


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


class PlantedOperator(nn.Module):
    """A small MLP whose one defect in ExecuTorch 0.7 is an operator the XNNPACK delegate computes
    wrongly: the tanh-approximated GELU runs as the exact one. ``approximate="none"`` is the same
    model without it."""

    def __init__(self, approximate: str) -> None:
        super().__init__()
        self.approximate = approximate
        self.norm = nn.LayerNorm(32)
        self.up, self.down = nn.Linear(32, 128), nn.Linear(128, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.gelu(self.up(self.norm(x)), approximate=self.approximate))


def planted_operator(approximate: str = "tanh") -> ModelCase:
    torch.manual_seed(5)
    # Inputs wide enough to reach where the two GELUs differ most (|x| ≈ 2-4).
    return ModelCase(PlantedOperator(approximate).eval(), (3 * torch.randn(8, 32),))


def planted_operator_removed() -> ModelCase:
    return planted_operator("none")


class ScaledBlock(nn.Module):
    """A convolution, a per-channel scale and a ReLU: ExecuTorch 0.7's XNNPACK fuses the ReLU into the broadcast
    multiply and gets it wrong, while the multiply and the ReLU each lower right alone (a fusion, no one
    operator, is the culprit)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 16, 3, padding=1)
        self.scale = nn.Parameter(torch.rand(16, 1, 1) + 0.5)  # a layer scale, one per channel
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.conv(x) * self.scale).mean((2, 3)))


def planted_fusion() -> ModelCase:
    torch.manual_seed(11)
    return ModelCase(ScaledBlock().eval(), (torch.randn(1, 8, 16, 16),))


class SharedProjections(nn.Module):
    """An attention's q, k and v projections of the method's input, q split into heads: dynamically quantized
    (int8-dynamic), they share one quantization of it, which ExecuTorch 0.7's XNNPACK does not lower once a
    view follows one of them ("Weight and Input should both be quantized", as minilm-l6@int8-dynamic)."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(64, 64), nn.Linear(64, 64), nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        heads = self.q(x).view(x.shape[1], 4, 16).transpose(0, 1)  # [heads, tokens, head width]
        return heads, self.k(x), self.v(x)


def planted_quantized_export() -> ModelCase:
    torch.manual_seed(7)
    return ModelCase(SharedProjections().eval(), (torch.randn(1, 16, 64),))


class LinearNorm(nn.Module):
    """A linear layer and a batch norm over its channels, as LeViT writes them: the tokens flattened into the
    norm's batch. ExecuTorch 0.7's XNNPACK takes the linear and leaves the batch norm, which has no convolution
    before it to fold into, to the portable kernel."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear, self.norm = nn.Linear(width, width), nn.BatchNorm1d(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        return self.norm(y.flatten(0, 1)).reshape_as(y)


class PlantedLatency(nn.Module):
    """Twelve LinearNorm blocks with ReLUs over 1024 tokens of width 32: the portable batch norms take more than
    half the candidate's time (×2.5 the same program with each folded into its linear, measured here)."""

    def __init__(self, width: int = 32, depth: int = 12) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(LinearNorm(width) for _ in range(depth))
        for block in self.blocks:  # running statistics a trained model would have, not the identity's
            block.norm.running_mean.uniform_(-1.0, 1.0)
            block.norm.running_var.uniform_(0.5, 2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.relu(block(x))
        return x


def planted_latency() -> ModelCase:
    torch.manual_seed(13)
    return ModelCase(PlantedLatency().eval(), (torch.randn(1, 1024, 32),))


def _conv(inputs: int, outputs: int, kernel: int = 1) -> nn.Sequential:
    """ultralytics' Conv: a convolution, its batch norm and a SiLU."""
    return nn.Sequential(nn.Conv2d(inputs, outputs, kernel, padding=kernel // 2, bias=False), nn.BatchNorm2d(outputs),
                         nn.SiLU())


class SplitShortcut(nn.Module):
    """ultralytics' C2f with one bottleneck and its shortcut (yolov8n's backbone): a convolution's output split in
    two, the bottleneck and its add on the second half, the three concatenated. Quantized int8 by ExecuTorch 0.7's
    XNNPACKQuantizer it lowers, and XNNPACK refuses the three-input concatenation when the program loads."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        half = width // 2
        self.cv1, self.cv2 = _conv(width, 2 * half), _conv(3 * half, width)
        self.bottleneck = nn.Sequential(_conv(half, half, 3), _conv(half, half, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = list(self.cv1(x).chunk(2, 1))
        parts.append(parts[-1] + self.bottleneck(parts[-1]))
        return self.cv2(torch.cat(parts, 1))


def planted_load() -> ModelCase:
    torch.manual_seed(17)
    return ModelCase(SplitShortcut().eval(), (torch.randn(1, 16, 20, 20),))


class PaddedPositions(nn.Module):
    """RoBERTa's embeddings in small: position ids counted from the padding mask (a cumulative sum of the mask, times
    the mask) beside the token embeddings. Quantized int8-dynamic by ExecuTorch 0.7's XNNPACKQuantizer, the integer
    arithmetic is quantized too, and the position embedding is handed float indices: the recipe raises."""

    def __init__(self, vocabulary: int = 50, width: int = 16, padding: int = 1) -> None:
        super().__init__()
        self.padding = padding
        self.tokens = nn.Embedding(vocabulary, width)
        self.positions = nn.Embedding(vocabulary, width, padding_idx=padding)
        self.linear = nn.Linear(width, width)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        mask = ids.ne(self.padding).int()
        positions = torch.cumsum(mask, dim=1).type_as(mask) * mask
        return self.linear(self.tokens(ids) + self.positions(positions.long() + self.padding))


def planted_quantize() -> ModelCase:
    torch.manual_seed(23)
    return ModelCase(PaddedPositions().eval(), (torch.randint(2, 50, (2, 8)),))


class HyphenatedStage(nn.Module):
    """torchvision's RegNet names its blocks ``block1-0``: a convolution and its batch norm in a block of that name.
    ExecuTorch 0.7's XNNPACK fuses the two into a weight named after the module's path (``trunk_block1-0_0_weight_
    fused_bn``), which its fusion pass (FuseBatchNormWithConvPass) then cannot find: the model exports, and does not
    lower. Named ``block1_0``, it lowers; so does the block alone, its path no longer hyphenated."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, width, 1)
        self.trunk = nn.Sequential()
        self.trunk.add_module("block1-0", nn.Sequential(nn.Conv2d(width, width, 3, padding=1, bias=False),
                                                        nn.BatchNorm2d(width), nn.ReLU()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.trunk(self.stem(x))


def planted_lowering() -> ModelCase:
    torch.manual_seed(29)
    model = HyphenatedStage().eval()
    norm = model.trunk.get_submodule("block1-0")[1]
    with torch.no_grad():  # batch statistics of their own, so that the fold is not the identity
        norm.running_mean.uniform_(-0.5, 0.5), norm.running_var.uniform_(0.5, 1.5)
    return ModelCase(model, (torch.randn(1, 3, 16, 16),))


class Conv1D(nn.Module):
    """GPT-2's Conv1D (transformers.pytorch_utils): a linear layer whose weight is stored transposed and applied
    with ``addmm``. It is no ``nn.Linear``, so a recipe that quantizes linears takes none of it."""

    def __init__(self, outputs: int, inputs: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(inputs, outputs) * 0.1)
        self.bias = nn.Parameter(torch.zeros(outputs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).reshape(*x.shape[:-1], -1)


class ConvOneDimensional(nn.Module):
    """An attention block's projections as GPT-2 writes them: int8-dynamic quantizes nothing of it."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.c_attn, self.c_proj = Conv1D(3 * width, width), Conv1D(width, 3 * width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(torch.relu(self.c_attn(x)))


def planted_unquantized() -> ModelCase:
    torch.manual_seed(31)
    return ModelCase(ConvOneDimensional().eval(), (torch.randn(2, 8, 16),))
