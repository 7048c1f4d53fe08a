"""The candidate's layer-precision search (the KeepsFloat capability of compat/contract.py, for
executorch_xnnpack.py): the layers each recipe quantizes, and the lines of an export script that leave
some of them in float — the code the search quantizes with, so that the remedy is what was checked."""

from __future__ import annotations

from typing import Any

import torch

# What the remedy's code defines: the PT2E recipes' quantizer, torchao's module filter for 8da4w.
REMEDY_NAMES = {"int8": "quantizer", "int8-dynamic": "quantizer", "8da4w": "quantized_here"}
# The module types each recipe quantizes (PT2E's static int8 also quantizes operators outside any
# module — additions, pooling — which stay quantized whatever is kept in float).
LAYER_TYPES: dict[str, tuple[type[torch.nn.Module], ...]] = {
    "int8": (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Linear),
    "int8-dynamic": (torch.nn.Linear,),
    "8da4w": (torch.nn.Linear,),
}


def quantizable_layers(module: torch.nn.Module, variant: str) -> list[str]:
    """The modules the variant's recipe quantizes, by their path in ``module``, in model order."""
    from .executorch_xnnpack import WEIGHT_GROUP_SIZE

    found = []
    for name, layer in module.named_modules():
        if not name or not isinstance(layer, LAYER_TYPES[variant]):
            continue
        if variant == "8da4w" and layer.in_features % WEIGHT_GROUP_SIZE:
            continue  # torchao leaves it in float already
        found.append(name)
    return found


def precision_start(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], variant: str) -> Any:
    """What each quantization of the search starts from: the captured graph (PT2E), the module (torchao)."""
    from .executorch_xnnpack import capture_for_quantization

    return module if variant == "8da4w" else capture_for_quantization(module, inputs)


def quantize_with_remedy(start: Any, inputs: tuple[torch.Tensor, ...], variant: str,
                         remedy: dict[str, Any]) -> torch.nn.Module:
    """The variant quantized as its recipe does, with what the remedy's code defined (``REMEDY_NAMES``):
    a module that runs eagerly and that ``lower`` exports."""
    import copy

    from .executorch_xnnpack import pt2e_quantized, torchao_quantized, unwrapped

    if variant == "8da4w":
        return unwrapped(torchao_quantized(start, remedy[REMEDY_NAMES[variant]]))
    return pt2e_quantized(copy.deepcopy(start), inputs, remedy[REMEDY_NAMES[variant]])


PT2E_IMPORTS = [
    "import torch",
    "from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (",
    "    XNNPACKQuantizer,",
    "    get_symmetric_quantization_config,",
    ")",
]
# The quantizer of each PT2E recipe, as an export script writes it. int8-dynamic: nn.Linear modules only,
# as the legacy stack's quantize_dynamic (a functional linear, an RMSNorm's mean, a tied LM head, stays
# float in both stacks).
PT2E_RECIPES = {
    "int8": "quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))",
    "int8-dynamic": "quantizer = XNNPACKQuantizer().set_module_type(\n"
                    "    torch.nn.Linear, get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True))",
}


def pt2e_quantizer(variant: str) -> Any:
    """The XNNPACKQuantizer of an int8 recipe, from the lines a remedy shows."""
    scope: dict[str, Any] = {}
    exec("\n".join([*PT2E_IMPORTS, PT2E_RECIPES[variant]]), scope)  # noqa: S102 - our own recipe
    return scope["quantizer"]


def keep_float_code(variant: str, keep_float: list[str]) -> str:
    """The lines of an export script that quantize as the recipe does, the layers in ``keep_float`` (and
    whatever they hold) left in float."""
    kept = "{" + ", ".join(repr(name) for name in keep_float) + "}" if keep_float else "set()"
    if variant == "8da4w":
        return "\n".join([
            "import torch",
            "",
            f"KEEP_FLOAT = {kept}  # quantized, these take the variant below its gate",
            "",
            "",
            "def quantized_here(module, fqn):",
            '    """torchao quantize_\'s filter_fn: every nn.Linear but those kept in float (or inside them)."""',
            "    return isinstance(module, torch.nn.Linear) and not any(",
            '        fqn == name or fqn.startswith(name + ".") for name in KEEP_FLOAT)',
            "",
            "",
            "# torchao.quantization.quantize_(model, int8_dynamic_activation_int4_weight(group_size=32),",
            "#                                filter_fn=quantized_here)",
        ]) + "\n"
    return "\n".join([
        *PT2E_IMPORTS,
        "",
        f"KEEP_FLOAT = {kept}  # quantized, these take the variant below its gate",
        "",
        "",
        "def quantized_here(node):",
        '    """False for a node of a layer kept in float (its module\'s path, or a parent\'s, in KEEP_FLOAT)."""',
        "    stack = node.meta.get(\"nn_module_stack\", {}).values()",
        "    paths = {path.removeprefix(\"L['self'].\") for path, _ in stack}",
        "    return not paths & KEEP_FLOAT",
        "",
        "",
        PT2E_RECIPES[variant],
        "quantizer.set_filter_function(quantized_here)",
        "# prepared = prepare_pt2e(captured, quantizer), calibrated, convert_pt2e(prepared): as before",
    ]) + "\n"
