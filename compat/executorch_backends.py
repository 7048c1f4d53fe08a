"""ExecuTorch's other backends, export only: does the model lower to each?

The candidate ships with XNNPACK; a team may also target Core ML (iOS), MPS,
Vulkan (Android GPU), Qualcomm QNN, Arm Ethos-U (TOSA) or OpenVINO. Each is
tried ahead of time on this Linux machine — torch.export → that backend's
partitioner → to_executorch — and recorded as ok (with its delegated share and
the .pte's size), failed (with the error), or unavailable (its partitioner
cannot be imported here, and what it needs). Nothing here runs a .pte: these
runtimes are not on this machine.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from .common import stderr_kept

if TYPE_CHECKING:  # imported where it is used: the stderr capture is tested without a stack
    import torch

MESSAGE_CHARS = 600
# The last lines a failed tool (flatc) wrote to stderr, quoted in the backend's error.
CHILD_STDERR_LINES = 5


class Unavailable(Exception):
    """The backend's ahead-of-time tools are not installed in this stack."""


def _coreml() -> list[Any]:
    try:
        import coremltools as ct
        from executorch.backends.apple.coreml.compiler import CoreMLBackend
        from executorch.backends.apple.coreml.partition import CoreMLPartitioner
    except ImportError as error:
        raise Unavailable(f"{error}; needs coremltools (executorch 0.7 pins 8.3)") from None
    specs = CoreMLBackend.generate_compile_specs(
        compute_unit=ct.ComputeUnit.ALL, minimum_deployment_target=ct.target.iOS15,
        compute_precision=ct.precision.FLOAT16,
        # An .mlpackage; compiling it to .mlmodelc needs macOS, and the device does it anyway.
        model_type=CoreMLBackend.MODEL_TYPE.MODEL,
    )
    return [CoreMLPartitioner(compile_specs=specs)]


def _mps() -> list[Any]:
    try:
        from executorch.backends.apple.mps.partition.mps_partitioner import MPSPartitioner
        from executorch.exir.backend.compile_spec_schema import CompileSpec
    except ImportError as error:
        raise Unavailable(f"{error}") from None
    return [MPSPartitioner(compile_specs=[CompileSpec("use_fp16", bytes([False]))])]


def _vulkan() -> list[Any]:
    try:
        from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner
    except ImportError as error:
        raise Unavailable(f"{error}") from None
    return [VulkanPartitioner()]


def _qnn() -> list[Any]:
    try:
        from executorch.backends.qualcomm.partition.qnn_partitioner import QnnPartitioner  # noqa: F401
        from executorch.backends.qualcomm.utils.utils import generate_qnn_executorch_compiler_spec  # noqa: F401
    except Exception as error:  # noqa: BLE001 - the wheel's QNN package fails on import without the SDK
        raise Unavailable(f"{type(error).__name__}: {str(error)[:200]}; needs Qualcomm's QNN SDK (QNN_SDK_ROOT) and "
                          "ExecuTorch's QNN backend built against it (backends/qualcomm/scripts/build.sh): "
                          "neither is on the package index") from None
    raise Unavailable("the QNN partitioner imports, but lowering needs the QNN SDK's libraries (QNN_SDK_ROOT), "
                      "which are not on the package index")


def _arm_tosa() -> list[Any]:
    try:
        from executorch.backends.arm.arm_backend import ArmCompileSpecBuilder
        from executorch.backends.arm.tosa_partitioner import TOSAPartitioner
    except Exception as error:  # noqa: BLE001
        raise Unavailable(f"{type(error).__name__}: {str(error)[:200]}; needs the TOSA serialization libraries "
                          "executorch's examples/arm/setup.sh builds from source (tosa_tools v0.80 is not on the "
                          "package index) and, for Ethos-U, ethos-u-vela") from None
    return [TOSAPartitioner(ArmCompileSpecBuilder().tosa_compile_spec("TOSA-0.80+MI").build())]


def _openvino() -> list[Any]:
    try:
        from executorch.backends.openvino.partitioner import OpenvinoPartitioner
        from executorch.exir.backend.compile_spec_schema import CompileSpec
    except Exception as error:  # noqa: BLE001
        raise Unavailable(f"{type(error).__name__}: {str(error)[:200]}; needs the openvino and nncf packages in the "
                          "stack") from None
    return [OpenvinoPartitioner([CompileSpec("device", b"CPU")])]


BACKENDS: dict[str, Callable[[], list[Any]]] = {
    "coreml": _coreml,
    "mps": _mps,
    "vulkan": _vulkan,
    "qnn": _qnn,
    "arm-tosa": _arm_tosa,
    "openvino": _openvino,
}


def _fill_default_args() -> Any:
    """An edge pass putting back the trailing arguments torch.export drops when
    they equal their default (max_pool2d's stride, mean.dim's keepdim): 0.7's
    Core ML, MPS and Vulkan lowerings read node.args[2] unconditionally and fail
    with IndexError without them. An empty pooling stride means the kernel size."""
    from torch.fx.passes.infra.pass_base import PassBase, PassResult

    pools = ("max_pool2d", "max_pool2d_with_indices", "avg_pool2d", "max_pool1d", "avg_pool1d")

    class FillDefaultArgs(PassBase):
        def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
            changed = False
            for node in graph_module.graph.nodes:
                schema = getattr(node.target, "_schema", None)
                if node.op != "call_function" or schema is None:
                    continue
                args = list(node.args)
                for argument in schema.arguments[len(args):]:
                    if argument.kwarg_only or argument.name in node.kwargs or not argument.has_default_value():
                        break
                    args.append(argument.default_value)
                if schema.name.split("::")[-1] in pools and len(args) > 2 and not args[2]:
                    args[2] = list(args[1])
                if tuple(args) != tuple(node.args):
                    node.args = tuple(args)
                    changed = True
            graph_module.recompile()
            return PassResult(graph_module, changed)

    return FillDefaultArgs()


@contextlib.contextmanager
def _scratch_directory() -> Iterator[None]:
    """Core ML's preprocess writes ./tmp/<uuid>/ under the working directory: not into the repository."""
    before = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="upgrade-gate-backend-") as scratch:
        os.chdir(scratch)
        try:
            yield
        finally:
            os.chdir(before)


def failure_message(error: BaseException, stderr: str) -> str:
    """A backend's error; for a tool that failed (a CalledProcessError, raised or behind what was), the last
    lines it wrote to stderr first — what flatc said, not only its exit status."""
    cause: BaseException | None = error
    while cause is not None and not isinstance(cause, subprocess.CalledProcessError):
        cause = cause.__cause__ or cause.__context__
    said = [line.strip() for line in stderr.splitlines() if line.strip()][-CHILD_STDERR_LINES:]
    if cause is None or not said:
        return f"{type(error).__name__}: {str(error)[:MESSAGE_CHARS]}"
    tool = os.path.basename(str(cause.cmd[0] if isinstance(cause.cmd, list | tuple) else cause.cmd).split()[0])
    return f"{type(error).__name__}: {tool} said: {' | '.join(said)} ({error})"[:MESSAGE_CHARS]


def unavailable(name: str) -> str | None:
    """Why the backend's ahead-of-time tools are missing from this stack, or None: cheap, no lowering."""
    try:
        BACKENDS[name]()
    except Unavailable as why:
        return str(why)
    return None


def try_backend(name: str, module: torch.nn.Module, inputs: tuple[torch.Tensor, ...],
                delegation: Callable[[torch.fx.GraphModule], dict[str, Any]]) -> dict[str, Any]:
    """Lower ``module`` for one backend: ok (delegated share, .pte size), failed (the error) or unavailable (why)."""
    start = time.perf_counter()
    try:
        partitioners = BACKENDS[name]()
    except Unavailable as why:
        return {"status": "unavailable", "reason": str(why)}
    import torch
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    stderr: list[str] = []
    try:
        with _scratch_directory(), torch.no_grad(), stderr_kept(stderr):
            lowered = to_edge_transform_and_lower(
                torch.export.export(module, inputs), partitioner=partitioners,
                transform_passes=[_fill_default_args()],
                # Ops a partitioner keeps whole (Core ML keeps aten.linear) are not core ATen.
                compile_config=EdgeCompileConfig(_check_ir_validity=False))
            coverage = delegation(lowered.exported_program().graph_module)
            size = len(lowered.to_executorch().buffer)
    except Exception as error:  # noqa: BLE001 - a backend that cannot take the model is the finding
        return {"status": "failed", "error": failure_message(error, "".join(stderr)),
                "seconds": round(time.perf_counter() - start, 3)}
    coverage.pop("by_operator", None)
    return {"status": "ok", "bytes": size, "seconds": round(time.perf_counter() - start, 3), **coverage}
