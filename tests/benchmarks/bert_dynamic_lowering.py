"""Does ExecuTorch's XNNPACK lower a dynamically quantized BERT encoder? (docs/models.md, MiniLM)

The candidate's ``minilm-l6@int8-dynamic`` fails in its export stage with XNNPACK's
"Weight and Input should both be quantized". This reproduces it on the two-layer
``minilm-smoke`` (same code, random weights, seconds), with XNNPACKQuantizer's dynamic
per-channel config set on ``nn.Linear`` (upgrade-gate's recipe) and set globally (ExecuTorch's
``export_llama --pt2e_quantize xnnpack_dynamic``), and prints, per setting, whether
``to_edge_transform_and_lower`` succeeds. Run in a candidate venv, from the repository root:

    PATH=.nox/run-candidate/bin:$PATH PYTHONPATH=. .nox/run-candidate/bin/python tests/benchmarks/bert_dynamic_lowering.py

Exit status 1 while the failure reproduces in either setting (so a newer release can be checked
with the same command), 0 when both lower.
"""

from __future__ import annotations

import sys

import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
    XNNPACKQuantizer,
    get_symmetric_quantization_config,
)
from executorch.exir import to_edge_transform_and_lower
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

from models import bert
from models.case import as_case


def lowers(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], on_every_linear: bool) -> str | None:
    """None when the quantized module lowers to XNNPACK, else the error."""
    config = get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True)
    quantizer = (XNNPACKQuantizer().set_global(config) if on_every_linear
                 else XNNPACKQuantizer().set_module_type(torch.nn.Linear, config))
    prepared = prepare_pt2e(torch.export.export_for_training(module, inputs).module(), quantizer)
    prepared(*inputs)
    try:
        to_edge_transform_and_lower(torch.export.export(convert_pt2e(prepared), inputs),
                                    partitioner=[XnnpackPartitioner()])
    except Exception as error:  # noqa: BLE001 - the lowering's own error is the finding
        return f"{type(error).__name__}: {error}"
    return None


def main() -> int:
    method = as_case(bert.minilm_smoke(), factory="models.bert:minilm_smoke").entry_points()["forward"]
    failed = False
    for label, on_every_linear in (("on nn.Linear (upgrade-gate)", False), ("set globally (export_llama)", True)):
        error = lowers(method.module.eval(), method.inputs, on_every_linear)
        failed |= error is not None
        print(f"{label}: {'lowers' if error is None else 'fails: ' + error[:300]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
