"""Legacy stack: TorchScript → optimize_for_mobile → Lite Interpreter (.ptl)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from torch.jit.mobile import _load_for_lite_interpreter
from torch.utils.mobile_optimizer import optimize_for_mobile

# What optimize_for_mobile's passes do to a method that departs (culprit.py; the Diagnoses capability), from
# torchscript_diagnose.py, which defines them (and imports nothing back).
from .search.export_errors import source_line, told_traceback
from .torchscript_diagnose import (  # noqa: F401 - the adapter's members
    REMEDY_NAME,
    lower_keeping_out,
    lower_with_remedy,
    lowering_parts,
    method_reproducer,
    remedy_options,
    reproducer_source,
    run_lowered,
)
from .torchscript_migrate import export_lines  # noqa: F401 - the adapter's member

SUFFIX = ".ptl"

# Imported once per stack by the fork server of the phases that export (compat/worker.py PRELOADS): FX
# quantization, which the int8 recipe imports.
PRELOAD = ("torch.ao.quantization.quantize_fx",)

# Quantization recipes by variant name: what a team on this stack ships as INT8.
QUANTIZATIONS = {
    "int8": "FX static, qnnpack (dynamic Linear where FX cannot trace the model)",
    "int8-dynamic": "quantize_dynamic, qnnpack: every nn.Linear with per-channel int8 weights, "
                    "int8 activations quantized per call",
}
# Quantized kernels on a phone are QNNPACK's; the x86 default (fbgemm) packs weights differently.
QUANTIZED_ENGINE = "qnnpack"


def quantize(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], variant: str) -> tuple[Any, dict[str, Any]]:
    """The legacy INT8 recipe: prepare_fx with qnnpack's default qconfigs,
    calibrate on the inputs, convert_fx. FX cannot take every model: its symbolic
    tracing cannot follow shapes used as numbers (an LLM's positions), and its
    observers cannot scale an attention mask's -inf fill. For those models 2.2's
    remaining option is torch.ao.quantization.quantize_dynamic — int8 weights,
    activations quantized per call — which is what is used then, and recorded."""
    from torch.ao.quantization import get_default_qconfig_mapping, quantize_dynamic
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

    torch.backends.quantized.engine = QUANTIZED_ENGINE
    if variant == "int8-dynamic":
        return _dynamic_linear(module)
    step = "symbolic tracing (prepare_fx)"
    try:
        prepared = prepare_fx(copy.deepcopy(module).eval(), get_default_qconfig_mapping(QUANTIZED_ENGINE), inputs)
        step = "calibration"
        with torch.no_grad():
            prepared(*inputs)  # the observers see the same inputs in every stack
        step = "convert_fx"
        converted = convert_fx(prepared)
    except Exception as error:  # noqa: BLE001 - FX static failed: the dynamic recipe, and why
        # Where in the model FX stopped (issue 63: a YOLO head it could not trace, said without its line).
        where = source_line(told_traceback(error), {}, tool=str(Path(__file__).parent))
        dynamic = quantize_dynamic(copy.deepcopy(module).eval(), {torch.nn.Linear}, dtype=torch.qint8)
        return dynamic, {"recipe": "dynamic Linear, qnnpack (quantize_dynamic: int8 weights, activations per call)",
                         "static_failed": f"FX {step}: {type(error).__name__}: {str(error)[:300]}"
                                          + (f" (at {where})" if where else ""),
                         "quantized_modules": _quantized_modules(dynamic)}
    return converted, {"recipe": "FX static, qnnpack (per-tensor int8 activations and weights)",
                       "quantized_modules": _quantized_modules(converted)}


def _dynamic_linear(module: torch.nn.Module) -> tuple[Any, dict[str, Any]]:
    """The int8-dynamic recipe: the qconfig is per-channel weights, as the candidate's
    XNNPACKQuantizer dynamic config, so the two stacks quantize the same layers the same way."""
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    dynamic = quantize_dynamic(copy.deepcopy(module).eval(), {torch.nn.Linear: per_channel_dynamic_qconfig},
                               dtype=torch.qint8)
    return dynamic, {"recipe": QUANTIZATIONS["int8-dynamic"], "quantized_modules": _quantized_modules(dynamic)}


def _quantized_modules(module: torch.nn.Module) -> int:
    return sum(1 for m in module.modules() if type(m).__module__.startswith("torch.ao.nn.quantized"))


def lower(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> tuple[Any, dict[str, Any]]:
    # strict=False: a model that returns a dict (Hugging Face-style) traces, as a team that
    # ships one does; the Lite Interpreter returns the dict with its keys.
    optimized = optimize_for_mobile(torch.jit.trace(module, inputs, strict=False))
    return optimized, {"operators": len(torch.jit.export_opnames(optimized))}


def save(lowered: Any, path: Path) -> None:
    # The Lite Interpreter allocates as it runs: there is no memory plan to report.
    lowered._save_for_lite_interpreter(str(path))


def load(path: Path) -> Any:
    # Quantized artifacts unpack their weights for the engine that is set when they load.
    torch.backends.quantized.engine = QUANTIZED_ENGINE
    return _load_for_lite_interpreter(str(path))


def run(program: Any, inputs: tuple[torch.Tensor, ...]) -> Any:
    with torch.no_grad():
        return program(*inputs)


# Operators kept per method in the profile record.
PROFILE_TOP = 25


def profile(path: Path, inputs: tuple[torch.Tensor, ...], runs: int) -> dict[str, Any]:
    """Self CPU time per operator over ``runs`` calls, from torch's profiler,
    which sees every operator the Lite Interpreter dispatches; and the
    artifact's operator list (what a selective mobile build must include)."""
    program = load(path)
    run(program, inputs)  # untimed: first-call allocations are not an operator's cost
    with torch.autograd.profiler.profile() as recorded:
        for _ in range(runs):
            run(program, inputs)
    events = [e for e in recorded.key_averages() if e.self_cpu_time_total > 0]
    total_us = sum(e.self_cpu_time_total for e in events)
    events.sort(key=lambda e: -e.self_cpu_time_total)
    return {
        "source": "torch.autograd.profiler on the Lite Interpreter (self CPU time per operator)",
        "total_ms": total_us / 1000 / runs,
        "operators": [{"name": e.key, "calls": e.count // runs, "total_ms": e.self_cpu_time_total / 1000 / runs,
                       "share": e.self_cpu_time_total / total_us} for e in events[:PROFILE_TOP]],
        "operator_list": sorted(torch.jit.mobile._export_operator_list(program)),
    }


def profiler_missing() -> str | None:
    return None  # torch's own profiler comes with torch


def set_threads(count: int) -> None:
    torch.set_num_threads(count)
