"""Does ExecuTorch's XNNPACK keep a dynamically quantized LLM prefill's KV cache? (docs/models.md)

The candidate's ``smollm2-135m@int8-dynamic`` and ``nanovlm@int8-dynamic`` give garbage (SNR
-25.6 and -3.5 dB, token agreement 0): their ``.pte`` prefill returns KV caches that are zero in
every slot the prompt wrote, while the same PT2E-converted module, run eagerly or exported again
with ``torch.export``, fills them. This reproduces it on the two-layer ``llama-smoke`` (random
weights, seconds): the eager quantized module, then the ``.pte`` lowered by
``to_edge_transform_and_lower`` with XNNPACK, each against the fp32 model. Run in a candidate venv,
from the repository root:

    PATH=.nox/run-candidate/bin:$PATH PYTHONPATH=. .nox/run-candidate/bin/python tests/benchmarks/llm_dynamic_lowering.py

Exit status 1 while the ``.pte``'s cache is zero where the eager quantized one is not (so a newer
release can be checked with the same command), 0 otherwise.

Written by hand before the tool found it; `nox -s compare` now does (docs/report.md, "Quantized variants:
the lowering or the quantization": the operator, a reproducer it writes, and the remedy). Kept as an
independent check of what the tool says.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
    XNNPACKQuantizer,
    get_symmetric_quantization_config,
)
from executorch.exir import to_edge_transform_and_lower
from executorch.extension.pybindings.portable_lib import _load_for_executorch
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

from models import llama


def main() -> int:
    prefill = llama.llama_smoke().entry_points()["prefill"]
    inputs, length = prefill.inputs, int(prefill.inputs[1])
    quantizer = XNNPACKQuantizer().set_module_type(
        torch.nn.Linear, get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True))
    prepared = prepare_pt2e(torch.export.export_for_training(prefill.module, inputs).module(), quantizer)
    prepared(*inputs)
    quantized = convert_pt2e(prepared)
    with torch.no_grad():
        reference, eager = prefill.module(*inputs), quantized(*inputs)
    program = to_edge_transform_and_lower(torch.export.export(quantized, inputs),
                                          partitioner=[XnnpackPartitioner()]).to_executorch()
    path = Path(tempfile.mkdtemp()) / "prefill.pte"
    path.write_bytes(program.buffer)
    artifact = _load_for_executorch(str(path)).forward(tuple(inputs))
    zeroed = False
    for index, name in enumerate(("logits", "k_cache", "v_cache")):
        # The caches are compared on the slots the prompt wrote: the ones a later step reads.
        part = (lambda t: t) if index == 0 else (lambda t: t[:, :, :length])
        ref, ours, pte = part(reference[index]), part(eager[index]), part(artifact[index])
        print(f"{name}: eager int8-dynamic rel. L2 {float((ours - ref).norm() / ref.norm()):.3g} against fp32; "
              f".pte {float((pte - ref).norm() / ref.norm()):.3g}; .pte max |value| {float(pte.abs().max()):.3g}")
        zeroed |= index > 0 and float(pte.abs().max()) == 0.0 < float(ours.abs().max())
    print("the .pte's cache is zero where the eager quantized module's is not" if zeroed else "the .pte keeps its cache")
    return 1 if zeroed else 0


if __name__ == "__main__":
    sys.exit(main())
