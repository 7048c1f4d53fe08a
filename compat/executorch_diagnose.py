"""The candidate's culprit search (the Diagnoses capability of compat/contract.py, for
executorch_xnnpack.py): the parts of a method the XNNPACK delegate takes, the method lowered again with
some kept out, the lines of an export script that keep the culprit out, and the reproducers."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from . import reproducers
from .executorch_runtime import binding
from .search import culprit, issue_text, program_source
from .search.export_errors import source_line
from .search.quoting import python_comment, python_string

# What the remedy's code defines, passed as ``to_edge_transform_and_lower(..., partitioner=[partitioner])``.
REMEDY_NAME = "partitioner"


BACKEND = "XNNPACK delegate"
NOT_ALONE = ("quantized_decomposed.", "aten._assert_tensor_metadata")


def lowering_parts(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...],
                   start: Any = None) -> tuple[Any, list[dict[str, Any]]]:
    """The exported program and what the XNNPACK delegate took of it: one part per source call
    (``gelu_1``), with its kind, module path and the user's line. Where the program does not lower at all,
    every call is a part."""
    exported = lowering_start(module, inputs) if start is None else start
    try:
        lowered = lower_keeping_out(exported, frozenset())
    except Exception:  # noqa: BLE001 - a program that does not lower: any call may be behind it (the search says)
        portable: set[str] = set()
    else:
        portable = {culprit.source_key(node) for node in lowered.exported_program().graph.nodes
                    if node.op == "call_function" and "delegate" not in node.name
                    and node.target.__name__ != "getitem"}
    parts, seen = [], set()
    for node in exported.graph.nodes:
        key = culprit.source_key(node)
        if node.op != "call_function" or key in portable or key in seen or node.target.__name__ == "getitem":
            continue
        seen.add(key)
        parts.append({**call_site(node), "kind": operator_kind(node), "backend": BACKEND, "quantized": quantized(node),
                      # A quantization's own operators (and a metadata assert) are pieces of a pattern the delegate
                      # fuses, not operators to lower alone (alone, the runtime may abort on them).
                      "runs_alone": not str(node.target).startswith(NOT_ALONE)})
    return exported, parts


def call_site(node: Any) -> dict[str, str]:
    """Where the model makes a call of the exported program: its source call (culprit.source_key), the innermost
    module's path and the user's line."""
    modules = list(node.meta.get("nn_module_stack", {}).values())
    return {"key": culprit.source_key(node), "module": modules[-1][0] if modules else "",
            "source": source_line(node.meta.get("stack_trace") or "", {}) or ""}


def lowering_start(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> Any:
    """What the lowering starts from: the exported program."""
    return torch.export.export(module, inputs)


def quantized(node: Any) -> bool:
    """A call the quantizer annotated: one of its inputs is dequantized (the pattern the delegate fuses into a
    quantized kernel), not itself a quantize or dequantize."""
    def dequantized(arg: Any) -> bool:
        return getattr(arg, "op", None) == "call_function" and "dequantize" in str(arg.target)

    return "quantize" not in str(node.target) and any(dequantized(a) for a in node.all_input_nodes)


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
    return _lowered(exported, _partitioner(keep_out))


def lower_with_remedy(remedy: dict[str, Any]) -> Any:
    """The program the remedy's lines left in ``program`` (rewritten, or as exported) lowered with the
    ``partitioner`` they made."""
    return _lowered(remedy["program"], remedy[REMEDY_NAME])


def _lowered(exported: Any, partitioner: Any) -> Any:
    """Lowered to XNNPACK (a copy: the search lowers the same program again)."""
    import executorch.kernels.quantized  # noqa: F401 - portable kernels for a quantized program's kept-out operators
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


# Culprit kinds with a rewrite into operators the delegate takes, exact in float: the remedy a team tries first,
# since the rewritten calls stay in the delegate where a kind kept out goes to a portable kernel (tanh GELU in a
# ViT's MLP, 768→3072→768: ×1.31 the shipped latency decomposed, ×3.04 kept out; docs/report.md). Each entry: the
# operator the decomposition table maps, and the function, which returns NotImplemented for the calls it leaves
# as they are (run_decompositions then keeps the operator), by its name.
DECOMPOSITIONS = {
    "aten.gelu.default(approximate='tanh')": ("torch.ops.aten.gelu.default", "tanh_gelu", '''\
def tanh_gelu(x, approximate="none"):
    """GELU's tanh approximation as its formula: multiplies, adds and a tanh, all of which XNNPACK takes."""
    if approximate != "tanh":
        return NotImplemented  # the exact GELU is not this culprit: left as it is
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))
'''),
}


# Activations XNNPACK fuses into the operator before them (its FuseActivationPass: the op's output clamped in
# place), with the same function as a clamp, which the delegate takes as an operator of its own: exact, and still
# delegated (ExecuTorch 0.7 computes a broadcast multiply fused with a ReLU wrong, the multiply and the ReLU
# each right alone: docs/report.md). Each entry as DECOMPOSITIONS'.
FUSED_ACTIVATIONS = {
    "aten.relu.default": ("torch.ops.aten.relu.default", "relu_unfused", '''\
def relu_unfused(x):
    """ReLU as a clamp, which the delegate runs as its own operator instead of fusing it into the one before."""
    return torch.clamp(x, min=0.0)
'''),
    "aten.hardtanh.default": ("torch.ops.aten.hardtanh.default", "hardtanh_unfused", '''\
def hardtanh_unfused(x, min_val=-1.0, max_val=1.0):
    """Hardtanh as a clamp, which the delegate runs as its own operator instead of fusing it into the one before."""
    return torch.clamp(x, min_val, max_val)
'''),
}


def _rewrite_code(rewrites: list[tuple[str, str, str]]) -> str:
    """The lines that rewrite the exported program with ``rewrites`` (the operator, the function's name, its
    code) before it is lowered, and the partitioner as shipped."""
    functions = [code.rstrip() for _, _, code in rewrites]
    table = ", ".join(f"{operator}: {name}" for operator, name, _ in rewrites)
    needs_math = any("math." in code for code in functions)  # the tanh-GELU rewrite's sqrt(2/pi); a clamp's none
    lines = [*(["import math", ""] if needs_math else []), "import torch",
             "from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner", "", "",
             "\n\n\n".join(functions), "", "",
             "# program: the exported program, rewritten before it is lowered",
             f"program = program.run_decompositions({{{table}}})", "partitioner = XnnpackPartitioner()"]
    return "\n".join(lines) + "\n"


def remedy_options(exported: Any, culprits: list[tuple[str, str]], *,
                   fused: Sequence[str] = ()) -> list[tuple[str, str, bool]]:
    """The remedies a team would try, the one expected cheapest first: in a quantized program whose dynamically
    quantized inputs are shared, each call given its own quantization; for a fused pair, its activation written
    as the operator the delegate does not fuse; each culprit rewritten into operators the delegate takes (where
    every culprit kind has such a rewrite), then each kept out of the delegate, narrowed to the calls its
    arguments single out; last, where that narrows, every call of each kind kept out, as the search did (tried
    only when nothing before it passes)."""
    kinds = list(dict.fromkeys(kind for kind, _ in culprits))
    options = []
    shared = shared_dynamic_quantizations(exported)
    if culprits and shared:
        calls = sum(len(users) for users in shared.values())
        options.append((f"each call given its own dynamic quantization of its input ({len(shared)} shared by {calls} "
                        "calls)", SPLIT_DYNAMIC_QUANTIZATION, False))
    activations = [kind.partition("(")[0] for kind in fused]  # "aten.hardtanh.default(0.0, 6.0)": its operator
    unfused = [FUSED_ACTIVATIONS[kind] for kind in dict.fromkeys(activations) if kind in FUSED_ACTIVATIONS]
    if unfused:
        options.append(("the activation written as a clamp, which the delegate runs without fusing it",
                        _rewrite_code(unfused), False))
    if kinds and all(kind in DECOMPOSITIONS for kind in kinds):
        options.append(("rewritten into operators the delegate takes",
                        _rewrite_code([DECOMPOSITIONS[kind] for kind in kinds]), False))
    narrowed, whole = kept_out_code(exported, culprits), kept_out_code(exported, culprits, narrowed=False)
    options.append(("kept out of the delegate", narrowed, False))
    if whole != narrowed:  # the narrowing missed what the search kept out: every call of the kind, as it did
        options.append(("every call of the kind kept out of the delegate", whole, True))
    return options


# A dynamically quantized input shared by several linears (q, k and v of an attention read one quantization of
# their input) is lowered wrong by ExecuTorch 0.7's XNNPACK (the prefill's KV cache comes back zero); export_llama
# gives each linear its own chain after convert_pt2e (DuplicateDynamicQuantChainPass, which needs the quantizer's
# annotations: it does nothing on an exported program). The remedy, as lines run on the exported program.
SPLIT_DYNAMIC_QUANTIZATION = '''\
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner


def split_dynamic_quantization(graph_module):
    \"\"\"Each call that reads a shared dynamically quantized input gets its own choose_qparams → quantize →
    dequantize, as ExecuTorch's DuplicateDynamicQuantChainPass does before export (export_llama runs it).\"\"\"
    graph = graph_module.graph
    for dq in list(graph.nodes):
        q = dq.args[0] if dq.op == "call_function" and dq.args else None
        if "dequantize_per_tensor.tensor" not in str(dq.target) or "quantize_per_tensor.tensor" not in str(
                getattr(q, "target", "")) or len(dq.users) < 2:
            continue
        scale, zero_point = q.args[1], q.args[2]
        for user in list(dq.users)[1:]:
            copies = {}
            with graph.inserting_before(user):
                for node in (scale.args[0], scale, zero_point, q, dq):  # choose_qparams first
                    copies[node] = graph.node_copy(node, lambda n: copies.get(n, n))
            user.replace_input_with(dq, copies[dq])
    graph.lint()
    graph_module.recompile()


split_dynamic_quantization(program.graph_module)
partitioner = XnnpackPartitioner()
'''


def shared_dynamic_quantizations(exported: Any) -> dict[str, list[str]]:
    """Each dynamically quantized input (a dequantize of a ``choose_qparams``' quantization) that several calls
    read: its node's name → the calls, in graph order."""
    shared = {}
    for node in exported.graph.nodes:
        if node.op != "call_function" or "dequantize_per_tensor.tensor" not in str(node.target):
            continue
        users = [user.name for user in node.users if user.op == "call_function"]
        if len(users) > 1:
            shared[node.name] = users
    return shared


def kept_out_code(exported: Any, culprits: list[tuple[str, str]], *, narrowed: bool = True) -> str:
    """The lines of an export script that keep each culprit kind out of the delegate: its partitioner config
    narrowed by the string arguments of its first call (``approximate='tanh'``), or left out where it has none
    or ``narrowed`` is False. Numbers are never narrowed on: at partition time a Python scalar argument is a
    lifted tensor-constant node, so ``node.args[1] == 4.0`` would never match and keep nothing out."""
    from executorch.backends.xnnpack.partition.config import ALL_PARTITIONER_CONFIGS
    from executorch.exir.backend.canonical_partitioners.config_partitioner import format_target_name

    calls = [n for n in exported.graph.nodes if n.op == "call_function"]
    nodes = {culprit.source_key(n): n for n in calls}
    first_of: dict[str, Any] = {}  # a culprit found in a block of the method: its kind's first call in the method
    for node in calls:
        first_of.setdefault(operator_kind(node), node)
    kinds = [(kind, node) for kind, key in culprits if (node := nodes.get(key, first_of.get(kind))) is not None]
    by_target = {config.target_name: config for config in ALL_PARTITIONER_CONFIGS}
    lines = ["from executorch.backends.xnnpack.partition.config import ALL_PARTITIONER_CONFIGS"]
    replaced: dict[str, str] = {}
    classes: list[str] = []
    for kind, node in kinds:
        config = by_target.get(format_target_name(node.target.__name__))
        if config is None:
            continue
        lines.append(f"from {config.__module__} import {config.__name__}")
        conditions = [f"node.args[{i}] == {python_string(a)}" for i, a in enumerate(node.args) if isinstance(a, str)]
        conditions += [f"node.kwargs.get({python_string(k)}) == {v if isinstance(v, bool) else python_string(v)}"
                       for k, v in node.kwargs.items() if isinstance(v, (bool, str))]
        conditions = conditions if narrowed else []
        if not conditions:
            replaced[config.__name__] = ""
            continue
        name = f"{config.__name__}KeepingOut"
        replaced[config.__name__] = name
        classes += ["", "", python_comment(f"{kind} stays out of XNNPACK: ExecuTorch's portable kernel runs it."),
                    f"class {name}({config.__name__}):", "    def check_constraints(self, node, ep):",
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


def reproducer_source(*, kind: str, call: str, arguments: int, threshold: float, remedy: str, found_in: str) -> str:
    """A standalone script (torch and executorch only) that lowers one operator on its real inputs and
    exits 1 while the lowered result differs from eager."""
    from importlib.metadata import version

    return reproducers.executorch_operator(kind=kind, executorch=version("executorch"), found_in=found_in, call=call,
                                           arguments=arguments, threshold=threshold, remedy=remedy)


def method_reproducer(exported: Any, inputs: tuple[torch.Tensor, ...], folder: Path, *, kind: str,
                      threshold: float | list[float], remedy: str, found_in: str, fails_with: str = "",
                      program: str = "the whole method") -> None:
    """Where the culprit does not fail alone: the exported program of the whole method (or of ``program``, a
    block of it), its inputs and a standalone script (torch and executorch only) in ``folder``, with the same
    exits."""
    from importlib.metadata import version

    torch.export.save(exported, folder / "program.pt2")
    unwritten = program_source.write(exported, folder, found_in.split(":")[0])
    source_note = (f"no program.py: {unwritten}" if unwritten
                   else "the compare kept program.py only where `--from-source` answered as program.pt2 does")
    culprit.write_reproducer(folder, inputs, reproducers.executorch_method(
        kind=kind, executorch=version("executorch"), found_in=found_in, program=program, saved_by=torch.__version__,
        source_note=source_note, threshold=threshold, remedy=remedy, fails_with=fails_with,
        fails_as_found=issue_text.FAILS_AS_FOUND))


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
    # Each option as a team's script runs it, as far as dynamo's caches go: after the options that failed, draft_export
    # made data-dependent-branch 3,264 bytes, alone 3,136. The reset made it 3,136 in one run and not in another, so
    # the migration checks such a program by its outputs (upgrade_gate.migrate).
    torch._dynamo.reset()
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
