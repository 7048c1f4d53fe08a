"""ViT image encoders written with plain ops both exporters handle.

Attention is spelled out (matmul → softmax → matmul) rather than calling
scaled_dot_product_attention, so the same graph reaches TorchScript and
torch.export in both torch versions.

Two layouts: ``VisionTransformer`` (class token, pre-norm blocks, linear head;
PE-Core-like) and ``RegisterViT`` (class token + register tokens, LayerScale,
no head; DINOv2/Franca-like). All weights are random: the first stack saves
them as fixtures.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from . import assets
from .case import ModelCase, Task


class Attention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.scale = (width // heads) ** -0.5
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, width = x.shape
        qkv = self.qkv(x).reshape(batch, tokens, 3, self.heads, width // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        weights = torch.softmax((q * self.scale) @ k.transpose(-2, -1), dim=-1)
        return self.proj((weights @ v).transpose(1, 2).reshape(batch, tokens, width))


class LayerScale(nn.Module):
    """Per-channel scale on a residual branch (CaiT, DINOv2)."""

    def __init__(self, width: int, init: float) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.full((width,), init))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class Block(nn.Module):
    """Pre-norm block; with ``layer_scale`` each residual branch is scaled per channel."""

    def __init__(self, width: int, heads: int, mlp_ratio: int = 4, layer_scale: float | None = None) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width, eps=1e-6)
        self.attn = Attention(width, heads)
        self.norm2 = nn.LayerNorm(width, eps=1e-6)
        self.mlp = nn.Sequential(
            nn.Linear(width, mlp_ratio * width), nn.GELU(), nn.Linear(mlp_ratio * width, width)
        )
        # Identity has no parameters, so blocks without LayerScale keep their state_dict keys.
        self.ls1 = LayerScale(width, layer_scale) if layer_scale is not None else nn.Identity()
        self.ls2 = LayerScale(width, layer_scale) if layer_scale is not None else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.ls1(self.attn(self.norm1(x)))
        return x + self.ls2(self.mlp(self.norm2(x)))


class VisionTransformer(nn.Module):
    """Patch embedding → class token + learned positions → blocks → pooled embedding."""

    def __init__(
        self, image_size: int, patch: int, width: int, depth: int, heads: int, embed_dim: int
    ) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(3, width, kernel_size=patch, stride=patch)
        tokens = (image_size // patch) ** 2 + 1
        self.cls_token = nn.Parameter(torch.randn(1, 1, width) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, tokens, width) * 0.02)
        self.blocks = nn.Sequential(*(Block(width, heads) for _ in range(depth)))
        self.norm = nn.LayerNorm(width, eps=1e-6)
        self.head = nn.Linear(width, embed_dim)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(pixels).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        x = self.norm(self.blocks(x))
        return self.head(x[:, 0])


class RegisterViT(nn.Module):
    """DINOv2/Franca layout: patch embedding → [class, registers, patches] → LayerScale blocks → norm.

    The output is the normalized class token concatenated with the mean of the
    normalized patch tokens, [batch, 2 × width]: the features DINOv2's linear
    probes read. Registers get no position embedding and are dropped at the end,
    as in DINOv2. The position table covers exactly the patch grid at
    ``image_size``, so no interpolation is exported.
    """

    def __init__(
        self, image_size: int, patch: int, width: int, depth: int, heads: int, registers: int = 4
    ) -> None:
        super().__init__()
        self.registers = registers
        self.patch_embed = nn.Conv2d(3, width, kernel_size=patch, stride=patch)
        self.cls_token = nn.Parameter(torch.randn(1, 1, width) * 0.02)
        self.register_tokens = nn.Parameter(torch.randn(1, registers, width) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, (image_size // patch) ** 2 + 1, width) * 0.02)
        # DINOv2 trains from a LayerScale of 1e-5; with random weights that would
        # hide every block behind the patch embedding, so start at a trained-like 0.1.
        self.blocks = nn.Sequential(*(Block(width, heads, layer_scale=0.1) for _ in range(depth)))
        self.norm = nn.LayerNorm(width, eps=1e-6)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        batch = pixels.shape[0]
        x = self.patch_embed(pixels).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(batch, -1, -1), x], dim=1) + self.pos_embed
        x = torch.cat([x[:, :1], self.register_tokens.expand(batch, -1, -1), x[:, 1:]], dim=1)
        x = self.norm(self.blocks(x))
        return torch.cat([x[:, 0], x[:, 1 + self.registers :].mean(dim=1)], dim=-1)


def imagenet_photos() -> torch.Tensor:
    """The assets' three photos, 224×224, ImageNet mean/std: [3, 3, 224, 224] float32."""
    return torch.from_numpy(np.load(assets.path("photos", "imagenet-224.npy")))


def vit_ti16() -> ModelCase:
    """PE-Core-T16-like encoder: ViT-Ti/16, 224×224, width 192, depth 12, 3 heads, on three photos."""
    model = VisionTransformer(image_size=224, patch=16, width=192, depth=12, heads=3, embed_dim=512)
    return ModelCase(model.eval(), (imagenet_photos(),), task=Task(kind="embedding"))


def vit_s14() -> ModelCase:
    """Franca/DINOv2-like ViT-S/14 with 4 registers: 224×224 (16×16 patches), width 384, depth 12, 6 heads."""
    model = RegisterViT(image_size=224, patch=14, width=384, depth=12, heads=6)
    return ModelCase(model.eval(), (imagenet_photos(),), task=Task(kind="embedding"))


def vit_b14() -> ModelCase:
    """Franca/DINOv2-like ViT-B/14 with 4 registers: 224×224, width 768, depth 12, 12 heads."""
    model = RegisterViT(image_size=224, patch=14, width=768, depth=12, heads=12)
    return ModelCase(model.eval(), (imagenet_photos(),), task=Task(kind="embedding"))


def vit_smoke() -> ModelCase:
    """A two-block ViT on 32×32 images: the same code path in seconds, for tests."""
    model = VisionTransformer(image_size=32, patch=8, width=64, depth=2, heads=2, embed_dim=32)
    return ModelCase(model.eval(), (torch.randn(1, 3, 32, 32),))
