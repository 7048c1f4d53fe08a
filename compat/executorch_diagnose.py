"""The candidate's culprit search (the Diagnoses capability of compat/contract.py, for
executorch_xnnpack.py): the parts of a method the XNNPACK delegate takes, the method lowered again with
some kept out, the lines of an export script that keep the culprit out, and the reproducers."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from . import culprit
from .executorch_runtime import binding

# What the remedy's code defines, passed as ``to_edge_transform_and_lower(..., partitioner=[partitioner])``.
REMEDY_NAME = "partitioner"


BACKEND = "XNNPACK delegate"


def lowering_parts(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> tuple[Any, list[dict[str, Any]]]:
    """The exported program and what the XNNPACK delegate took of it: one part per source call
    (``gelu_1``), with its kind, module path and the user's line."""
    from .export_errors import source_line

    exported = torch.export.export(module, inputs)
    lowered = lower_keeping_out(exported, frozenset())
    portable = {culprit.source_key(node) for node in lowered.exported_program().graph.nodes
                if node.op == "call_function" and "delegate" not in node.name and node.target.__name__ != "getitem"}
    parts, seen = [], set()
    for node in exported.graph.nodes:
        key = culprit.source_key(node)
        if node.op != "call_function" or key in portable or key in seen or node.target.__name__ == "getitem":
            continue
        seen.add(key)
        modules = list(node.meta.get("nn_module_stack", {}).values())
        parts.append({"key": key, "kind": operator_kind(node), "backend": BACKEND,
                      "module": modules[-1][0] if modules else "",
                      "source": source_line(node.meta.get("stack_trace") or "", {}) or ""})
    return exported, parts


def operator_kind(node: Any) -> str:
    """The operator and the arguments that tell its calls apart in a lowering: scalars and strings
    (``approximate='tanh'``), not tensors or shapes."""
    def plain(value: Any) -> bool:
        return isinstance(value, (bool, int, float, str)) or value is None

    shown = [repr(a) for a in node.args if plain(a)] + [f"{k}={v!r}" for k, v in node.kwargs.items() if plain(v)]
    return f"{node.target}({', '.join(shown)})" if shown else str(node.target)


def lower_keeping_out(exported: Any, keep_out: frozenset[str]) -> Any:
    """The exported program lowered as ``lower`` does, the source calls in ``keep_out`` left to the
    portable kernels."""
    return lower_with_remedy(exported, _partitioner(keep_out))


def lower_with_remedy(exported: Any, partitioner: Any) -> Any:
    """The exported program lowered with a remedy's own partitioner (a copy: the search lowers it again)."""
    from executorch.exir import to_edge_transform_and_lower

    return to_edge_transform_and_lower(copy.deepcopy(exported), partitioner=[partitioner])


def _partitioner(keep_out: Iterable[str]) -> Any:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    kept = frozenset(keep_out)
    partitioner = XnnpackPartitioner()
    for config in partitioner.target_partitioner_configs.values():
        def check(node: Any, ep: Any, original: Any = config.check_constraints) -> bool:
            return culprit.source_key(node) not in kept and original(node, ep)
        config.check_constraints = check
    return partitioner


def run_lowered(lowered: Any, inputs: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    """A lowered program serialized and run in this process's runtime, as the artifact would be."""
    program = lowered.to_executorch()
    return list(binding._load_for_executorch_from_buffer(program.buffer).forward(tuple(inputs)))


def remedy_code(exported: Any, culprits: list[tuple[str, str]]) -> str:
    """The lines of an export script that keep each culprit kind out of the delegate: its partitioner
    config narrowed by the arguments of its first call that make it a culprit (or left out where it has
    none)."""
    from executorch.backends.xnnpack.partition.config import ALL_PARTITIONER_CONFIGS
    from executorch.exir.backend.canonical_partitioners.config_partitioner import format_target_name

    nodes = {culprit.source_key(n): n for n in exported.graph.nodes if n.op == "call_function"}
    kinds = [(kind, nodes[key]) for kind, key in culprits if key in nodes]
    by_target = {config.target_name: config for config in ALL_PARTITIONER_CONFIGS}
    lines = ["from executorch.backends.xnnpack.partition.config import ALL_PARTITIONER_CONFIGS"]
    replaced: dict[str, str] = {}
    classes: list[str] = []
    for kind, node in kinds:
        config = by_target.get(format_target_name(node.target.__name__))
        if config is None:
            continue
        lines.append(f"from {config.__module__} import {config.__name__}")
        conditions = [f"node.args[{i}] == {a!r}" for i, a in enumerate(node.args)
                      if isinstance(a, (bool, int, float, str))]
        conditions += [f"node.kwargs.get({k!r}) == {v!r}" for k, v in node.kwargs.items()
                       if isinstance(v, (bool, int, float, str))]
        if not conditions:
            replaced[config.__name__] = ""
            continue
        name = f"{config.__name__}KeepingOut"
        replaced[config.__name__] = name
        classes += ["", "", f"class {name}({config.__name__}):",
                    f'    """{kind} stays out of XNNPACK: ExecuTorch\'s portable kernel runs it."""', "",
                    "    def check_constraints(self, node, ep):",
                    f"        if {' and '.join(conditions)}:", "            return False",
                    "        return super().check_constraints(node, ep)"]
    lines.append("from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner")
    lines += classes
    swaps = [f"{new} if c is {old}" for old, new in replaced.items() if new]
    dropped = [old for old, new in replaced.items() if not new]
    chosen = "c"
    for swap in swaps:
        chosen = f"{swap} else {chosen}"
    keep = f" if c not in ({', '.join(dropped)},)" if dropped else ""
    lines += ["", "", f"partitioner = XnnpackPartitioner(configs=[{chosen} for c in ALL_PARTITIONER_CONFIGS{keep}])"]
    return "\n".join(lines) + "\n"


REPRODUCER = '''"""{kind}: ExecuTorch {executorch}'s XNNPACK delegate differs from eager.

Found by upgrade-gate in {found_in}
inputs.pt holds the real tensors that reached that call. Run with the Python of a venv that has
torch and executorch:

    python repro.py                  # exit 1: the lowered operator differs from eager
    python repro.py --with-remedy    # the same, lowered with the remedy below: exit 0 when it fixes it
"""

import os
import sys
from pathlib import Path

import torch

# ExecuTorch runs flatc from its own venv's bin/ while lowering.
os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")

from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner  # noqa: E402
from executorch.exir import to_edge_transform_and_lower  # noqa: E402
from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer  # noqa: E402

THRESHOLD = {threshold!r}  # relative L2 error against eager: the numerics gate's


class Operator(torch.nn.Module):
    def forward(self, {names}):
        return {call}


def remedy():
{remedy}    return partitioner


inputs = tuple(torch.load(Path(__file__).with_name("inputs.pt")))
eager = Operator()(*inputs)
partitioner = remedy() if "--with-remedy" in sys.argv else XnnpackPartitioner()
program = to_edge_transform_and_lower(torch.export.export(Operator(), inputs), partitioner=[partitioner])
lowered = _load_for_executorch_from_buffer(program.to_executorch().buffer).forward(inputs)[0]
error = (torch.linalg.vector_norm((lowered - eager).double()) / torch.linalg.vector_norm(eager.double())).item()
how = "with the remedy" if "--with-remedy" in sys.argv else "to XNNPACK"
print(f"torch {{torch.__version__}}: {kind} lowered {{how}}: "
      f"relative L2 error {{error:.3g}} against eager (threshold {{THRESHOLD:g}}), "
      f"largest difference {{(lowered - eager).abs().max().item():.3g}}")
sys.exit(1 if error > THRESHOLD else 0)
'''


def reproducer_source(*, kind: str, call: str, arguments: int, threshold: float, remedy: str, found_in: str) -> str:
    """A standalone script (torch and executorch only) that lowers one operator on its real inputs and
    exits 1 while the lowered result differs from eager."""
    from importlib.metadata import version

    return REPRODUCER.format(kind=kind, executorch=version("executorch"), found_in=found_in, threshold=threshold,
                             names=", ".join(f"x{i}" for i in range(arguments)), call=call,
                             remedy=culprit.indented(remedy))


METHOD_REPRODUCER = '''"""{kind}: ExecuTorch {executorch}'s XNNPACK lowering of a method differs from eager.

Found by upgrade-gate in {found_in}
The operator alone on its real inputs does not show it, so this is the whole method: program.pt2 is
its exported program (torch.export.save), inputs.pt its real inputs. Run with the Python of a venv
that has torch and executorch:

    python repro.py                  # exit 1: the lowered method differs from eager
    python repro.py --with-remedy    # the same, lowered with the remedy below: exit 0 when it fixes it
"""

import os
import sys
from pathlib import Path

import torch

# ExecuTorch runs flatc from its own venv's bin/ while lowering.
os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")

from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner  # noqa: E402
from executorch.exir import to_edge_transform_and_lower  # noqa: E402
from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer  # noqa: E402

THRESHOLD = {threshold!r}  # relative L2 error against eager: the numerics gate's


def remedy():
{remedy}    return partitioner


here = Path(__file__).parent
program = torch.export.load(here / "program.pt2")
inputs = tuple(torch.load(here / "inputs.pt"))
eager = torch.utils._pytree.tree_leaves(program.module()(*inputs))
partitioner = remedy() if "--with-remedy" in sys.argv else XnnpackPartitioner()
lowered = to_edge_transform_and_lower(program, partitioner=[partitioner])
outputs = _load_for_executorch_from_buffer(lowered.to_executorch().buffer).forward(inputs)
error = max((torch.linalg.vector_norm((a - e).double()) / torch.linalg.vector_norm(e.double())).item()
            for a, e in zip(outputs, eager))
how = "with the remedy" if "--with-remedy" in sys.argv else "to XNNPACK"
print(f"torch {{torch.__version__}}: the method lowered {{how}}: "
      f"relative L2 error {{error:.3g}} against eager (threshold {{THRESHOLD:g}})")
sys.exit(1 if error > THRESHOLD else 0)
'''


def method_reproducer(exported: Any, inputs: tuple[torch.Tensor, ...], folder: Path, *, kind: str, threshold: float,
                      remedy: str, found_in: str) -> None:
    """Where the culprit does not fail alone: the whole method's exported program, its inputs and a
    standalone script (torch and executorch only) in ``folder``, with the same exits."""
    from importlib.metadata import version

    torch.export.save(exported, folder / "program.pt2")
    culprit.write_reproducer(folder, inputs, METHOD_REPRODUCER, kind=kind, executorch=version("executorch"),
                             found_in=found_in, threshold=threshold, remedy=remedy)


# A method whose export failed is exported again with the export API's other options, in order, as an export
# script writes them (torch ≥ 2.8 exports non-strict by default: the first is what the stack ran). strict=True
# traces with TorchDynamo instead; draft_export goes through data-dependent decisions by specializing each to
# the example inputs' values, and says which (a program that is only right for inputs that decide the same).
EXPORT_REMEDIES = (
    ("as configured", "program = torch.export.export(model, example_inputs)"),
    ("strict", "program = torch.export.export(model, example_inputs, strict=True)"),
    ("draft_export", "program = torch.export.draft_export(model, example_inputs)"),
)


def export_with(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], code: str) -> tuple[Any, list[str]]:
    """The exported program ``code`` makes (``program``), and what it assumed of the example inputs: each
    data-dependent decision draft_export specialized, with the user's line that made it."""
    scope: dict[str, Any] = {"torch": torch, "model": module, "example_inputs": inputs}
    exec(compile(code, "<export remedy>", "exec"), scope)  # noqa: S102 - one of EXPORT_REMEDIES
    program = scope["program"]
    assumed = []
    for failure in getattr(getattr(program, "_report", None), "failures", ()):
        data = getattr(failure, "data", {}) or {}
        frames = [f for f in data.get("user_stack", []) if isinstance(f, dict) and f.get("loc")]
        where = f" at line {frames[-1]['line']}, `{frames[-1]['loc']}`" if frames else ""
        kind = str(getattr(failure.failure_type, "name", failure.failure_type)).lower().replace("_", " ")
        taken = f": `{data['expr']}` taken as {data['result']}" if "expr" in data and "result" in data else ""
        assumed.append(f"{kind}{taken}{where}")
    return program, assumed
