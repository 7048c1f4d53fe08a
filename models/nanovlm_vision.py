"""nanoVLM's eyes: a SigLIP-like ViT encoder and the modality projector that turns its patches into
the language model's image tokens (models/nanovlm.py puts them in front of SmolLM2)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class VisionConfig:
    """A SigLIP-like ViT and nanoVLM's projector behind it."""

    image_size: int
    patch: int
    width: int
    depth: int
    heads: int
    mlp_dim: int
    # nanoVLM's mp_pixel_shuffle_factor: 2×2 (or 4×4) neighbouring patches become one token.
    shuffle: int
    norm_eps: float = 1e-6

    @property
    def grid(self) -> int:
        return self.image_size // self.patch

    @property
    def image_tokens(self) -> int:
        return (self.grid // self.shuffle) ** 2

    def __post_init__(self) -> None:
        if self.image_size % self.patch or self.grid % self.shuffle or self.width % self.heads:
            raise ValueError(
                f"{self!r}: image_size must be a multiple of patch, the patch grid a multiple of "
                "shuffle, width a multiple of heads"
            )


# -- vision encoder --------------------------------------------------------------


class LayerNorm(nn.Module):
    """nn.LayerNorm's numbers, with both means taken as a matmul by a 1/width row.

    executorch 0.7's XNNPACK partitioner takes neither native_layer_norm nor a
    mean over the last dim of a 3D tensor; each op it leaves out splits the
    graph into one more delegate partition (models/llama.py's RMSNorm does the
    same). With nn.LayerNorm the default encoder lowered to 56 partitions and
    took 165 s to export here.
    """

    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width))
        self.bias = nn.Parameter(torch.zeros(width))
        self.register_buffer("averager", torch.full((1, width), 1.0 / width), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        centered = x - F.linear(x, self.averager)
        variance = F.linear(centered * centered, self.averager)
        return centered * torch.rsqrt(variance + self.eps) * self.weight + self.bias


class Attention(nn.Module):
    """Fused qkv projection, as in nanoVLM's ViTMultiHeadAttention; softmax spelled out.

    Heads are sliced out of the projection and attended one by one with 3D bmm,
    like models/llama.py: XNNPACK (executorch 0.7) delegates slice, bmm,
    permute and cat, but not the view_copy and expand_copy that batched 4D
    heads lower to.
    """

    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.heads = config.heads
        self.width = config.width
        self.head_dim = config.width // config.heads
        self.qkv = nn.Linear(config.width, 3 * config.width)
        self.out = nn.Linear(config.width, config.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv(x)
        scale = self.head_dim**-0.5
        outputs = []
        for head in range(self.heads):
            start = head * self.head_dim
            q = qkv[:, :, start : start + self.head_dim] * scale
            k = qkv[:, :, self.width + start : self.width + start + self.head_dim]
            v = qkv[:, :, 2 * self.width + start : 2 * self.width + start + self.head_dim]
            weights = torch.softmax(torch.bmm(q, k.transpose(1, 2)), dim=-1)
            outputs.append(torch.bmm(weights, v))
        return self.out(torch.cat(outputs, dim=-1))


class Block(nn.Module):
    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.ln1 = LayerNorm(config.width, config.norm_eps)
        self.attn = Attention(config)
        self.ln2 = LayerNorm(config.width, config.norm_eps)
        self.fc1 = nn.Linear(config.width, config.mlp_dim)
        # SigLIP's hidden_act is gelu_pytorch_tanh. ExecuTorch 0.7's XNNPACK
        # delegate drops `approximate` and runs the exact (erf) GELU, up to
        # 4.7e-4 away per element (fixed upstream by pytorch/executorch#22851,
        # which routes tanh to XNNPACK's approxgelu). Kept: that is what the
        # candidate stack does to a SigLIP encoder, and the gate should see it.
        self.act = nn.GELU(approximate="tanh")
        self.fc2 = nn.Linear(config.mlp_dim, config.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(self.act(self.fc1(self.ln2(x))))


class VisionEncoder(nn.Module):
    """pixels [1, 3, S, S] → patch tokens [1, (S/patch)², width]."""

    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(3, config.width, kernel_size=config.patch, stride=config.patch)
        self.pos_embed = nn.Parameter(torch.zeros(1, config.grid * config.grid, config.width))
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.depth))
        self.ln = LayerNorm(config.width, config.norm_eps)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        patches = self.patch_embed(pixels).flatten(2).transpose(1, 2)
        # The contiguous operand first: an elementwise result takes the layout of
        # its first operand when they differ (torch 2.2 and 2.8 alike). With the
        # transposed view first, its strides would reach the eager output, and
        # ExecuTorch refuses a non-contiguous input when the projector gets it;
        # .contiguous() would cost a portable clone and one more partition.
        x = self.pos_embed + patches
        for block in self.blocks:
            x = block(x)
        return self.ln(x)


class ModalityProjector(nn.Module):
    """patch tokens [1, grid², width] → image tokens [1, (grid/shuffle)², dim]."""

    def __init__(self, config: VisionConfig, dim: int) -> None:
        super().__init__()
        # Python ints from the config, not from x.shape: a traced graph keeps
        # them as constants either way, and torch.export sees no symbolic math.
        self.grid = config.grid
        self.shuffle = config.shuffle
        self.proj = nn.Linear(config.width * config.shuffle**2, dim, bias=False)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        batch, _, width = patches.shape
        cells, factor = self.grid // self.shuffle, self.shuffle
        # nanoVLM's pixel_shuffle: [B, H, W, C] → [B, H/f, f, W/f, f, C] → [B, H/f, W/f, f, f, C].
        x = patches.reshape(batch, cells, factor, cells, factor, width)
        x = x.permute(0, 1, 3, 2, 4, 5).reshape(batch, cells * cells, factor * factor * width)
        return self.proj(x)
