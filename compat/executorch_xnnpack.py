"""Candidate stack: torch.export → to_edge_transform_and_lower(XNNPACK) → .pte."""

from __future__ import annotations

import copy
import dataclasses
import operator
from collections import Counter
from pathlib import Path
from typing import Any

import torch

# The runtime comes from the compiled module itself: the public wrapper
# (executorch.extension.pybindings.portable_lib) only re-exports it, after
# importing executorch.exir for a warning class, which costs ~20 s per process
# here. A phone app has no exir either. torch must be imported first: the
# extension links against its libraries.
from executorch.extension.pybindings._portable_lib import (
    _load_for_executorch,
    _unsafe_reset_threadpool,
)

SUFFIX = ".pte"


def lower(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> tuple[Any, dict[str, Any]]:
    # The export toolchain is imported here, not at module level, so that the
    # runtime phase (load → run → latency) starts without it.
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    lowered = to_edge_transform_and_lower(torch.export.export(module, inputs), partitioner=[XnnpackPartitioner()])
    calls = Counter(
        _op_name(node.target)
        for node in lowered.exported_program().graph_module.graph.nodes
        if node.op == "call_function" and node.target is not operator.getitem
    )
    partitions = calls.pop("executorch_call_delegate", 0)
    # What is left outside the delegate runs on ExecuTorch's portable kernels.
    return lowered, {"delegate_partitions": partitions, "portable_ops": dict(calls.most_common())}


def save(lowered: Any, path: Path, *, keep: bool = False) -> dict[str, Any]:
    """Write the .pte; with ``keep`` the lowered program stays usable (for save_program).

    to_executorch() rewrites the lowered graphs in place (out-variant ops,
    memory plan), so a program that is still needed is serialized from a copy —
    a full copy of its weights, which a 1B model cannot afford.
    """
    program = (copy.deepcopy(lowered) if keep else lowered).to_executorch()
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
    """Every method in one multi-method .pte, as an app ships an LLM or a VLM.

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


def _op_name(target: Any) -> str:
    name = getattr(target, "__name__", None) or str(target)
    return name.removeprefix("aten.")


def load(path: Path) -> Any:
    return _load_for_executorch(str(path))


def run(program: Any, inputs: tuple[torch.Tensor, ...]) -> Any:
    return program.forward(tuple(inputs))


def set_threads(count: int) -> None:
    torch.set_num_threads(count)
    # XNNPACK runs on ExecuTorch's own threadpool, not torch's. Reset it before
    # any program is loaded: resetting it after a load made forward() hang
    # (0% CPU, never returns) with executorch 0.7.0 on this machine.
    _unsafe_reset_threadpool(count)
