"""torchvision's own CNN classifiers, built by each stack's torchvision.

torchvision 0.17.2 (legacy) and 0.23.0 (candidate) build the same state_dict
keys and shapes for both models, so the first stack's random weights load
strictly into the other. No pretrained weights: nothing is downloaded.
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


def mobilenet_v3_small() -> ModelCase:
    """torchvision MobileNetV3-Small (1000 classes, random init) on three photos."""
    model = torchvision.models.mobilenet_v3_small(weights=None)
    return ModelCase(model.eval(), (imagenet_photos(),), task=Task(kind="classification"))


def resnet18() -> ModelCase:
    """torchvision ResNet-18 (1000 classes, random init) on three photos."""
    model = torchvision.models.resnet18(weights=None)
    return ModelCase(model.eval(), (imagenet_photos(),), task=Task(kind="classification"))
