"""The candidate's recipe as the lines of a team's own export script (the WritesExportScript capability of
compat/contract.py; upgrade_gate.migrate writes the script around them): the calls executorch_xnnpack.py's
quantize(), lower() and save() make, written once more as a team writes them, with nothing of upgrade-gate
imported. tests/test_migrate.py runs the script and checks that its .pte is the judged one, byte for byte: the two
cannot drift apart unseen. A recipe's failure is handed on in the same lines: its reproducers (the
ReproducesQuantizeFailures capability, and ReExports' export_reproducer; their text, compat/recipe_reproducers.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from . import handed_module, recipe_reproducers
from .executorch_diagnose import EXPORT_REMEDIES
from .executorch_precision import (
    PT2E_IMPORTS,
    PT2E_RECIPES,
    WEIGHT_GROUP_SIZE,
    int8_dynamic_int4_config_code,
    keep_float_code,
    pt2e_functions,
)
from .search import culprit, issue_text

LOWERING = [
    "from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner",
    "from executorch.exir import EdgeProgramManager, to_edge_transform_and_lower",
    "",
    "",
    "def exported(module, inputs):",
    '    """torch.export: the program the lowering starts from."""',
    "    with torch.no_grad():",
    "        return torch.export.export(module, inputs)",
    "",
    "",
    "def lowered(program, partitioner=None):",
    '    """Every operator the partitioner takes (XNNPACK\'s; a remedy\'s where it makes one) delegated to it."""',
    "    with torch.no_grad():",
    "        return to_edge_transform_and_lower(program, partitioner=[partitioner or XnnpackPartitioner()])",
    "",
    "",
    "def program_bytes(methods):",
    '    """The .pte of the lowered ``methods`` (name → program): one serialized, or several in one program, the',
    '    weights they share stored once. to_executorch may rewrite a lowered program: each is serialized once."""',
    "    if len(methods) == 1:",
    "        (only,) = methods.values()",
    "        return only.to_executorch().buffer",
    "    first = next(iter(methods.values()))",
    "    # Each method was checked when it was lowered; a second check rejects the operators the delegate kept whole.",
    "    config = dataclasses.replace(first.compile_config, _check_ir_validity=False)",
    "    programs = {name: method.exported_program() for name, method in methods.items()}",
    "    return EdgeProgramManager(programs, compile_config=config).to_executorch().buffer",
]


def export_script(variant: str) -> str:
    """Python defining ``quantize(module, inputs, replaced=None)`` (a PT2E variant's also ``capture(module, inputs)``
    and ``quantize_captured(captured, inputs, quantizer=None)``, its two steps), ``exported(module, inputs)``,
    ``lowered(program, partitioner=None)`` and ``program_bytes(methods)`` for ``variant``."""
    return "\n".join(["import dataclasses", "", "import torch", *_quantizing(variant), "", "", *LOWERING]) + "\n"


def _quantizing(variant: str) -> list[str]:
    if variant == "fp32":
        return ["", "", "def quantize(module, inputs, replaced=None):", '    """fp32: no recipe."""',
                "    return module"]
    if variant == "8da4w":
        import torchao.quantization as torchao_quantization

        config = int8_dynamic_int4_config_code(torchao_quantization)  # what torchao_quantized takes, as its line
        return ["import copy", "", "import torchao.quantization as torchao_quantization",
                "import torchao.quantization.granularity", "import torchao.utils", "", "",
                "def quantize(module, inputs, quantized_here=None):",
                f'    """8da4w: int4 weights in groups of {WEIGHT_GROUP_SIZE}, int8 per-token activations, on every '
                'nn.Linear (a remedy\'s\n    ``quantized_here``: those it takes)."""',
                "    quantized = copy.deepcopy(module).eval()",
                f"    torchao_quantization.quantize_(quantized, {config},",
                '                                   **({"filter_fn": quantized_here} if quantized_here else {}))',
                '    return getattr(torchao.utils, "unwrap_tensor_subclass", lambda m: m)(quantized)']
    pt2e = pt2e_functions()  # prepare and convert from the package the quantizer is built on
    recipe = PT2E_RECIPES[variant].replace("\n", "\n        ")
    return [*PT2E_IMPORTS[1:], f"from {pt2e} import convert_pt2e, prepare_pt2e", "", "",
            "def quantize(module, inputs, quantizer=None):",
            '    """PT2E: the pre-dispatch graph captured, then quantized."""',
            "    return quantize_captured(capture(module, inputs).module(), inputs, quantizer)",
            "",
            "",
            "def capture(module, inputs):",
            '    """The pre-dispatch program PT2E quantizes."""',
            '    return (getattr(torch.export, "export_for_training", None) or torch.export.export)(module, inputs)',
            "",
            "",
            "def quantize_captured(captured, inputs, quantizer=None):",
            '    """The captured graph prepared with the quantizer (the recipe\'s; a remedy\'s where it makes one),',
            '    calibrated on the inputs, converted."""',
            "    if quantizer is None:",
            f"        {recipe}",
            "    prepared = prepare_pt2e(captured, quantizer)",
            "    with torch.no_grad():",
            "        prepared(*inputs)",
            "    return convert_pt2e(prepared)"]


# ExecuTorch's ScalarType codes (runtime/core/portable_type/scalar_type.h) by torch's dtype names.
SCALAR_TYPES = {0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "float16", 6: "float32", 7: "float64",
                11: "bool", 15: "bfloat16"}


def method_signature(program: Any, method: str) -> dict[str, Any]:
    """``method``'s inputs and outputs as the loaded program's metadata says them: each tensor's sizes and dtype."""
    meta = program.method_meta(method)

    def tensors(count: int, info: Any) -> list[dict[str, Any]]:
        return [{"sizes": list(info(i).sizes()), "dtype": SCALAR_TYPES.get(int(info(i).dtype()), str(info(i).dtype()))}
                for i in range(count)]

    return {"inputs": tensors(meta.num_inputs(), meta.input_tensor_meta),
            "outputs": tensors(meta.num_outputs(), meta.output_tensor_meta)}



def export_reproducer(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], folder: Path, *,
                      fails_with: str, found_in: str, named: str) -> None:
    """Where the export raises: the smallest module that raises (``named``) whole with its own code, the arguments of
    its real call, and a standalone script in ``folder`` (torch and the model's packages) that exports it as the
    team's export script does, or with another of the export API's options: exit 1 while it raises as found."""
    handed_module.save_module(module, folder)
    torch.save((tuple(args), dict(kwargs)), folder / "call.pt")
    (folder / "repro.py").write_text(recipe_reproducers.torch_export(
        torch_version=torch.__version__, found_in=found_in, module=named, options=list(EXPORT_REMEDIES),
        fails_with=fails_with, fails_as_found=issue_text.FAILS_AS_FOUND), encoding="utf-8")


def quantize_reproducer(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], folder: Path, *, variant: str,
                        fails_with: str, found_in: str, named: str, nothing: bool = False) -> None:
    """Where the variant's recipe raises (``nothing``: quantizes nothing): the program the recipe captures of the
    smallest module that raises (``named``), its real inputs and a standalone script (torch and executorch only) in
    ``folder`` that quantizes it with the recipe as the team's export script writes it: exit 1 while it fails as
    found."""
    from importlib.metadata import version

    script = _captured(module, inputs, folder, variant)
    culprit.write_reproducer(folder, inputs, recipe_reproducers.executorch_quantize(
        executorch=version("executorch"), found_in=found_in, module=named, recipe=script,
        fails_with=fails_with, fails_as_found=issue_text.FAILS_AS_FOUND, nothing=nothing))


def precision_reproducer(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], expected: list[torch.Tensor],
                         folder: Path, *, variant: str, keep_float: list[str], min_snr_db: float, min_cosine: float,
                         extents: dict[int, tuple[int, int]], found_in: str) -> None:
    """Where the variant's recipe departs from the float model beyond its gate: the program the recipe captures of
    ``module``, its real inputs, the float outputs on them (``expected``) and a standalone script in ``folder`` that
    quantizes it as the team's export script does and measures the worst output by the gate: exit 1 while below it,
    and with ``--with-remedy`` the layers in ``keep_float`` left in float."""
    from importlib.metadata import version

    script = _captured(module, inputs, folder, variant)
    torch.save(list(expected), folder / "expected.pt")
    culprit.write_reproducer(folder, inputs, recipe_reproducers.executorch_precision(
        executorch=version("executorch"), found_in=found_in, recipe=script, remedy=keep_float_code(variant, keep_float),
        min_snr_db=min_snr_db, min_cosine=min_cosine, extents=extents))


def _captured(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], folder: Path, variant: str) -> str:
    """The variant's export script (its recipe's lines), the program its ``capture`` makes of ``module`` saved as
    program.pt2 in ``folder``. A recipe that quantizes modules (8da4w's torchao) has no program: ValueError."""
    script = export_script(variant)
    if "def quantize_captured(" not in script:
        raise ValueError(f"{variant}'s recipe quantizes modules, not a captured program: no program to hand on")
    scope: dict[str, Any] = {}
    exec(compile(script, f"<{variant} recipe>", "exec"), scope)  # noqa: S102 - the adapter's own recipe text
    # Captured as the script captures it, grad on: under no_grad a model's own no_grad region (Llama's rotary
    # embedding) is captured as no region, and the program would quantize where the model does not.
    torch.export.save(scope["capture"](module, inputs), folder / "program.pt2")
    return script
