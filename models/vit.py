"""ViT image encoders written with plain ops both exporters handle.

Attention is spelled out (matmul → softmax → matmul) rather than calling
scaled_dot_product_attention, so the same graph reaches TorchScript and
torch.export in both torch versions.
"""

from __future__ import annotations

import torch
from torch import nn

from models.case import ModelCase


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


class Block(nn.Module):
    def __init__(self, width: int, heads: int, mlp_ratio: int = 4) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width, eps=1e-6)
        self.attn = Attention(width, heads)
        self.norm2 = nn.LayerNorm(width, eps=1e-6)
        self.mlp = nn.Sequential(
            nn.Linear(width, mlp_ratio * width), nn.GELU(), nn.Linear(mlp_ratio * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


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


def vit_ti16() -> ModelCase:
    """PE-Core-T16-like encoder: ViT-Ti/16, 224×224, width 192, depth 12, 3 heads."""
    model = VisionTransformer(image_size=224, patch=16, width=192, depth=12, heads=3, embed_dim=512)
    return ModelCase(model.eval(), (torch.randn(1, 3, 224, 224),))


def vit_smoke() -> ModelCase:
    """A two-block ViT on 32×32 images: the same code path in seconds, for tests."""
    model = VisionTransformer(image_size=32, patch=8, width=64, depth=2, heads=2, embed_dim=32)
    return ModelCase(model.eval(), (torch.randn(1, 3, 32, 32),))
