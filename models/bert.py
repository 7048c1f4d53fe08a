"""A BERT sentence encoder (all-MiniLM-L6-v2) written with plain ops both exporters handle.

Same computation as Hugging Face's BertModel followed by sentence-transformers'
mean pooling and L2 normalization. Attention is spelled out (matmul → softmax →
matmul) rather than calling scaled_dot_product_attention, so one graph reaches
TorchScript (torch 2.2) and torch.export (torch 2.8).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional

from . import assets
from .case import ModelCase, Task


@dataclass(frozen=True)
class BertConfig:
    """The fields of a Hugging Face BERT config.json this encoder uses (hidden_act is erf GELU)."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float


class Embeddings(nn.Module):
    """Word + absolute position + token type, then LayerNorm."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.word = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        # Positions are 0..length-1 for every sequence: a slice of the table
        # rather than an arange, so no index tensor is built at run time.
        positions = self.position.weight[: input_ids.shape[1]]
        return self.norm(self.word(input_ids) + self.token_type(token_type_ids) + positions)


class SelfAttention(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.heads = config.num_attention_heads
        self.scale = (config.hidden_size // self.heads) ** -0.5
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.out = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:
        batch, length, width = hidden.shape

        def heads(x: torch.Tensor) -> torch.Tensor:
            return x.reshape(batch, length, self.heads, width // self.heads).transpose(1, 2)

        query, key, value = heads(self.query(hidden)), heads(self.key(hidden)), heads(self.value(hidden))
        scores = (query @ key.transpose(-2, -1)) * self.scale + additive_mask
        context = torch.softmax(scores, dim=-1) @ value
        return self.out(context.transpose(1, 2).reshape(batch, length, width))


class Layer(nn.Module):
    """Post-norm transformer layer, as in BERT: x = norm(x + sublayer(x))."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.attention = SelfAttention(config)
        self.attention_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.intermediate = nn.Linear(config.hidden_size, config.intermediate_size)
        self.output = nn.Linear(config.intermediate_size, config.hidden_size)
        self.output_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        # Hugging Face's "gelu" is the exact (erf) form, not the tanh approximation.
        self.activation = nn.GELU(approximate="none")

    def forward(self, hidden: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.attention_norm(hidden + self.attention(hidden, additive_mask))
        return self.output_norm(hidden + self.output(self.activation(self.intermediate(hidden))))


class BertEncoder(nn.Module):
    """Token ids → one L2-normalized embedding per sequence (mean of its unpadded tokens)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList(Layer(config) for _ in range(config.num_hidden_layers))

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor:
        mask = attention_mask.to(torch.float32)
        # Padded keys get the most negative float, as in Hugging Face: softmax
        # gives them exactly zero weight. Every row keeps [CLS], so none is all -inf.
        additive_mask = (1.0 - mask[:, None, None, :]) * torch.finfo(torch.float32).min
        hidden = self.embeddings(input_ids, token_type_ids)
        for layer in self.layers:
            hidden = layer(hidden, additive_mask)
        # sentence-transformers' Pooling(mean) then Normalize.
        token_weights = mask.unsqueeze(-1)
        pooled = (hidden * token_weights).sum(dim=1) / token_weights.sum(dim=1).clamp(min=1e-9)
        return functional.normalize(pooled, p=2.0, dim=1)


def minilm_l6() -> ModelCase:
    """all-MiniLM-L6-v2 (6 layers, width 384, 12 heads) on the assets' eight sentences, padded to 32 tokens."""
    config = BertConfig(**assets.read_json("minilm", "config.json"))
    model = BertEncoder(config)
    model.load_state_dict(assets.read_npz("minilm", "weights.npz"), strict=True)
    sentences = assets.read_json("minilm", "sentences.json")
    inputs = tuple(
        torch.tensor(sentences[name], dtype=torch.int64)
        for name in ("input_ids", "attention_mask", "token_type_ids")
    )
    return ModelCase(model.eval(), inputs, task=Task(kind="embedding"), weights="deterministic")


def minilm_smoke() -> ModelCase:
    """A two-layer BERT of width 32 on two 8-token sequences (one padded): the same code path, for tests."""
    config = BertConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=16,
        type_vocab_size=2,
        layer_norm_eps=1e-12,
    )
    model = BertEncoder(config)
    rng = np.random.default_rng(0)
    model.load_state_dict(numpy_random_state(model, rng), strict=True)
    input_ids = rng.integers(1, config.vocab_size, size=(2, 8))
    attention_mask = np.ones((2, 8), dtype=np.int64)
    attention_mask[1, 5:] = 0
    input_ids[attention_mask == 0] = 0
    token_type_ids = np.zeros((2, 8), dtype=np.int64)
    token_type_ids[0, 4:] = 1
    inputs = tuple(torch.from_numpy(array.astype(np.int64)) for array in (input_ids, attention_mask, token_type_ids))
    return ModelCase(model.eval(), inputs, task=Task(kind="embedding"), weights="deterministic")


def numpy_random_state(module: nn.Module, rng: np.random.Generator) -> dict[str, torch.Tensor]:
    """Random weights drawn by numpy, so every torch version builds the same module.

    LayerNorm scales are drawn around 1 and the rest scaled by 1/sqrt(last dim),
    so activations stay O(1) and every layer moves the output.
    """
    state = {}
    for name, tensor in module.state_dict().items():
        shape = tuple(tensor.shape)
        owner, _, kind = name.rpartition(".")
        if owner.endswith("norm"):
            values = (1.0 if kind == "weight" else 0.0) + 0.1 * rng.standard_normal(shape)
        else:
            values = rng.standard_normal(shape) / np.sqrt(shape[-1])
        state[name] = torch.from_numpy(values.astype(np.float32))
    return state
