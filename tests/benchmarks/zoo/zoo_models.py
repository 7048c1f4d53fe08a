"""The zoo's factories: real architectures from the package index, built as a team builds them for export.

Each factory returns ``(module.eval(), inputs)``. Weights are random (seeded; no checkpoint is downloaded: only the
package registries are reachable), and upgrade-gate saves the first stack's weights for the others, so a seed that
two torch versions draw differently does not matter. Inputs are real: scikit-image's sample photos, and real
sentences tokenized by transformers' ByT5 tokenizer, which needs no vocabulary file (every other tokenizer's
vocabulary comes from the hub).

A CNN's BatchNorm statistics are set from the photos first (as upgrade-gate's models/cnn.py does): random init with
identity statistics leaves deep networks' outputs vanishing or exploding, which makes every comparison meaningless.
"""

from __future__ import annotations

import functools
import os
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

# Imported packages that write settings or caches under $HOME (ultralytics, matplotlib, huggingface_hub) write in a
# temporary folder instead; nothing here may reach a hub.
_SCRATCH = os.path.join(tempfile.gettempdir(), "upgrade-gate-zoo")
for _variable in ("YOLO_CONFIG_DIR", "MPLCONFIGDIR", "HF_HOME"):
    os.environ.setdefault(_variable, os.path.join(_SCRATCH, _variable.lower()))
os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

SEED = 0
PHOTOS = ("astronaut", "coffee", "chelsea")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# Real sentences (upgrade-gate's MiniLM pairs), padded to one length: bytes, so ids stay below ByT5's 384.
SENTENCES = (
    "A man is eating food.",
    "A man is riding a white horse on an enclosed ground.",
    "A woman is holding a small child in her arms.",
    "A cheetah chases prey on a field.",
)
TEXT_LENGTH = 64
BYTE_VOCABULARY = 384  # ByT5: 3 special tokens, 256 bytes, 125 extra ids


# -- inputs ------------------------------------------------------------------------------------------------------


@functools.cache
def photos(side: int, mean: tuple[float, ...] = IMAGENET_MEAN, std: tuple[float, ...] = IMAGENET_STD) -> torch.Tensor:
    """scikit-image's three sample photos: shorter side to ``side``, centre crop, normalized; [3, 3, side, side]."""
    from PIL import Image
    from skimage import data

    arrays = []
    for name in PHOTOS:
        image = Image.fromarray(getattr(data, name)()).convert("RGB")
        scale = side / min(image.size)
        image = image.resize((max(side, round(image.width * scale)), max(side, round(image.height * scale))),
                             Image.Resampling.BICUBIC)
        left, top = (image.width - side) // 2, (image.height - side) // 2
        pixels = np.asarray(image.crop((left, top, left + side, top + side)), dtype=np.float32) / 255.0
        arrays.append(((pixels - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)).transpose(2, 0, 1))
    return torch.from_numpy(np.stack(arrays).astype(np.float32))


@functools.cache
def sentences() -> tuple[torch.Tensor, torch.Tensor]:
    """The sentences as ByT5 ids and their attention mask, right-padded: two [4, TEXT_LENGTH] int64 tensors."""
    from transformers import ByT5Tokenizer

    tokens = ByT5Tokenizer()(list(SENTENCES), padding="max_length", max_length=TEXT_LENGTH, truncation=True,
                             return_tensors="pt")
    return tokens["input_ids"].to(torch.int64), tokens["attention_mask"].to(torch.int64)


# -- helpers -----------------------------------------------------------------------------------------------------


def calibrated(model: torch.nn.Module, pixels: torch.Tensor) -> torch.nn.Module:
    """Every BatchNorm's running statistics set to its batch statistics on ``pixels``; the model in eval mode."""
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # cumulative average: one batch sets the statistics outright
    if norms:
        model.train()
        with torch.no_grad():
            model(pixels)
    return model.eval()


class Tensors(torch.nn.Module):
    """A model whose output is a ModelOutput, a dict or nested tuples, returning its tensors as a flat tuple (what
    both exporters take, and what a team's export wrapper does)."""

    def __init__(self, model: torch.nn.Module, keywords: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.model = model
        self.keywords = keywords  # the inputs' names, where the model takes them by keyword

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.model(**dict(zip(self.keywords, inputs))) if self.keywords else self.model(*inputs)
        return tuple(_flat(out))


def _flat(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _flat(v)]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _flat(v)]
    return []


def _seeded(build: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    torch.manual_seed(SEED)
    return build()


# -- timm ----------------------------------------------------------------------------------------------------------


def _timm(name: str, side: int = 224, **kwargs: Any) -> Callable[[], tuple[torch.nn.Module, tuple[torch.Tensor]]]:
    def build() -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
        import timm

        pixels = photos(side)
        model = _seeded(lambda: timm.create_model(name, pretrained=False, **kwargs))
        return calibrated(model, pixels), (pixels,)

    build.__doc__ = f"timm's {name} (random weights, BatchNorm calibrated) on three photos, {side}²."
    return build


efficientnet_b0 = _timm("efficientnet_b0")
mobilenetv3_large_100 = _timm("mobilenetv3_large_100")
mobilevit_xxs = _timm("mobilevit_xxs", 256)
levit_128s = _timm("levit_128s")
convnext_atto = _timm("convnext_atto")
regnety_002 = _timm("regnety_002")
ghostnet_100 = _timm("ghostnet_100")
fastvit_t8 = _timm("fastvit_t8")
mobileone_s0 = _timm("mobileone_s0")
repvit_m0_9 = _timm("repvit_m0_9")
lcnet_050 = _timm("lcnet_050")
edgenext_xx_small = _timm("edgenext_xx_small")
efficientformer_l1 = _timm("efficientformer_l1")
deit_tiny = _timm("deit_tiny_patch16_224")
tiny_vit_5m = _timm("tiny_vit_5m_224", num_classes=1000)
efficientvit_b0 = _timm("efficientvit_b0")
mixnet_s = _timm("mixnet_s")


# -- torchvision ---------------------------------------------------------------------------------------------------


def _torchvision(name: str, **kwargs: Any) -> Callable[[], tuple[torch.nn.Module, tuple[torch.Tensor]]]:
    def build() -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
        import torchvision

        pixels = photos(224)
        model = _seeded(lambda: getattr(torchvision.models, name)(weights=None, **kwargs))
        return calibrated(model, pixels), (pixels,)

    build.__doc__ = f"torchvision's {name} (random weights, BatchNorm calibrated) on three photos, 224²."
    return build


tv_mobilenet_v2 = _torchvision("mobilenet_v2")
tv_shufflenet_v2_x0_5 = _torchvision("shufflenet_v2_x0_5")
tv_squeezenet1_1 = _torchvision("squeezenet1_1")
tv_mnasnet0_5 = _torchvision("mnasnet0_5")
tv_regnet_x_400mf = _torchvision("regnet_x_400mf")
tv_googlenet = _torchvision("googlenet", aux_logits=False, init_weights=True)


# -- ultralytics ---------------------------------------------------------------------------------------------------


def _ultralytics(yaml: str, side: int = 320) -> Callable[[], tuple[torch.nn.Module, tuple[torch.Tensor]]]:
    def build() -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
        from ultralytics.nn.tasks import ClassificationModel, DetectionModel, SegmentationModel

        kind = ClassificationModel if "-cls" in yaml else SegmentationModel if "-seg" in yaml else DetectionModel
        pixels = photos(side, (0.0, 0.0, 0.0), (1.0, 1.0, 1.0))  # ultralytics takes pixels / 255
        model = _seeded(lambda: kind(yaml, verbose=False))
        model = calibrated(model, pixels)
        for module in model.modules():  # as ultralytics' own exporter sets its heads: the outputs, no training extras
            if hasattr(module, "export"):
                module.export = True
        return Tensors(model).eval(), (pixels,)

    build.__doc__ = f"ultralytics {yaml} (random weights, BatchNorm calibrated) on three photos, {side}²."
    return build


yolov8n = _ultralytics("yolov8n.yaml")
yolo11n = _ultralytics("yolo11n.yaml")
yolov8n_seg = _ultralytics("yolov8n-seg.yaml")
yolo11n_cls = _ultralytics("yolo11n-cls.yaml", 224)


# -- transformers, from their Config classes -----------------------------------------------------------------------


def _text(config_class: str, model_class: str, **config: Any) -> Callable[[], tuple[torch.nn.Module, tuple]]:
    def build() -> tuple[torch.nn.Module, tuple[torch.Tensor, torch.Tensor]]:
        import transformers

        settings = getattr(transformers, config_class)(vocab_size=BYTE_VOCABULARY, **config)
        model = _seeded(lambda: getattr(transformers, model_class)(settings))
        return Tensors(model.eval(), ("input_ids", "attention_mask")).eval(), sentences()

    build.__doc__ = f"transformers' {model_class} from a small {config_class} (random weights) on four sentences."
    return build


_SMALL = {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 1024}

hf_bert = _text("BertConfig", "BertModel", **_SMALL)
hf_distilbert = _text("DistilBertConfig", "DistilBertModel", dim=256, n_layers=4, n_heads=4, hidden_dim=1024)
hf_mobilebert = _text("MobileBertConfig", "MobileBertModel", num_hidden_layers=4)
hf_albert = _text("AlbertConfig", "AlbertModel", embedding_size=128, **_SMALL)
hf_roberta = _text("RobertaConfig", "RobertaModel", **_SMALL)
hf_gpt2 = _text("GPT2Config", "GPT2Model", n_embd=256, n_layer=4, n_head=4, use_cache=False)
hf_llama = _text("LlamaConfig", "LlamaModel", num_key_value_heads=2, use_cache=False, **_SMALL)
hf_qwen2 = _text("Qwen2Config", "Qwen2Model", num_key_value_heads=2, use_cache=False, **_SMALL)
hf_t5_encoder = _text("T5Config", "T5EncoderModel", d_model=256, d_kv=64, d_ff=1024, num_layers=4, num_heads=4)


def _vision(config_class: str, model_class: str, side: int = 224, **config: Any) -> Callable[[], tuple]:
    def build() -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
        import transformers

        pixels = photos(side, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
        model = _seeded(lambda: getattr(transformers, model_class)(getattr(transformers, config_class)(**config)))
        return calibrated(Tensors(model, ("pixel_values",)), pixels), (pixels,)

    build.__doc__ = f"transformers' {model_class} from a small {config_class} (random weights) on three photos."
    return build


hf_vit = _vision("ViTConfig", "ViTModel", **_SMALL)
hf_dinov2 = _vision("Dinov2Config", "Dinov2Model", patch_size=16, hidden_size=256, num_hidden_layers=4,
                    num_attention_heads=4)
hf_swin = _vision("SwinConfig", "SwinModel", embed_dim=48, depths=[2, 2, 2, 2], num_heads=[2, 4, 8, 16])
hf_segformer = _vision("SegformerConfig", "SegformerForSemanticSegmentation", 256)
