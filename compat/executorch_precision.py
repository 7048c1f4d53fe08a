"""The candidate's quantization (for executorch_xnnpack.py): the primitives its recipes are built from —
PT2E's capture, prepare, calibration and convert, torchao's 8da4w — and the layer-precision search (the
KeepsFloat capability of compat/contract.py): the layers each recipe quantizes, and the lines of an export
script that leave some of them in float — the code the search quantizes with, so that the remedy is what
was checked."""

from __future__ import annotations

import copy
import importlib
from typing import Any

import torch

from .search.quoting import python_string

# SmolLM2's width (576) and MLP (1536) are multiples of 32, not of 128 (export_llama's default
# for 8da4w): torchao leaves a Linear whose input width the group does not divide in float, so
# 128 would quantize only SmolLM2's MLP down-projections (docs/models.md has the figures).
WEIGHT_GROUP_SIZE = 32


# What the remedy's code defines: the PT2E recipes' quantizer, torchao's module filter for 8da4w.
REMEDY_NAMES = {"int8": "quantizer", "int8-dynamic": "quantizer", "8da4w": "quantized_here"}
# The module types each recipe quantizes (PT2E's static int8 also quantizes operators outside any
# module — additions, pooling — which stay quantized whatever is kept in float).
LAYER_TYPES: dict[str, tuple[type[torch.nn.Module], ...]] = {
    "int8": (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Linear),
    "int8-dynamic": (torch.nn.Linear,),
    "8da4w": (torch.nn.Linear,),
}


def pt2e_quantized(captured: Any, inputs: tuple[torch.Tensor, ...], quantizer: Any) -> Any:
    """The captured graph prepared with ``quantizer``, calibrated on ``inputs``, converted."""
    functions = importlib.import_module(pt2e_functions())
    prepared = functions.prepare_pt2e(captured, quantizer)
    with torch.no_grad():
        prepared(*inputs)  # calibration: the observers see the same inputs in every stack
    return functions.convert_pt2e(prepared)


def pt2e_functions() -> str:
    """The module of prepare_pt2e and convert_pt2e the quantizer works with: one package holds both — torch.ao up to
    executorch 0.6, torchao's copy of PT2E from 0.7 on (executorch_migrate.py writes the same import)."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import XNNPACKQuantizer

    if any(base.__module__.startswith("torchao.") for base in XNNPACKQuantizer.__mro__):
        return "torchao.quantization.pt2e.quantize_pt2e"
    return "torch.ao.quantization.quantize_pt2e"


def torchao_quantized(module: torch.nn.Module, filter_fn: Any) -> torch.nn.Module:
    """A copy of ``module`` with torchao's 8da4w on every nn.Linear (that ``filter_fn`` accepts, when given)."""
    import torchao.quantization as torchao_quantization

    quantized = copy.deepcopy(module).eval()
    torchao_quantization.quantize_(quantized, _int8_dynamic_int4_config(torchao_quantization),
                                   **({"filter_fn": filter_fn} if filter_fn is not None else {}))
    return quantized


def unwrapped(quantized: torch.nn.Module) -> torch.nn.Module:
    """torchao's newer tensors export as they are; the older ones are unwrapped into plain ops first."""
    import torchao.utils

    return getattr(torchao.utils, "unwrap_tensor_subclass", lambda m: m)(quantized)


def _int8_dynamic_int4_config(torchao_quantization: Any) -> Any:
    import torchao.quantization.granularity

    scope = {"torch": torch, "torchao": torchao, "torchao_quantization": torchao_quantization}
    return eval(int8_dynamic_int4_config_code(torchao_quantization), scope)  # noqa: S307 - our own line


def int8_dynamic_int4_config_code(torchao_quantization: Any) -> str:
    """8da4w as torchao names it, as the line an export script writes (executorch_migrate.py; with ``torch``,
    ``torchao.quantization.granularity`` and ``torchao.quantization as torchao_quantization`` imported): the
    function of torchao ≤ 0.16 (executorch 0.7's), else the config that replaced it (the old one was removed in
    torchao 0.17: pytorch/ao#3884) with the same recipe — int4 symmetric weights in groups, int8 asymmetric
    per-token activations."""
    if hasattr(torchao_quantization, "int8_dynamic_activation_int4_weight"):
        return f"torchao_quantization.int8_dynamic_activation_int4_weight(group_size={WEIGHT_GROUP_SIZE})"
    return ("torchao_quantization.Int8DynamicActivationIntxWeightConfig(\n"
            "        weight_dtype=torch.int4,\n"
            f"        weight_granularity=torchao.quantization.granularity.PerGroup({WEIGHT_GROUP_SIZE}))")


def capture_for_quantization(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> Any:
    """The pre-dispatch graph PT2E quantizes: export_for_training up to torch 2.9, which torch
    2.10 removed — torch.export.export captures the same graph since 2.8 (pytorch/pytorch#158203)."""
    return captured_program(module, inputs).module()


def captured_program(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> Any:
    """The pre-dispatch program PT2E quantizes, as the export script's ``capture`` makes it (grad on)."""
    capture = getattr(torch.export, "export_for_training", None) or torch.export.export
    return capture(module, inputs)


# Where a PT2E recipe raises: the capture's options, in order, each the lines that replace the export script's
# ``captured = capture(module, inputs)`` (the first is the script's own). Under torch.no_grad(), as ExecuTorch's own
# LLM examples capture, a model's own no_grad region is captured as no region, and an autocast region inside it no
# longer nests: PT2E's convert loses the inner of two nested (Llama's rotary embedding, pytorch/ao#4455).
CAPTURE_REMEDIES = (
    ("as configured", "captured = capture(module, inputs)"),
    ("under torch.no_grad()", "with torch.no_grad():  # a model's own no_grad region then captured as no region\n"
                              "    captured = capture(module, inputs)"),
)


def quantize_with_capture(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], variant: str, code: str) -> Any:
    """The variant quantized by its PT2E recipe from the program one of ``CAPTURE_REMEDIES`` captures (its lines
    run as written, ``capture`` the script's). A recipe that quantizes modules (8da4w) captures nothing, and one that
    quantizes nothing would be judged as the float model: ValueError."""
    if variant not in PT2E_RECIPES:
        raise ValueError(f"{variant}'s recipe quantizes modules, not a captured program: no capture to change")
    scope: dict[str, Any] = {"torch": torch, "capture": captured_program, "module": module, "inputs": inputs}
    exec(compile(code, "<capture remedy>", "exec"), scope)  # noqa: S102 - one of CAPTURE_REMEDIES
    converted = pt2e_quantized(scope["captured"].module(), inputs, pt2e_quantizer(variant))
    if not any("quantize_per" in str(node.target) for node in converted.graph.nodes):  # the float model, judged so
        raise ValueError("the recipe quantized nothing of it")
    return converted


def quantizable_layers(module: torch.nn.Module, variant: str) -> list[str]:
    """The modules the variant's recipe quantizes, by their path in ``module``, in model order."""
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
    return module if variant == "8da4w" else capture_for_quantization(module, inputs)


def quantize_with_remedy(start: Any, inputs: tuple[torch.Tensor, ...], variant: str,
                         remedy: dict[str, Any]) -> torch.nn.Module:
    """The variant quantized as its recipe does, with what the remedy's code defined (``REMEDY_NAMES``):
    a module that runs eagerly and that ``lower`` exports."""
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
    kept = "{" + ", ".join(python_string(name) for name in keep_float) + "}" if keep_float else "set()"
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
            "# torchao.quantization.quantize_(model, int8_dynamic_activation_int4_weight("
            f"group_size={WEIGHT_GROUP_SIZE}),",
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
