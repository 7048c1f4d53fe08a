"""nanoVLM (seed 002) as the six programs its Android app loads.

The seed's app runs six ExecuTorch programs in a loop: vision encoder →
modality projector → token embedding → prefill decoder → LM head → (token
embedding → decode decoder → LM head) × N. This model is that split, written
with plain ops both exporters handle (attention spelled out, no
scaled_dot_product_attention), so every piece reaches TorchScript (torch 2.2)
and torch.export (torch 2.8) as its own program.

* Vision encoder — SigLIP-like ViT as in nanoVLM: patch convolution, learned
  position embeddings, no class token, pre-LN blocks with a GELU(tanh) MLP, a
  final LayerNorm; it returns every patch token.
* Modality projector — nanoVLM's pixel shuffle (patch grid → space-to-depth by
  ``shuffle`` → flatten) and a bias-free Linear to the language model's width.
* Language part — :class:`models.llama.Llama` with an explicit static KV cache:
  ``embed`` (token_embedding), ``prefill_hidden`` (prefill_decoder, on
  embeddings: chat-template text, the image tokens inside the user turn as
  nanoVLM places them, the rest of the prompt, right-padded), ``decode_hidden``
  (decode_decoder), ``lm_head``.

Weights: the vision encoder and projector are drawn from numpy's generator (no
SigLIP checkpoint ships with the assets), the language part comes from the
Llama factory, so every torch version builds identical numbers and nothing is
saved as a fixture.

One module for the model on purpose (over 500 lines): its six programs and the loop that
runs them are read together.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from . import assets
from .case import Call, Method, ModelCase, Task
from .decoding import decode_text
from .llama import CACHE_SLOT_AXIS, Llama, llama_smoke, smollm2_135m
from .nanovlm_vision import LayerNorm, ModalityProjector, VisionConfig, VisionEncoder

METHODS = (
    "vision_encoder",
    "modality_projector",
    "token_embedding",
    "prefill_decoder",
    "decode_decoder",
    "lm_head",
)

# -- the six programs --------------------------------------------------------------


class TokenEmbedding(nn.Module):
    def __init__(self, llama: Llama) -> None:
        super().__init__()
        self.llama = llama

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.llama.embed(tokens)


class PrefillDecoder(nn.Module):
    def __init__(self, llama: Llama) -> None:
        super().__init__()
        self.llama = llama

    def forward(
        self, embeds: torch.Tensor, length: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.llama.prefill_hidden(embeds, length, k_cache, v_cache)


class DecodeDecoder(nn.Module):
    def __init__(self, llama: Llama) -> None:
        super().__init__()
        self.llama = llama

    def forward(
        self, embed: torch.Tensor, position: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.llama.decode_hidden(embed, position, k_cache, v_cache)


class LMHead(nn.Module):
    def __init__(self, llama: Llama) -> None:
        super().__init__()
        self.llama = llama

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.llama.lm_head(hidden)


class NanoVLM(nn.Module):
    """Owns every weight; ``programs`` are views onto it, one per exported method."""

    def __init__(self, vision: VisionConfig, llama: Llama) -> None:
        super().__init__()
        self.vision_config = vision
        self.vision = VisionEncoder(vision)
        self.projector = ModalityProjector(vision, llama.config.dim)
        self.llama = llama

    def programs(self) -> dict[str, nn.Module]:
        return {
            "vision_encoder": self.vision,
            "modality_projector": self.projector,
            "token_embedding": TokenEmbedding(self.llama),
            "prefill_decoder": PrefillDecoder(self.llama),
            "decode_decoder": DecodeDecoder(self.llama),
            "lm_head": LMHead(self.llama),
        }


# -- the end-to-end loop -------------------------------------------------------------


@dataclass(frozen=True)
class Prompt:
    """Token ids around the image: nanoVLM puts its image tokens inside the user turn."""

    before_image: tuple[int, ...]
    after_image: tuple[int, ...]


@dataclass(frozen=True)
class Generation:
    """What ``drive`` needs besides ``call``: the inputs, the sizes, how to print tokens."""

    images: torch.Tensor  # [pairs, 3, S, S], one prompt per image
    prompts: tuple[Prompt, ...]
    prefill_len: int
    dim: int
    cache_shape: tuple[int, ...]
    steps: int
    vocab: list[str] | None = None
    eos_id: int | None = None
    # How the report names each image/prompt pair.
    labels: tuple[str, ...] = ()

    def drive(self, call: Call) -> dict[str, Any]:
        """Greedy generation through the six methods, one image/prompt pair at a time.

        ``step_logits[i, s]`` are the logits ``tokens[i][s]`` was picked from:
        step 0 comes from the prefill, the others from decode steps. Every pair
        runs all ``steps`` steps, past end-of-text too, so the stacks are
        compared on the same positions; "text" stops at end-of-text.
        """
        all_tokens: list[list[int]] = []
        all_logits: list[torch.Tensor] = []
        for image, prompt in zip(self.images, self.prompts):
            (patches,) = call("vision_encoder", image.unsqueeze(0))
            embeds, length = self.prefill_embeddings(call, patches, prompt)
            k_cache, v_cache = torch.zeros(self.cache_shape), torch.zeros(self.cache_shape)
            hidden, k_cache, v_cache = call("prefill_decoder", embeds, _ids([length]).view(1), k_cache, v_cache)
            tokens: list[int] = []
            step_logits: list[torch.Tensor] = []
            for step in range(self.steps):
                # Copies: a runtime may hand back views of memory its next call reuses.
                step_logits.append(call("lm_head", hidden)[0].reshape(-1).clone())
                token = int(step_logits[-1].argmax())
                tokens.append(token)
                if step == self.steps - 1:
                    break
                (embed,) = call("token_embedding", _ids([token]))
                position = _ids([length + step]).view(1)
                hidden, k_cache, v_cache = call("decode_decoder", embed, position, k_cache.clone(), v_cache.clone())
            all_tokens.append(tokens)
            all_logits.append(torch.stack(step_logits))
        return {
            "tokens": all_tokens,
            "text": [self.text(tokens) for tokens in all_tokens],
            "step_logits": torch.stack(all_logits).float(),
            "prompts": list(self.labels),
        }

    def prefill_embeddings(self, call: Call, patches: torch.Tensor, prompt: Prompt) -> tuple[torch.Tensor, int]:
        """[1, prefill_len, dim]: text before the image, image tokens, text after, zero padding; and the length."""
        (image_embeds,) = call("modality_projector", patches)
        # token_embedding is exported for one token, the decode loop's shape, so
        # the prompt is embedded a token at a time, as the app would.
        before = [call("token_embedding", _ids([token]))[0] for token in prompt.before_image]
        after = [call("token_embedding", _ids([token]))[0] for token in prompt.after_image]
        sequence = torch.cat([*before, image_embeds, *after], dim=1)
        length = sequence.shape[1]
        if length > self.prefill_len:
            raise ValueError(f"{length} prompt and image tokens exceed the prefill window of {self.prefill_len}")
        embeds = torch.zeros(1, self.prefill_len, self.dim, dtype=sequence.dtype)
        embeds[:, :length] = sequence
        return embeds, length

    def text(self, tokens: list[int]) -> str:
        shown = tokens[: tokens.index(self.eos_id)] if self.eos_id in tokens else tokens
        if self.vocab is None:
            return " ".join(map(str, shown))
        return decode_text(self.vocab, shown)


def _ids(values: list[int]) -> torch.Tensor:
    return torch.tensor([values], dtype=torch.int64)


def example_inputs(programs: dict[str, nn.Module], generation: Generation) -> dict[str, tuple[torch.Tensor, ...]]:
    """Each method's inputs as the first image/prompt pair produces them.

    A method's own outputs are then compared on realistic values: the decode
    step on a filled cache, the LM head on a real final hidden state.
    """

    def call(name: str, *args: torch.Tensor) -> list[torch.Tensor]:
        out = programs[name](*args)
        return [out] if isinstance(out, torch.Tensor) else list(out)

    image = generation.images[:1]
    with torch.no_grad():
        (patches,) = call("vision_encoder", image)
        embeds, length = generation.prefill_embeddings(call, patches, generation.prompts[0])
        length_t = _ids([length]).view(1)
        k_cache, v_cache = torch.zeros(generation.cache_shape), torch.zeros(generation.cache_shape)
        hidden, k_filled, v_filled = call("prefill_decoder", embeds, length_t, k_cache, v_cache)
        token = _ids([int(call("lm_head", hidden)[0].argmax())])
        (embed,) = call("token_embedding", token)
    inputs = {
        "vision_encoder": (image,),
        "modality_projector": (patches,),
        "token_embedding": (token,),
        "prefill_decoder": (embeds, length_t, k_cache, v_cache),
        "decode_decoder": (embed, length_t.clone(), k_filled, v_filled),
        "lm_head": (hidden,),
    }
    # A runtime takes contiguous tensors only (ExecuTorch refuses others).
    return {name: tuple(t.contiguous() for t in tensors) for name, tensors in inputs.items()}


# -- weights and the case ---------------------------------------------------------------


def numpy_state(part: nn.Module, rng: np.random.Generator, *, scale: float = 1.0) -> dict[str, torch.Tensor]:
    """Random weights for one part, drawn by numpy in state_dict order.

    numpy, not torch: two torch versions need not draw the same numbers from
    one seed. Matrices and convolution kernels ~ N(0, scale²/fan_in), biases
    and position embeddings ~ N(0, 0.02²), LayerNorm gains around 1:
    activations stay O(1) through the blocks and every layer moves the output.
    """
    norms = {name for name, sub in part.named_modules() if isinstance(sub, LayerNorm)}
    state = {}
    for name, tensor in part.state_dict().items():
        shape = tuple(tensor.shape)
        owner, _, kind = name.rpartition(".")
        if owner in norms:
            values = (1.0 if kind == "weight" else 0.0) + 0.1 * rng.standard_normal(shape)
        elif len(shape) >= 2 and name != "pos_embed":
            values = rng.standard_normal(shape) * (scale / np.sqrt(np.prod(shape[1:])))
        else:
            values = 0.02 * rng.standard_normal(shape)
        state[name] = torch.from_numpy(values.astype(np.float32))
    return state


def embedding_rms(llama: Llama) -> float:
    """RMS of the token embedding table, computed by numpy (the same in every stack)."""
    table = llama.tok_embeddings.weight.detach().numpy().astype(np.float64)
    return float(np.sqrt(np.mean(np.square(table))))


def resized(llama: Llama, *, prefill_len: int, max_seq_len: int) -> Llama:
    """The same weights behind another static prefill window and cache length.

    The Llama factories size both for text prompts; image tokens need a longer
    window. No parameter depends on either length.
    """
    config = dataclasses.replace(llama.config, prefill_len=prefill_len, max_seq_len=max_seq_len)
    model = Llama(config)
    model.load_state_dict(llama.state_dict(), strict=True, assign=True)
    return model.eval()


def build(
    vision: VisionConfig,
    llama: Llama,
    *,
    images: np.ndarray,
    prompts: list[Prompt],
    steps: int,
    seed: int = 0,
    vocab: list[str] | None = None,
    eos_id: int | None = None,
    labels: tuple[str, ...] = (),
) -> ModelCase:
    """The case: numpy-drawn vision weights, one example input per method, the loop."""
    if len(prompts) != len(images):
        raise ValueError(f"{len(images)} images but {len(prompts)} prompts: one prompt per image")
    model = NanoVLM(vision, llama)
    rng = np.random.default_rng(seed)
    model.vision.load_state_dict(numpy_state(model.vision, rng), strict=True)
    # The projector's input is a LayerNorm output (RMS ≈ 1); scaled like this its
    # output has the RMS of the token embeddings, so the random image tokens sit
    # where the decoder expects embeddings instead of swamping the prompt.
    model.projector.load_state_dict(numpy_state(model.projector, rng, scale=embedding_rms(llama)), strict=True)
    model.eval()

    config = llama.config
    k_empty, _ = llama.empty_cache()
    generation = Generation(
        images=torch.from_numpy(np.ascontiguousarray(images, dtype=np.float32)),
        prompts=tuple(prompts),
        prefill_len=config.prefill_len,
        dim=config.dim,
        cache_shape=tuple(k_empty.shape),
        steps=steps,
        vocab=vocab,
        eos_id=eos_id,
        labels=labels,
    )
    programs = {name: module.eval() for name, module in model.programs().items()}
    inputs = example_inputs(programs, generation)
    # The decoders' caches are read up to the slots written so far (models/llama.py first_step_inputs).
    length = int(inputs["prefill_decoder"][1])
    extents = {"prefill_decoder": length, "decode_decoder": length + 1}
    methods = {name: Method(programs[name], inputs[name],
                            read_extents={output: (CACHE_SLOT_AXIS, extents[name]) for output in (1, 2)}
                            if name in extents else {})
               for name in METHODS}
    return ModelCase(model, methods=methods, task=Task(kind="generation", drive=generation.drive),
                     weights="deterministic")


# -- factories ------------------------------------------------------------------------

# SmolLM2's chat template with the image inside the user turn, as nanoVLM builds
# its prompt: "<|im_start|>system\nYou are a helpful AI assistant named SmolLM,
# trained by Hugging Face<|im_end|>\n<|im_start|>user\n" · 64 image tokens ·
# "Describe the image.<|im_end|>\n<|im_start|>assistant\n". The ids are what
# models/sources/smollm2.py's tokenizer (the GGUF's vocabulary and merges)
# gives for the two text pieces; they round-trip to that text.
DESCRIBE_PROMPT = Prompt(
    before_image=(1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407,
                  19712, 8182, 2, 198, 1, 4093, 198),
    after_image=(37964, 260, 2443, 30, 2, 198, 1, 520, 9531, 198),
)


def _llama_of(case: ModelCase) -> Llama:
    if not isinstance(case.module, Llama):
        raise TypeError(f"expected a models.llama.Llama as the case's module, got {type(case.module).__name__}")
    return case.module


def _with_smollm2(vision: VisionConfig, photos: str, steps: int = 32) -> ModelCase:
    """SmolLM2-135M-Instruct behind ``vision``, "Describe the image." for each of the 3 photos."""
    prompt_len = len(DESCRIBE_PROMPT.before_image) + vision.image_tokens + len(DESCRIBE_PROMPT.after_image)
    prefill_len = -(-prompt_len // 16) * 16
    # Whole multiples of 32 for the cache, as models.llama sizes its own.
    llama = resized(_llama_of(smollm2_135m()), prefill_len=prefill_len,
                    max_seq_len=-(-(prefill_len + steps) // 32) * 32)
    images = np.load(assets.path("photos", photos), allow_pickle=False)
    return build(
        vision,
        llama,
        images=images,
        prompts=[DESCRIBE_PROMPT] * len(images),
        steps=steps,
        vocab=assets.read_json("smollm2", "vocab.json"),
        eos_id=assets.read_json("smollm2", "config.json")["eos_id"],
        labels=tuple(f"{photo} + Describe the image." for photo in assets.read_json("photos", "photos.json")["photos"]),
    )


def nanovlm() -> ModelCase:
    """nanoVLM with a smaller SigLIP-like encoder (256×256, patch 16, width 384, depth 6, 6 heads),
    pixel shuffle 2 → 64 image tokens, SmolLM2-135M-Instruct; 3 photos, 32 greedy tokens each."""
    vision = VisionConfig(image_size=256, patch=16, width=384, depth=6, heads=6, mlp_dim=1536, shuffle=2)
    return _with_smollm2(vision, "siglip-256.npy")


def nanovlm_full() -> ModelCase:
    """nanoVLM's own shapes: SigLIP ViT-B/16 at 512×512 (width 768, depth 12, 12 heads),
    pixel shuffle 4 → 64 image tokens, SmolLM2-135M-Instruct; 3 photos, 32 greedy tokens each."""
    vision = VisionConfig(image_size=512, patch=16, width=768, depth=12, heads=12, mlp_dim=3072, shuffle=4)
    return _with_smollm2(vision, "siglip-512.npy")


def nanovlm_smoke() -> ModelCase:
    """Toy sizes, same code: two random 32×32 images, 4 image tokens each, llama_smoke's decoder, 8 tokens."""
    vision = VisionConfig(image_size=32, patch=8, width=32, depth=2, heads=2, mlp_dim=64, shuffle=2)
    steps = 8
    llama = resized(_llama_of(llama_smoke()), prefill_len=16, max_seq_len=32)
    rng = np.random.default_rng(1)
    images = rng.uniform(-1.0, 1.0, size=(2, 3, 32, 32))
    prompts = [Prompt(before_image=(1, 2), after_image=(3, 4, 5)), Prompt(before_image=(1, 2), after_image=(6, 7))]
    return build(vision, llama, images=images, prompts=prompts, steps=steps)
