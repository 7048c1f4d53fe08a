"""Llama-family decoders (SmolLM2, Llama 3.2 shapes) written for both exporters.

Every op is one TorchScript tracing and torch.export both handle in torch 2.2
and 2.8: attention is spelled out (no scaled_dot_product_attention), RoPE is
real cos/sin arithmetic (no complex numbers), and the KV cache is a pair of
plain tensors passed in and returned, never a buffer. Prefill and decode are
exported as separate programs, and separate programs cannot share buffers; the
caller carries the cache from one call to the next.

The ops are also chosen for executorch 0.7's XNNPACK partitioner, which takes
no view_copy, expand, select, where or last-dim mean: each such op between two
ops it takes splits the graph into one more delegate partition, and lowering
costs ~0.5 s per partition on this machine (XNNPACK's preprocessing re-traces
every partition). Heads are the batch dimension of 3-D bmm calls, RMSNorm's
mean is a Linear and the decode cache update is arithmetic, which leaves each
layer's views at the head split and merge — for decode's single token, plain
views with nothing between them (docs/benchmarks.md has the measured effect).

Cache layout: ``[n_layers, n_kv_heads, max_seq_len, head_dim]`` for k and
for v. Prefill writes positions ``0..prefill_len-1`` (padding included); decode
at position ``p`` overwrites slot ``p`` before attending to slots ``0..p``, so
padding written by prefill is never read.

One module for the family on purpose (over 500 lines): the shapes, the cache layout and the
split into programs are read together.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from . import assets
from .case import Call, Method, ModelCase, Task
from .decoding import decode_text, greedy_generate


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


def bias_free_linear(in_features: int, out_features: int) -> nn.Linear:
    """A real nn.Linear — the quantizers that swap modules (quantize_dynamic,
    torchao's quantize_) look for that type — without bias or initialisation:
    every factory loads all weights, and nn.Linear's random init of a 1B model
    costs seconds."""
    return nn.utils.skip_init(nn.Linear, in_features, out_features, bias=False)


class Embedding(nn.Module):
    """nn.Embedding without initialisation (see bias_free_linear)."""

    def __init__(self, vocab_size: int, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, dim))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return F.embedding(tokens, self.weight)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        # The mean of squares as a 1-output Linear: XNNPACK takes a Linear but not
        # a mean over the last dim, and every op it refuses splits a delegate.
        self.register_buffer("averager", torch.full((1, dim), 1.0 / dim), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(F.linear(x * x, self.averager) + self.eps) * self.weight


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    # Slices rather than chunk: XNNPACK delegates slice_copy, not split_with_sizes_copy.
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    """Grouped-query attention over a static cache, with RoPE in Hugging Face's rotate_half layout.

    Heads are the batch dimension of 3-D bmm calls: a 4-D matmul decomposes
    into expand and view ops, which XNNPACK does not take, and each op it
    refuses between two it takes starts another delegate partition. Lowering
    time grows with the partitions (~0.5 s each here), so the layer keeps its
    views at two places: the head split after the q/k/v projections and the
    head merge before the output projection.
    """

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.n_kv_heads = config.n_kv_heads
        self.head_dim = config.head_dim
        self.wq = bias_free_linear(config.dim, config.n_heads * config.head_dim)
        self.wk = bias_free_linear(config.dim, config.n_kv_heads * config.head_dim)
        self.wv = bias_free_linear(config.dim, config.n_kv_heads * config.head_dim)
        self.wo = bias_free_linear(config.n_heads * config.head_dim, config.dim)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        bias: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        update: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [1,T,dim]; cos/sin [T,head_dim]; bias [group*T, keys] (0 or -inf); caches [kv_heads,S,head_dim].

        ``update`` is None for prefill (the T new keys fill slots 0..T-1 and are
        the only keys attended to) or, for decode, a [1,S,1] float mask, 1 at
        the slot to overwrite (all S slots are attended to, bias hides the future).
        """
        tokens = x.shape[1]
        group = self.n_heads // self.n_kv_heads
        if tokens == 1:
            # Decode: with one token the head-major layouts are plain views of
            # the projections; no permute sits between two views, which would
            # be a delegate partition of its own.
            q = self.wq(x).view(self.n_kv_heads, group, self.head_dim)
            k = self.wk(x).view(self.n_kv_heads, 1, self.head_dim)
            v = self.wv(x).view(self.n_kv_heads, 1, self.head_dim)
        else:
            q = self.wq(x).view(tokens, self.n_heads, self.head_dim).transpose(0, 1)
            k = self.wk(x).view(tokens, self.n_kv_heads, self.head_dim).transpose(0, 1)
            v = self.wv(x).view(tokens, self.n_kv_heads, self.head_dim).transpose(0, 1)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin

        if update is None:
            k_cache = torch.cat((k, k_cache[:, tokens:]), dim=1)
            v_cache = torch.cat((v, v_cache[:, tokens:]), dim=1)
            keys, values = k, v
        else:
            # Arithmetic, not torch.where (which XNNPACK does not take); exact,
            # as the mask is 0 or 1 and the cache finite.
            k_cache = k_cache * (1.0 - update) + k * update
            v_cache = v_cache * (1.0 - update) + v * update
            keys, values = k_cache, v_cache

        # Query heads h*group..h*group+group-1 share kv head h (HF's repeat_kv):
        # fold the group into the query rows instead of copying k and v.
        q = q.reshape(self.n_kv_heads, group * tokens, self.head_dim)
        scores = torch.bmm(q, keys.transpose(1, 2)) * (self.head_dim**-0.5) + bias
        out = torch.bmm(torch.softmax(scores, dim=-1), values)
        if tokens == 1:
            out = out.view(1, 1, -1)
        else:
            out = out.view(self.n_heads, tokens, self.head_dim).transpose(0, 1).reshape(1, tokens, -1)
        return self.wo(out), k_cache, v_cache


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.w1 = bias_free_linear(dim, hidden_dim)
        self.w2 = bias_free_linear(hidden_dim, dim)
        self.w3 = bias_free_linear(dim, hidden_dim)

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
        update: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        attended, k_cache, v_cache = self.attention(self.attention_norm(x), cos, sin, bias, k_cache, v_cache, update)
        x = x + attended
        return x + self.feed_forward(self.ffn_norm(x)), k_cache, v_cache


class Llama(nn.Module):
    """The decoder. Its state_dict names are the ones models/sources/smollm2.py writes.

    With ``tie_embeddings`` the output head is ``tok_embeddings.weight`` itself,
    so the state_dict holds that matrix once. Weights start uninitialised:
    load them all (``load_state_dict(..., assign=True)`` avoids a copy).
    """

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_embeddings = Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.output = None if config.tie_embeddings else bias_free_linear(config.dim, config.vocab_size)
        # float64 numpy, then float32: the same bits in every torch version.
        exponents = np.arange(config.head_dim // 2, dtype=np.float64) * 2 / config.head_dim
        inv_freq = (1.0 / config.rope_theta**exponents).astype(np.float32)
        self.register_buffer("inv_freq", torch.from_numpy(inv_freq), persistent=False)

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [T, head_dim] for int64 positions [T]."""
        angles = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos(), angles.sin()

    def empty_cache(self) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.config
        shape = (c.n_layers, c.n_kv_heads, c.max_seq_len, c.head_dim)
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
        update: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        cos, sin = self.rope(positions)
        # One bias row per query row of the grouped-query bmm (group-major).
        bias = bias.repeat(self.config.n_heads // self.config.n_kv_heads, 1)
        new_k, new_v = [], []
        for index, layer in enumerate(self.layers):
            x, k, v = layer(x, cos, sin, bias, k_cache[index], v_cache[index], update)
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
        update = (slots == position).to(torch.float32).view(1, -1, 1)
        bias = torch.zeros(1, self.config.max_seq_len).masked_fill((slots > position)[None, :], float("-inf"))
        x, k_cache, v_cache = self._blocks(embed, position, bias, k_cache, v_cache, update)
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


# --- factories -----------------------------------------------------------------------------------


def _materialize(config: LlamaConfig, weights: Callable[[str, tuple[int, ...]], torch.Tensor]) -> Llama:
    """A Llama whose every parameter is ``weights(name, shape)``, assigned without a copy."""
    model = Llama(config)
    state = {name: weights(name, tuple(tensor.shape)) for name, tensor in model.state_dict().items()}
    model.load_state_dict(state, strict=True, assign=True)
    return model.eval()


def _numpy_weights(seed: int) -> Callable[[str, tuple[int, ...]], torch.Tensor]:
    """Random weights from numpy's generator, drawn tensor by tensor in state_dict order.

    numpy, not torch: two torch versions need not draw the same numbers from
    one seed, numpy's Generator does. Norm gains are 1, embeddings N(0, 0.02²)
    and projections N(0, 1/fan_in). With Llama's 0.02 everywhere the residual
    stream stays the token's own embedding, and the tied head then repeats the
    last token forever: a generation no numerical drift could change.
    """
    rng = np.random.default_rng(seed)

    def draw(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        if name.endswith("norm.weight"):
            return torch.ones(shape)
        array = rng.standard_normal(shape, dtype=np.float32)
        array *= np.float32(0.02 if name == "tok_embeddings.weight" else shape[-1] ** -0.5)
        return torch.from_numpy(array)

    return draw


def _generation_case(
    model: Llama,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    eos_id: int | None,
    vocab: Sequence[str] | None,
    prompt_texts: Sequence[str] = (),
    multi_method_artifact: bool = True,
) -> ModelCase:
    """Prefill and decode methods, and a drive that generates greedily for every prompt.

    ``prompt_texts`` label the prompts in the report (the ids are what runs)."""
    config = model.config
    modules = {"prefill": Prefill(model).eval(), "decode": Decode(model).eval()}
    steps = first_step_inputs(modules["prefill"], prompts[0])
    methods = {name: Method(module, *steps[name]) for name, module in modules.items()}

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
        return {"tokens": all_tokens, "text": all_text, "step_logits": torch.stack(all_logits),
                "prompts": list(prompt_texts)}

    return ModelCase(model, methods=methods, task=Task(kind="generation", drive=drive), weights="deterministic",
                     multi_method_artifact=multi_method_artifact)


# Axis of the KV cache outputs ([n_layers, n_kv_heads, max_seq_len, head_dim]) that holds the slots.
CACHE_SLOT_AXIS = 2


def first_step_inputs(
    prefill: Prefill, prompt_ids: Sequence[int]
) -> dict[str, tuple[tuple[torch.Tensor, ...], dict[int, tuple[int, int]]]]:
    """Each method's example inputs as a real chat produces them, and the cache slots a later step reads.

    prefill: the first prompt, right-padded; decode: that prompt's first greedy
    token at the next position, on the cache the prompt filled. Calibration and
    the numerics comparison then see what an app sends (not padding and an empty
    cache). Of the caches each method returns, a later step reads only the slots
    written so far (prefill: the prompt's; decode: one more), so only those are
    compared: the padded slots are overwritten before anything reads them.
    """
    length = len(prompt_ids)
    window = prefill.llama.config.prefill_len
    tokens = torch.tensor([list(prompt_ids) + [0] * (window - length)], dtype=torch.int64)
    position = torch.tensor([length], dtype=torch.int64)
    with torch.no_grad():
        logits, k_cache, v_cache = prefill(tokens, position)
    first_token = logits.argmax(dim=-1).view(1, 1)
    return {
        "prefill": ((tokens, position), {1: (CACHE_SLOT_AXIS, length), 2: (CACHE_SLOT_AXIS, length)}),
        "decode": (
            (first_token, position.clone(), k_cache.contiguous(), v_cache.contiguous()),
            {1: (CACHE_SLOT_AXIS, length + 1), 2: (CACHE_SLOT_AXIS, length + 1)},
        ),
    }


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
    prompts = assets.read_json("smollm2", "prompts.json")
    return _generation_case(
        model,
        [prompt["ids"] for prompt in prompts],
        max_new_tokens=max_new_tokens,
        eos_id=raw["eos_id"],
        vocab=assets.read_json("smollm2", "vocab.json"),
        prompt_texts=[prompt["text"] for prompt in prompts],
    )


def _random_weight_case(
    *, prefill_len: int, max_new_tokens: int, multi_method_artifact: bool = True, **shape: Any
) -> ModelCase:
    """A Llama of ``shape`` with numpy-random weights, greedy on RANDOM_PROMPTS."""
    config = LlamaConfig(**shape, max_seq_len=_cache_length(prefill_len, max_new_tokens), prefill_len=prefill_len)
    model = _materialize(config, _numpy_weights(seed=0))
    return _generation_case(model, RANDOM_PROMPTS, max_new_tokens=max_new_tokens, eos_id=None, vocab=None,
                            multi_method_artifact=multi_method_artifact)


def llama_smoke() -> ModelCase:
    """Two tiny layers with numpy-random weights: the generation path in seconds, for tests."""
    return _random_weight_case(
        prefill_len=16, max_new_tokens=8, vocab_size=512, dim=64, n_layers=2, n_heads=4, n_kv_heads=2,
        hidden_dim=128, norm_eps=1e-5, rope_theta=10000.0,
    )


def llama_prefill_smoke() -> ModelCase:
    """llama-smoke's prefill as the one method: where ExecuTorch 0.7's XNNPACK zeroes a dynamically quantized
    prefill's KV cache (tests/test_diagnose.py). Its two layers make it a list of blocks, so the search runs on the
    first layer as a program of its own (compat/diagnose/blocks.py), as it does on SmolLM2's 30."""
    case = _random_weight_case(
        prefill_len=16, max_new_tokens=8, vocab_size=512, dim=64, n_layers=2, n_heads=4, n_kv_heads=2,
        hidden_dim=128, norm_eps=1e-5, rope_theta=10000.0,
    )
    return dataclasses.replace(case, methods={"prefill": case.entry_points()["prefill"]}, task=Task())


def llama32_1b_dims() -> ModelCase:
    """Llama 3.2 1B's shapes with numpy-random float32 weights (~5 GB): export time, RSS and size.

    Llama 3.2 scales its RoPE frequencies for long contexts ("llama3" rope_scaling);
    that changes numbers, not the graph, and random weights make the numbers
    meaningless anyway, so plain RoPE is used. Prefill and decode are exported
    as two artifacts only: one multi-method .pte would need both lowered
    programs (≈ 5 GB of weights each) in memory at once.
    """
    return _random_weight_case(
        prefill_len=16, max_new_tokens=4, multi_method_artifact=False, vocab_size=128256, dim=2048, n_layers=16,
        n_heads=32, n_kv_heads=8, hidden_dim=8192, norm_eps=1e-5, rope_theta=500000.0,
    )
