"""INT8 for the phone: FX graph mode static quantization with QNNPACK's settings."""

from __future__ import annotations

import copy
from collections.abc import Iterable

import torch
from torch.ao.quantization import get_default_qconfig_mapping
from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

# The phone's quantized kernels are QNNPACK's (the x86 default, fbgemm, packs weights differently).
ENGINE = "qnnpack"


def quantize_int8(model: torch.nn.Module, calibration: Iterable[tuple[torch.Tensor, ...]]) -> torch.nn.Module:
    """An int8 copy of the model, its activation ranges observed on the calibration batches."""
    batches = list(calibration)
    torch.backends.quantized.engine = ENGINE
    prepared = prepare_fx(copy.deepcopy(model).eval(), get_default_qconfig_mapping(ENGINE), batches[0])
    with torch.no_grad():
        for batch in batches:
            prepared(*batch)
    return convert_fx(prepared)
