"""Llama-family decoders (SmolLM2, Llama 3.2 shapes) written for both exporters.

Every op is one TorchScript tracing and torch.export both handle in torch 2.2
and 2.8: attention is spelled out (no scaled_dot_product_attention), RoPE is
real cos/sin arithmetic (no complex numbers), and the KV cache is a pair of
plain tensors passed in and returned, never a buffer. Prefill and decode are
exported as separate programs, and separate programs cannot share buffers; the
caller carries the cache from one call to the next.

Cache layout: ``[n_layers, 1, n_kv_heads, max_seq_len, head_dim]`` for k and
for v. Prefill writes positions ``0..prefill_len-1`` (padding included); decode
at position ``p`` overwrites slot ``p`` before attending to slots ``0..p``, so
padding written by prefill is never read.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from . import assets
from .case import Method, ModelCase, Task

Call = Callable[..., list[torch.Tensor]]


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    hidden_dim: int
    norm_eps: float
    rope_theta: float
    # Length of the static KV cache: the prompt window plus the generated tokens.
    max_seq_len: int
    # Static prompt window of Prefill: prompts are right-padded to it.
    prefill_len: int
    tie_embeddings: bool = True

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def __post_init__(self) -> None:
        if self.dim % self.n_heads or self.n_heads % self.n_kv_heads or self.head_dim % 2:
            raise ValueError(f"{self}: dim must split into an even head_dim, and heads into kv groups")
        # Prefill keeps the cache tail with a slice; an empty tail is an empty
        # tensor, which not every backend accepts.
        if self.prefill_len >= self.max_seq_len:
            raise ValueError(f"prefill_len {self.prefill_len} leaves no room in max_seq_len {self.max_seq_len}")


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class Attention(nn.Module):
    """Grouped-query attention over a static cache, with RoPE in Hugging Face's rotate_half layout."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.n_kv_heads = config.n_kv_heads
        self.head_dim = config.head_dim
        self.wq = nn.Linear(config.dim, config.n_heads * config.head_dim, bias=False)
        self.wk = nn.Linear(config.dim, config.n_kv_heads * config.head_dim, bias=False)
        self.wv = nn.Linear(config.dim, config.n_kv_heads * config.head_dim, bias=False)
        self.wo = nn.Linear(config.n_heads * config.head_dim, config.dim, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        bias: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [1,T,dim]; cos/sin [T,head_dim]; bias [T,keys] (0 or -inf); caches [1,kv_heads,S,head_dim].

        ``slot`` is None for prefill (the T new keys fill slots 0..T-1 and are
        the only keys attended to) or, for decode, a [1,1,S,1] mask of the one
        slot to overwrite (all S slots are attended to, bias hides the future).
        """
        tokens = x.shape[1]
        q = self.wq(x).view(1, tokens, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(1, tokens, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(1, tokens, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin

        if slot is None:
            k_cache = torch.cat((k, k_cache[:, :, tokens:]), dim=2)
            v_cache = torch.cat((v, v_cache[:, :, tokens:]), dim=2)
            keys, values = k, v
        else:
            k_cache = torch.where(slot, k, k_cache)
            v_cache = torch.where(slot, v, v_cache)
            keys, values = k_cache, v_cache

        # Query heads h*group..h*group+group-1 share kv head h (HF's repeat_kv):
        # fold the group into the query rows instead of copying k and v.
        group = self.n_heads // self.n_kv_heads
        q = q.reshape(1, self.n_kv_heads, group * tokens, self.head_dim)
        scores = (q @ keys.transpose(-2, -1)) * (self.head_dim**-0.5)
        scores = scores.view(1, self.n_kv_heads, group, tokens, -1) + bias
        weights = torch.softmax(scores, dim=-1).view(1, self.n_kv_heads, group * tokens, -1)
        out = (weights @ values).view(1, self.n_heads, tokens, self.head_dim)
        return self.wo(out.transpose(1, 2).reshape(1, tokens, -1)), k_cache, v_cache


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(config.dim, config.norm_eps)
        self.attention = Attention(config)
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps)
        self.feed_forward = FeedForward(config.dim, config.hidden_dim)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        bias: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        attended, k_cache, v_cache = self.attention(self.attention_norm(x), cos, sin, bias, k_cache, v_cache, slot)
        x = x + attended
        return x + self.feed_forward(self.ffn_norm(x)), k_cache, v_cache


class Llama(nn.Module):
    """The decoder. Its state_dict names are the ones models/sources/smollm2.py writes.

    With ``tie_embeddings`` the output head is ``tok_embeddings.weight`` itself,
    so the state_dict holds that matrix once.
    """

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.output = None if config.tie_embeddings else nn.Linear(config.dim, config.vocab_size, bias=False)
        self.init_rope()

    def init_rope(self) -> None:
        """(Re)build the RoPE frequencies: also needed after building the module on the meta device."""
        half = self.config.head_dim // 2
        # float64 numpy, then float32: the same bits in every torch version.
        inv_freq = 1.0 / self.config.rope_theta ** (np.arange(half, dtype=np.float64) * 2 / self.config.head_dim)
        self.register_buffer("inv_freq", torch.from_numpy(inv_freq.astype(np.float32)), persistent=False)

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [T, head_dim] for int64 positions [T]."""
        angles = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos(), angles.sin()

    def empty_cache(self) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.config
        shape = (c.n_layers, 1, c.n_kv_heads, c.max_seq_len, c.head_dim)
        return torch.zeros(shape), torch.zeros(shape)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [1,T] int64 → [1,T,dim]."""
        return self.tok_embeddings(tokens)

    def _blocks(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        bias: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        cos, sin = self.rope(positions)
        new_k, new_v = [], []
        for index, layer in enumerate(self.layers):
            x, k, v = layer(x, cos, sin, bias, k_cache[index], v_cache[index], slot)
            new_k.append(k)
            new_v.append(v)
        return x, torch.stack(new_k), torch.stack(new_v)

    def prefill_hidden(
        self, embeds: torch.Tensor, length: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """embeds [1,P,dim] (right-padded), length [1] → final-normed hidden [1,dim] of position length-1, caches.

        Writes cache slots 0..P-1. Padding sits after every real position, so
        the causal mask already keeps it out of the real positions' attention.
        """
        window = embeds.shape[1]
        positions = torch.arange(window)
        causal = positions[None, :] <= positions[:, None]
        bias = torch.zeros(window, window).masked_fill(~causal, float("-inf"))
        x, k_cache, v_cache = self._blocks(embeds, positions, bias, k_cache, v_cache, None)
        last = x.index_select(1, length - 1).view(1, -1)
        return self.norm(last), k_cache, v_cache

    def decode_hidden(
        self, embed: torch.Tensor, position: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """embed [1,1,dim] at position [1] → final-normed hidden [1,dim], caches with that slot written."""
        slots = torch.arange(self.config.max_seq_len)
        slot = (slots == position).view(1, 1, -1, 1)
        bias = torch.zeros(1, self.config.max_seq_len).masked_fill((slots > position)[None, :], float("-inf"))
        x, k_cache, v_cache = self._blocks(embed, position, bias, k_cache, v_cache, slot)
        return self.norm(x.view(1, -1)), k_cache, v_cache

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [1,dim] → logits [1,vocab]."""
        if self.output is None:
            return F.linear(hidden, self.tok_embeddings.weight)
        return self.output(hidden)


class Prefill(nn.Module):
    """tokens [1,prefill_len] int64 (right-padded), length [1] int64 → logits [1,vocab], k_cache, v_cache."""

    def __init__(self, llama: Llama) -> None:
        super().__init__()
        self.llama = llama

    def forward(self, tokens: torch.Tensor, length: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        k_cache, v_cache = self.llama.empty_cache()
        hidden, k_cache, v_cache = self.llama.prefill_hidden(self.llama.embed(tokens), length, k_cache, v_cache)
        return self.llama.lm_head(hidden), k_cache, v_cache


class Decode(nn.Module):
    """token [1,1] int64 at position [1] int64, k_cache, v_cache → logits [1,vocab], k_cache, v_cache."""

    def __init__(self, llama: Llama) -> None:
        super().__init__()
        self.llama = llama

    def forward(
        self, token: torch.Tensor, position: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        hidden, k_cache, v_cache = self.llama.decode_hidden(self.llama.embed(token), position, k_cache, v_cache)
        return self.llama.lm_head(hidden), k_cache, v_cache


def greedy_generate(
    call: Call, prompt_ids: Sequence[int], *, prefill_len: int, max_new_tokens: int, eos_id: int | None
) -> tuple[list[int], torch.Tensor]:
    """Greedy decoding through ``call("prefill", …)`` and ``call("decode", …)``.

    Returns the new tokens and the logits each was picked from, [steps, vocab].
    Stops after ``eos_id`` (included); ``eos_id=None`` always runs
    ``max_new_tokens`` steps.
    """
    length = len(prompt_ids)
    if not 0 < length <= prefill_len:
        raise ValueError(f"a prompt of {length} tokens does not fit the prefill window of {prefill_len}")
    # Padding id 0 is arbitrary: padded positions come after every real one.
    padded = torch.tensor([list(prompt_ids) + [0] * (prefill_len - length)], dtype=torch.int64)
    logits, k_cache, v_cache = call("prefill", padded, torch.tensor([length], dtype=torch.int64))
    tokens: list[int] = []
    step_logits: list[torch.Tensor] = []
    for step in range(max_new_tokens):
        # Copies: a runtime may hand back views of memory its next call reuses.
        step_logits.append(logits.detach().reshape(-1).clone())
        token = int(step_logits[-1].argmax())
        tokens.append(token)
        if token == eos_id or step == max_new_tokens - 1:
            break
        logits, k_cache, v_cache = call(
            "decode",
            torch.tensor([[token]], dtype=torch.int64),
            torch.tensor([length + step], dtype=torch.int64),
            k_cache.clone(),
            v_cache.clone(),
        )
    return tokens, torch.stack(step_logits)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte → printable character table, the alphabet of byte-level BPE tokens."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {byte: chr(byte) for byte in printable}
    for extra, byte in enumerate(b for b in range(256) if b not in table):
        table[byte] = chr(256 + extra)
    return table


_UNICODE_TO_BYTE = {char: byte for byte, char in bytes_to_unicode().items()}


def decode_text(vocab: Sequence[str], ids: Sequence[int]) -> str:
    """Byte-level BPE ids → text; bytes that are not valid UTF-8 become U+FFFD."""
    spelled = "".join(vocab[index] for index in ids)
    return bytes(_UNICODE_TO_BYTE[char] for char in spelled).decode("utf-8", errors="replace")


# --- factories -----------------------------------------------------------------------------------


def _materialize(config: LlamaConfig, weights: Callable[[str, tuple[int, ...]], torch.Tensor]) -> Llama:
    """A Llama whose every parameter is ``weights(name, shape)``, without a throwaway random init.

    The module is built on the meta device, so a 1B model is allocated once,
    by ``weights``, and not first by nn.Linear's own initialisation.
    """
    with torch.device("meta"):
        model = Llama(config)
    state = {name: weights(name, tuple(tensor.shape)) for name, tensor in model.state_dict().items()}
    model.load_state_dict(state, strict=True, assign=True)
    model.init_rope()
    return model.eval()


def _numpy_weights(seed: int) -> Callable[[str, tuple[int, ...]], torch.Tensor]:
    """Random weights from numpy's generator, drawn tensor by tensor in state_dict order.

    numpy, not torch: two torch versions need not draw the same numbers from
    one seed, numpy's Generator does. Norm gains are 1; everything else is
    N(0, 0.02²), Llama's initialiser scale.
    """
    rng = np.random.default_rng(seed)

    def draw(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        if name.endswith("norm.weight"):
            return torch.ones(shape)
        array = rng.standard_normal(shape, dtype=np.float32)
        array *= 0.02
        return torch.from_numpy(array)

    return draw


def _generation_case(
    model: Llama,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    eos_id: int | None,
    vocab: Sequence[str] | None,
) -> ModelCase:
    """Prefill and decode methods, and a drive that generates greedily for every prompt."""
    config = model.config
    k_cache, v_cache = model.empty_cache()
    methods = {
        "prefill": Method(
            Prefill(model).eval(),
            (torch.zeros(1, config.prefill_len, dtype=torch.int64), torch.tensor([len(prompts[0])])),
        ),
        "decode": Method(
            Decode(model).eval(),
            (torch.zeros(1, 1, dtype=torch.int64), torch.tensor([len(prompts[0])]), k_cache, v_cache),
        ),
    }

    def drive(call: Call) -> dict[str, Any]:
        # Every prompt runs all max_new_tokens steps, past eos too, so
        # step_logits stacks into one [prompts, steps, vocab] tensor and the
        # stacks are compared on the same number of steps; "text" stops at eos.
        all_tokens, all_text, all_logits = [], [], []
        for prompt in prompts:
            tokens, step_logits = greedy_generate(
                call, prompt, prefill_len=config.prefill_len, max_new_tokens=max_new_tokens, eos_id=None
            )
            shown = tokens[: tokens.index(eos_id)] if eos_id in tokens else tokens
            all_tokens.append(tokens)
            all_text.append(decode_text(vocab, shown) if vocab is not None else " ".join(map(str, shown)))
            all_logits.append(step_logits)
        return {"tokens": all_tokens, "text": all_text, "step_logits": torch.stack(all_logits)}

    return ModelCase(model, methods=methods, task=Task(kind="generation", drive=drive), weights="deterministic")


def _cache_length(prefill_len: int, max_new_tokens: int) -> int:
    # Whole multiples of 32 keep the cache's shape a friendly size for kernels.
    return math.ceil((prefill_len + max_new_tokens) / 32) * 32


# Random-weight models are prompted with fixed id lists: no tokenizer, no assets.
RANDOM_PROMPTS = ((1, 17, 42, 7, 99), (1, 3, 5, 8, 13, 21, 34), (1, 200, 100, 50))


def smollm2_135m() -> ModelCase:
    """SmolLM2-135M-Instruct (real weights, dequantized from Q4_1), 3 chat prompts, 32 greedy tokens."""
    prefill_len, max_new_tokens = 64, 32
    raw = assets.read_json("smollm2", "config.json")
    names = {f.name for f in dataclasses.fields(LlamaConfig)}
    config = LlamaConfig(**{key: value for key, value in raw.items() if key in names})
    # config.json carries the trained context (8192); the export needs only this much.
    config = dataclasses.replace(
        config, prefill_len=prefill_len, max_seq_len=_cache_length(prefill_len, max_new_tokens)
    )
    tensors = assets.read_npz("smollm2", "weights.npz")
    model = _materialize(config, lambda name, shape: tensors.pop(name))
    prompts = [prompt["ids"] for prompt in assets.read_json("smollm2", "prompts.json")]
    return _generation_case(
        model,
        prompts,
        max_new_tokens=max_new_tokens,
        eos_id=raw["eos_id"],
        vocab=assets.read_json("smollm2", "vocab.json"),
    )


def llama_smoke() -> ModelCase:
    """Two tiny layers with numpy-random weights: the generation path in seconds, for tests."""
    prefill_len, max_new_tokens = 16, 8
    config = LlamaConfig(
        vocab_size=512,
        dim=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        hidden_dim=128,
        norm_eps=1e-5,
        rope_theta=10000.0,
        max_seq_len=_cache_length(prefill_len, max_new_tokens),
        prefill_len=prefill_len,
    )
    model = _materialize(config, _numpy_weights(seed=0))
    return _generation_case(model, RANDOM_PROMPTS, max_new_tokens=max_new_tokens, eos_id=None, vocab=None)


def llama32_1b_dims() -> ModelCase:
    """Llama 3.2 1B's shapes with numpy-random float32 weights (~5 GB): export time, RSS and size.

    Llama 3.2 scales its RoPE frequencies for long contexts ("llama3" rope_scaling);
    that changes numbers, not the graph, and random weights make the numbers
    meaningless anyway, so plain RoPE is used.
    """
    prefill_len, max_new_tokens = 16, 4
    config = LlamaConfig(
        vocab_size=128256,
        dim=2048,
        n_layers=16,
        n_heads=32,
        n_kv_heads=8,
        hidden_dim=8192,
        norm_eps=1e-5,
        rope_theta=500000.0,
        max_seq_len=_cache_length(prefill_len, max_new_tokens),
        prefill_len=prefill_len,
    )
    model = _materialize(config, _numpy_weights(seed=0))
    return _generation_case(model, RANDOM_PROMPTS, max_new_tokens=max_new_tokens, eos_id=None, vocab=None)
