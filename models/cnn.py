"""torchvision's own CNN classifiers, built by each stack's torchvision.

torchvision 0.17.2 (legacy) and 0.23.0 (candidate) build the same state_dict
keys and shapes for both models, so the first stack's random weights load
strictly into the other. No pretrained weights: nothing is downloaded.

Random init alone leaves MobileNetV3's logits near 1e-9 (kaiming fan-out init
undersizes depthwise kernels and eval-mode BatchNorm is the identity), too small
for top-k agreement to mean anything. So each BatchNorm's running statistics
are first set from the photos, as a trained network's would be: activations
stay O(1) through every layer. The nonzero BatchNorm shifts this gives also
expose what identity statistics hide: torch.jit.trace + optimize_for_mobile
drops the shift when folding BatchNorm into a bias-free conv (pytorch#76807,
still present in torch 2.2.2 and 2.8.0).
"""

from __future__ import annotations

import numpy as np
import torch
import torchvision

from . import assets
from .case import ModelCase, Task


def imagenet_photos() -> torch.Tensor:
    """The assets' three photos, 224×224, ImageNet mean/std: [3, 3, 224, 224] float32."""
    return torch.from_numpy(np.load(assets.path("photos", "imagenet-224.npy")))


def calibrate_batch_norm(model: torch.nn.Module, pixels: torch.Tensor) -> torch.nn.Module:
    """Set every BatchNorm's running mean/var to its batch statistics on ``pixels``; return the model in eval mode."""
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.reset_running_stats()
            module.momentum = None  # cumulative average: one batch sets the statistics outright
    model.train()
    with torch.no_grad():
        model(pixels)
    return model.eval()


def mobilenet_v3_small() -> ModelCase:
    """torchvision MobileNetV3-Small (1000 classes, random init, BatchNorm calibrated) on three photos."""
    photos = imagenet_photos()
    model = calibrate_batch_norm(torchvision.models.mobilenet_v3_small(weights=None), photos)
    return ModelCase(model, (photos,), task=Task(kind="classification"))


def resnet18() -> ModelCase:
    """torchvision ResNet-18 (1000 classes, random init, BatchNorm calibrated) on three photos."""
    photos = imagenet_photos()
    model = calibrate_batch_norm(torchvision.models.resnet18(weights=None), photos)
    return ModelCase(model, (photos,), task=Task(kind="classification"))
