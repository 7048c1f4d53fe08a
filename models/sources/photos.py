"""Three real photos, resized and normalized once for every image model.

The photos are scikit-image's sample images, read from its installed data
folder: importing skimage would pull in scipy and friends, which the assets
venv does not have (scikit-image is installed --no-deps for its data only).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
from PIL import Image

PHOTOS = ("astronaut.png", "coffee.png", "chelsea.png")

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
SIGLIP_MEAN = (0.5, 0.5, 0.5)
SIGLIP_STD = (0.5, 0.5, 0.5)

# file name → (side, mean, std)
ARRAYS = {
    "imagenet-224.npy": (224, IMAGENET_MEAN, IMAGENET_STD),
    "siglip-512.npy": (512, SIGLIP_MEAN, SIGLIP_STD),
    "siglip-256.npy": (256, SIGLIP_MEAN, SIGLIP_STD),
}


def skimage_data_dir() -> Path:
    spec = importlib.util.find_spec("skimage")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("scikit-image is not installed in the assets venv: its data folder holds the photos")
    return Path(spec.submodule_search_locations[0]) / "data"


def resize_and_crop(image: Image.Image, side: int) -> Image.Image:
    """Shorter side to ``side`` (bicubic), then the centered side×side square."""
    width, height = image.size
    scale = side / min(width, height)
    resized = image.resize(
        (max(side, round(width * scale)), max(side, round(height * scale))), Image.Resampling.BICUBIC
    )
    left = (resized.width - side) // 2
    top = (resized.height - side) // 2
    return resized.crop((left, top, left + side, top + side))


def normalize(image: Image.Image, mean: tuple[float, ...], std: tuple[float, ...]) -> np.ndarray:
    """HWC uint8 → CHW float32, (pixel / 255 - mean) / std per channel."""
    pixels: np.ndarray = np.asarray(image, dtype=np.float32) / 255.0
    pixels = (pixels - np.asarray(mean, dtype=np.float32)) / np.asarray(std, dtype=np.float32)
    return pixels.transpose(2, 0, 1).astype(np.float32)


def build(out_dir: Path) -> None:
    """Write one float32 NCHW array per preprocessing (photos in PHOTOS order) and photos.json."""
    out_dir.mkdir(parents=True, exist_ok=True)
    data_dir = skimage_data_dir()
    images = [Image.open(data_dir / name).convert("RGB") for name in PHOTOS]
    for file_name, (side, mean, std) in ARRAYS.items():
        batch = np.stack([normalize(resize_and_crop(image, side), mean, std) for image in images])
        np.save(out_dir / file_name, batch)
    manifest = {
        "photos": list(PHOTOS),
        "arrays": {
            file_name: {"shape": [len(PHOTOS), 3, side, side], "mean": list(mean), "std": list(std)}
            for file_name, (side, mean, std) in ARRAYS.items()
        },
        "preprocessing": "RGB; shorter side resized (Pillow bicubic), center crop; (x/255 - mean) / std",
    }
    (out_dir / "photos.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
