"""Candidate stack: torch.export → to_edge_transform_and_lower(XNNPACK) → .pte."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

import torch

# The members of the adapter's capabilities, each from the module that defines it (they import nothing back):
# the operators behind a numerics failure (culprit.py; Diagnoses, ReExports) from executorch_diagnose.py;
# which layers of a quantized variant to keep in float (precision.py; KeepsFloat) from executorch_precision.py,
# whose primitives quantize() builds its recipes from.
from .executorch_diagnose import (  # noqa: F401 - the adapter's members
    EXPORT_REMEDIES,
    REMEDY_NAME,
    export_with,
    lower_keeping_out,
    lower_with_remedy,
    lowering_parts,
    lowering_start,
    method_reproducer,
    remedy_options,
    reproducer_source,
    run_lowered,
)
from .executorch_load import (  # noqa: F401 - the adapter's members
    load_call_code,
    load_culprits,
    load_remedy_options,
    load_reproducer_source,
)
from .executorch_migrate import (  # noqa: F401 - the adapter's members
    export_reproducer,
    export_script,
    method_signature,
    precision_reproducer,
    quantize_reproducer,
)
from .executorch_precision import (  # noqa: F401 - the adapter's members, and what quantize() is built from
    CAPTURE_REMEDIES,
    WEIGHT_GROUP_SIZE,
    capture_for_quantization,
    keep_float_code,
    precision_start,
    pt2e_quantized,
    pt2e_quantizer,
    quantizable_layers,
    quantize_with_capture,
    quantize_with_remedy,
    torchao_quantized,
    unwrapped,
)
from .executorch_runtime import binding

SUFFIX = ".pte"

# Imported once per stack by the fork server of the phases that export (compat/worker.py PRELOADS), not in
# each of them: torch.export, the exporter and its partitioner, the quantizers and the delegation summary
# (≈ 3.5 s warm, 9 s cold, per process).
PRELOAD = ("torch.export", "executorch.exir", "executorch.backends.xnnpack.partition.xnnpack_partitioner",
           "executorch.backends.xnnpack.quantizer.xnnpack_quantizer", "torchao.quantization.pt2e.quantize_pt2e",
           "executorch.devtools.backend_debug")


def warm_up() -> None:
    """What every process's first lowering builds and then keeps (lru_cache): the pattern graphs XNNPACK's
    ConvertToUpsampleBilinear2d and ConvertToSDPA passes match against, 3.3 s of that lowering here. The
    fork server of the phases that export builds them once per stack (compat/worker.py) and each child
    inherits them. On one thread, so that no thread pool is started before the server forks (it checks), and
    with tqdm's monitor thread off meanwhile; both settings are put back."""
    from executorch.backends.xnnpack.partition.graphs import bilinear_2d, sdpa

    try:
        from tqdm import tqdm  # type: ignore[import-untyped]
    except ImportError:  # then nothing here draws a progress bar
        tqdm = None
    threads, monitor = torch.get_num_threads(), getattr(tqdm, "monitor_interval", 0)
    torch.set_num_threads(1)
    if tqdm is not None:
        tqdm.monitor_interval = 0
    try:
        bilinear_2d.get_graphs_dict()
        sdpa.get_graphs()
    finally:
        torch.set_num_threads(threads)
        if tqdm is not None:
            tqdm.monitor_interval = monitor

# Quantization recipes by variant name: ExecuTorch's own for XNNPACK.
QUANTIZATIONS = {
    "int8": "PT2E static, XNNPACKQuantizer (per-channel int8 weights, per-tensor int8 activations)",
    "int8-dynamic": "PT2E dynamic, XNNPACKQuantizer on every nn.Linear: per-channel int8 weights, "
                    "int8 activations quantized per call",
    "8da4w": f"torchao 8da4w on every nn.Linear: int4 weights in groups of {WEIGHT_GROUP_SIZE}, int8 per-token "
             "activations; embeddings and a tied LM head float (ExecuTorch's export_llama -qmode 8da4w: groups of "
             "128, which leave float every layer whose width is not a multiple of 128)",
}


def quantize(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], variant: str) -> tuple[Any, dict[str, Any]]:
    """A module that lower() exports like any other: PT2E-converted for int8,
    torchao-quantized (tensor subclasses unwrapped) for 8da4w."""
    if variant == "8da4w":
        quantized = torchao_quantized(module, None)
        # quantize_ swaps the weights of nn.Linear modules for quantized tensor subclasses.
        swapped = sum(1 for m in quantized.modules()
                      if isinstance(m, torch.nn.Linear) and type(m.weight) is not torch.nn.Parameter)
        return unwrapped(quantized), {"recipe": QUANTIZATIONS[variant], "quantized_modules": swapped}

    converted = pt2e_quantized(capture_for_quantization(module, inputs), inputs, pt2e_quantizer(variant))
    quantize_nodes = sum(1 for node in converted.graph.nodes
                         if node.op == "call_function" and "quantize_per" in str(node.target))
    return converted, {"recipe": QUANTIZATIONS[variant], "quantize_nodes": quantize_nodes}


def lower(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> tuple[Any, dict[str, Any]]:
    # The export toolchain is imported here, not at module level, so that the
    # runtime phase (load → run → latency) starts without it.
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    lowered = to_edge_transform_and_lower(torch.export.export(module, inputs), partitioner=[XnnpackPartitioner()])
    return lowered, delegation(lowered.exported_program().graph_module)


def delegation(graph_module: torch.fx.GraphModule, delegate: str = "XnnpackBackend") -> dict[str, Any]:
    """How much of the graph the delegate took: ExecuTorch's own count
    (get_delegation_info) of nodes inside and outside delegate partitions, by
    operator. What is left outside runs on ExecuTorch's portable kernels —
    seed 002's vision encoder that "may be running portable kernels"."""
    from executorch.devtools.backend_debug import get_delegation_info

    info = get_delegation_info(graph_module)
    # getitem unpacks a tuple (a delegate's outputs among them): no kernel runs for it.
    by_operator = {op: {"delegated": b.delegated, "portable": b.non_delegated}
                   for op, b in sorted(info.delegation_by_operator.items()) if op != "getitem"}
    delegated = sum(b["delegated"] for b in by_operator.values())
    portable = {op: b["portable"] for op, b in by_operator.items() if b["portable"]}
    return {
        "delegate": delegate,
        "delegate_partitions": info.num_delegated_subgraphs,
        "delegated_nodes": delegated,
        "portable_nodes": sum(portable.values()),
        "portable_ops": dict(sorted(portable.items(), key=lambda item: (-item[1], item[0]))),
        "by_operator": by_operator,
    }


def save(lowered: Any, path: Path) -> dict[str, Any]:
    """Write the .pte (to_executorch() rewrites the lowered graphs in place: ``lowered`` is spent)."""
    program = lowered.to_executorch()
    path.write_bytes(program.buffer)
    return planned_memory(program)


def planned_memory(program: Any) -> dict[str, Any]:
    """Each method's memory-planned buffers: what ExecuTorch's MethodMeta
    reports as memory_planned_buffer_size(i), the arena an app must give the
    method. Read from the execution plan (the Python MethodMeta of 0.7 does not
    expose it); entry 0 of non_const_buffer_sizes is reserved."""
    plans = {plan.name: [int(size) for size in plan.non_const_buffer_sizes[1:]]
             for plan in program.executorch_program.execution_plan}
    return {"planned_memory_bytes": {name: sum(sizes) for name, sizes in plans.items()},
            "planned_buffers_bytes": plans}


def save_program(lowered: dict[str, Any], path: Path) -> dict[str, Any]:
    """Every method in one multi-method .pte, as an app ships an LLM or a VLM: the
    weights the methods share are stored once (XNNPACK's named data, by digest).

    The methods were lowered one by one already; their lowered graphs are
    combined, not lowered again (for SmolLM2 that would cost minutes).
    """
    from executorch.exir import EdgeProgramManager

    first = next(iter(lowered.values()))
    # Each graph was verified when it was lowered; a second check of lowered
    # graphs rejects the ops the partitioner kept undecomposed.
    config = dataclasses.replace(first.compile_config, _check_ir_validity=False)
    # The last use of the lowered programs: to_executorch may rewrite them in place.
    programs = {name: m.exported_program() for name, m in lowered.items()}
    combined = EdgeProgramManager(programs, compile_config=config).to_executorch()
    path.write_bytes(combined.buffer)
    return planned_memory(combined)


def run_method(program: Any, name: str, inputs: tuple[torch.Tensor, ...]) -> Any:
    return program.run_method(name, tuple(inputs))


def load(path: Path) -> Any:
    return binding._load_for_executorch(str(path))


def run(program: Any, inputs: tuple[torch.Tensor, ...]) -> Any:
    return program.forward(tuple(inputs))


# ExecuTorch's other backends, tried export-only beside XNNPACK (executorch_backends.py).
OTHER_BACKENDS = ("coreml", "mps", "vulkan", "qnn", "arm-tosa", "openvino")


def backend_unavailable(backend: str) -> str | None:
    from . import executorch_backends

    return executorch_backends.unavailable(backend)


def export_only(backend: str, module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> dict[str, Any]:
    from . import executorch_backends

    return executorch_backends.try_backend(backend, module, inputs, lambda graph: delegation(graph, delegate=backend))


# Operators kept per method in the profile record.
PROFILE_TOP = 25


def profiler_missing() -> str | None:
    """What this machine lacks for `profile`, or None."""
    # The 0.7 wheel's runtime is built without the event tracer (its ETDump is
    # empty), so sampling with Linux perf is the only source of per-operator times.
    if shutil.which("perf") is None:
        return ("Linux perf is not installed (Debian: apt-get install linux-perf); "
                "the executorch 0.7 wheel records no ETDump")
    return None


def profile(path: Path, inputs: tuple[torch.Tensor, ...], runs: int, *, method: str = "forward") -> dict[str, Any]:
    """Time per operator of one call of ``method``, averaged over ``runs`` calls (executorch_profile.py:
    ETDump where the runtime records one, else Linux perf samples)."""
    from . import executorch_profile

    found = executorch_profile.profile_pte(path, inputs, runs, method=method)
    calls = found["runs"]
    return {
        "source": found["source"],
        "total_ms": found["total_ms"] / calls,
        "operators": [{"name": op["name"], "calls": (op["calls"] or 0) // calls, "total_ms": op["total_ms"] / calls,
                       "share": op["share"]} for op in found["ops"][:PROFILE_TOP]],
        "notes": found["notes"],
        **{key: found[key] for key in ("samples", "sampled_runs", "unwound_share") if key in found},
    }


def set_threads(count: int) -> None:
    torch.set_num_threads(count)
    # XNNPACK runs on ExecuTorch's own threadpool, not torch's. Reset it before
    # any program is loaded: resetting it after a load made forward() hang
    # (0% CPU, never returns) with executorch 0.7.0 on this machine.
    binding._unsafe_reset_threadpool(count)
