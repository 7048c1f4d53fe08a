from __future__ import annotations

import torch

from edge_app.model import INPUT_SHAPE, build
from edge_app.quantize import quantize_int8


def test_int8_model_stays_close_to_float() -> None:
    model, _ = build()
    generator = torch.Generator().manual_seed(1)
    calibration = [(torch.rand(8, *INPUT_SHAPE[1:], generator=generator),) for _ in range(4)]
    quantized = quantize_int8(model, calibration)
    assert any(type(m).__module__.startswith("torch.ao.nn.quantized") for m in quantized.modules())

    images = torch.rand(16, *INPUT_SHAPE[1:], generator=generator)
    with torch.no_grad():
        expected = model(images)
        actual = quantized(images)
    # Signal-to-quantization-noise ratio of the scores, in dB.
    snr_db = 10 * torch.log10(expected.pow(2).sum() / (actual - expected).pow(2).sum())
    assert snr_db > 20
