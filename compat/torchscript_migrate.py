"""The legacy stack's export as the lines a team's script writes today (the WritesExportLines capability of
compat/contract.py): the calls torchscript_mobile.py's quantize(), lower() and save() make, which MIGRATION.md shows
beside the candidate's script (upgrade_gate.migrate). tests/test_migrate.py runs them as written and checks the
file's outputs against the legacy artifact's."""

from __future__ import annotations

# The variant's recipe, each as torchscript_mobile.quantize runs it, on ``model`` and ``example_inputs``.
RECIPES = {
    "fp32": [],
    "int8": [
        "from torch.ao.quantization import get_default_qconfig_mapping, quantize_dynamic",
        "from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx",
        "",
        'torch.backends.quantized.engine = "qnnpack"  # a phone\'s quantized kernels',
        "try:",
        '    prepared = prepare_fx(model.eval(), get_default_qconfig_mapping("qnnpack"), example_inputs)',
        "    with torch.no_grad():",
        "        prepared(*example_inputs)  # calibration",
        "    model = convert_fx(prepared)",
        "except Exception:  # FX cannot trace the model: int8 weights, activations quantized per call",
        "    model = quantize_dynamic(model.eval(), {torch.nn.Linear}, dtype=torch.qint8)",
    ],
    "int8-dynamic": [
        "from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic",
        "",
        'torch.backends.quantized.engine = "qnnpack"  # a phone\'s quantized kernels',
        "model = quantize_dynamic(model.eval(), {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8)",
    ],
}

SAVING = [
    "with torch.no_grad():",
    "    traced = torch.jit.trace(model, example_inputs, strict=False)",
    'optimize_for_mobile(traced)._save_for_lite_interpreter("{file}")',
]


def export_lines(variant: str, file: str) -> str:
    """The lines that quantize ``model`` with ``variant``'s recipe (none for fp32), trace it on ``example_inputs``,
    optimize it for mobile and write ``file``: what the team's export script holds today."""
    recipe = RECIPES[variant]
    saving = [line.format(file=file) for line in SAVING]
    return "\n".join(["import torch", "from torch.utils.mobile_optimizer import optimize_for_mobile", "",
                      *recipe, *([""] if recipe else []), *saving]) + "\n"
