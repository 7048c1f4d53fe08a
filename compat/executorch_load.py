"""A program that lowers to XNNPACK and fails when the runtime loads it (the AnswersLoadFailures capability of
compat/contract.py, for executorch_xnnpack.py): the node XNNPACK's compiler names in its own words ("Failed to
create cat3 node 52 with code: xnn_status_invalid_parameter") matched to the calls of the exported program that
make it, the code of that call alone for a reproducer, and the remedies the runtime's words point at.

torch is imported inside the functions: the words are read, and tested, without a stack."""

from __future__ import annotations

import math
import re
from typing import Any

# What XNNPACK's compiler says of the node it could not create; the digits after a concatenation's name are its
# number of inputs (cat3: three).
XNN_NODE = re.compile(r"Failed to create (?P<node>[A-Za-z_]+?)(?P<inputs>\d*) node (?P<id>\d+) "
                      r"with code: (?P<code>\w+)")
# XNNPACK's node names upgrade-gate maps to the operator of the exported program that defines them (yolov8n int8:
# its C2f blocks' concatenations, and once those load, its head's subtraction).
XNN_OPERATORS = {"cat": "aten.cat.default", "XNNSubtract": "aten.sub.Tensor", "XNNAdd": "aten.add.Tensor",
                 "XNNMultiply": "aten.mul.Tensor"}
CONCAT = "aten.cat.default"
BACKEND = "XNNPACK delegate"
QUANTIZE = "quantized_decomposed.quantize_per_tensor.default"
DEQUANTIZE = "quantized_decomposed.dequantize_per_tensor.default"


def runtime_node(said: str) -> dict[str, Any] | None:
    """The node XNNPACK's compiler could not create, as its words name it: its name, inputs, id and code; None where
    they name none."""
    found = XNN_NODE.search(said)
    if found is None:
        return None
    line = next(part for part in said.split(" · ") if found.group(0) in part)  # runtime_said joins lines so
    return {"node": found["node"], "inputs": int(found["inputs"]) if found["inputs"] else None,
            "id": int(found["id"]), "code": found["code"], "said": line.removeprefix("the runtime said: ")}


def load_culprits(exported: Any, said: str) -> dict[str, Any]:
    """The search's finding for a method whose program fails to load with the runtime's words ``said``: the calls of
    the operator XNNPACK named, of its number of inputs, those whose inputs are not quantized as its output is first
    (what XNNPACK's concatenate refuses); or why none is named."""
    from .executorch_diagnose import call_site

    node = runtime_node(said)
    if node is None:
        return {"status": "not pinned", "reason": "the runtime's words name no XNNPACK node: "
                + (said[:300] or "it said nothing on stderr")}
    operator = XNN_OPERATORS.get(node["node"])
    if operator is None:
        return {"status": "not pinned", "reason": f"the runtime said {node['said']!r}: XNNPACK's "
                f"{node['node']} node is not one upgrade-gate maps to an operator of the program", "runtime": node}
    calls = [n for n in exported.graph.nodes if n.op == "call_function" and str(n.target) == operator
             and (node["inputs"] is None or len(_inputs_of(n)) == node["inputs"])]
    departs = {n: unshared_inputs(n) for n in calls}
    unshared = [n for n in calls if departs[n]]
    if not calls:
        return {"status": "not pinned", "runtime": node,
                "reason": f"the runtime said {node['said']!r}, and the program makes no such {operator} call"}
    named = f"{operator} ({node['inputs']} inputs)" if node["inputs"] else operator
    why = (f"{len(unshared)} of its {len(calls)} call(s) take inputs not quantized as the output is"
           + (" (XNNPACK's concatenate takes only its output's scale and zero point)" if operator == CONCAT else "")
           if unshared else f"{len(calls)} call(s), none with inputs quantized otherwise than the output")
    return {"status": "found", "rel_l2": math.inf, "runtime": node,
            "reason": f"the runtime said: {node['said']}; {why}",
            "culprits": [{"operator": named, "backend": BACKEND, "share": 1.0, "rel_l2_without": math.nan,
                          "calls": [{**call_site(n), "inputs": departs[n]} for n in unshared or calls]}]}


def _inputs_of(call: Any) -> list[Any]:
    """A call's tensor inputs: a concatenation's list, a binary operator's two arguments."""
    return list(call.args[0]) if str(call.target) == CONCAT else list(call.args[:2])


def unshared_inputs(call: Any) -> list[str]:
    """How each input of a quantized call (its output quantized per tensor) departs from its output's
    quantization: ``input 0: float`` or ``input 2: scale 0.0087, zero point -91``; empty where none does."""
    output = [user for user in call.users if str(user.target) == QUANTIZE]
    if len(output) != 1:
        return []
    wanted = tuple(output[0].args[1:])
    said = []
    for index, given in enumerate(_inputs_of(call)):
        if str(getattr(given, "target", "")) != DEQUANTIZE:
            said.append(f"input {index}: float")
        elif tuple(given.args[1:]) != wanted:
            said.append(f"input {index}: scale {given.args[1]:.4g}, zero point {given.args[2]}")
    return [*said, f"output: scale {wanted[0]:.4g}, zero point {wanted[1]}"] if said else []


def load_call_code(exported: Any, key: str, arguments: tuple[Any, ...]) -> tuple[str, list[Any]]:
    """The call ``key`` alone as a reproducer's code on the real tensors that reached it (``arguments``: its
    arguments as captured): each input quantized and dequantized as the program does, the call, and its output's
    quantization where it has one, so that the lowering sees the pattern the program has."""
    from .search.culprit import source_key

    call = next(n for n in exported.graph.nodes if n.op == "call_function" and source_key(n) == key)
    output = next((user for user in call.users if str(user.target) == QUANTIZE), None)

    def quantized(code: str, params: tuple[Any, ...]) -> str:
        shown = ", ".join(str(p) if "torch." in str(p) else repr(p) for p in params)
        return f"torch.ops.{DEQUANTIZE}(torch.ops.{QUANTIZE}({code}, {shown}), {shown})"

    concat = str(call.target) == CONCAT
    values = list(arguments[0]) if concat else list(arguments[:2])
    tensors: list[Any] = []
    inputs = []
    for given, value in zip(_inputs_of(call), values):
        if getattr(given, "op", None) is None:  # a Python number: written as it is
            inputs.append(repr(given))
            continue
        tensors.append(value)
        name = f"x{len(tensors) - 1}"
        dequantized = str(getattr(given, "target", "")) == DEQUANTIZE
        inputs.append(quantized(name, tuple(given.args[1:])) if dequantized else name)
    rest = "".join(f", {a!r}" for a in call.args[1 if concat else 2:])
    listed = ", ".join(inputs)
    made = f"torch.ops.{call.target}({f'[{listed}]' if concat else listed}{rest})"
    return (quantized(made, tuple(output.args[1:])) if output is not None else made), tensors


def load_remedy_options(exported: Any, found: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """The remedies for the calls XNNPACK refused, the one expected cheapest first, as remedy_options gives them:
    a concatenation's inputs quantized as its output is (exact: the output is quantized so in any case), then the
    calls kept out of the delegate (which a layout pass may refuse to lower: "non-NHWC compatible node")."""
    from .executorch_diagnose import kept_out_code, operator_kind
    from .search.culprit import source_key

    options = []
    culprits = found.get("culprits") or []
    calls = [call for c in culprits for call in c["calls"]]
    if any(call.get("inputs") for c in culprits if c["operator"].startswith(CONCAT) for call in c["calls"]):
        options.append(("each input of the concatenation quantized as its output is, as XNNPACK's concatenate "
                        "requires", CONCAT_QUANTIZED_AS_OUTPUT, False))
    nodes = {source_key(n): n for n in exported.graph.nodes if n.op == "call_function"}
    kept = [(operator_kind(nodes[call["key"]]), call["key"]) for call in calls if call["key"] in nodes]
    if kept:
        options.append(("kept out of the delegate", kept_out_code(exported, kept[:1]), False))
    return options


# A concatenation whose output the quantizer quantized, but not each of its inputs alike (ultralytics' C2f: a split
# output that the shortcut's add also reads stays float): XNNPACK 0.7 lowers it and refuses it at load. The remedy,
# as lines run on the exported program.
CONCAT_QUANTIZED_AS_OUTPUT = '''\
import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner


def concat_inputs_quantized_as_output(program):
    \"\"\"The program exported again with each input of a quantized concatenation quantized as its output is:
    XNNPACK's concatenate takes only inputs of its output's scale and zero point. Exact: the concatenation's
    output is quantized so anyway. Rewritten on the program's module and exported again, so that every node
    torch.export records is its own.\"\"\"
    quantize = torch.ops.quantized_decomposed.quantize_per_tensor.default
    dequantize = torch.ops.quantized_decomposed.dequantize_per_tensor.default
    module = program.module()
    graph = module.graph
    for cat in [node for node in graph.nodes if node.target == torch.ops.aten.cat.default]:
        output = [user for user in cat.users if user.target == quantize]
        if len(output) != 1:
            continue
        params = tuple(output[0].args[1:])  # scale, zero point, min, max, dtype
        inputs = []
        for given in cat.args[0]:
            if given.target == dequantize and tuple(given.args[1:]) == params:
                inputs.append(given)
                continue
            with graph.inserting_before(cat):
                quantized = graph.call_function(quantize, (given, *params))
                inputs.append(graph.call_function(dequantize, (quantized, *params)))
        cat.args = (inputs, *cat.args[1:])
    graph.lint()
    module.recompile()
    args, kwargs = program.example_inputs
    return torch.export.export(module, args, kwargs)


program = concat_inputs_quantized_as_output(program)
partitioner = XnnpackPartitioner()
'''


def load_reproducer_source(*, kind: str, call: str, arguments: int, threshold: float, remedy: str, found_in: str,
                           fails_with: str) -> str:
    """A standalone script (torch and executorch only) that lowers the call alone on its real inputs and exits 1
    while its program fails to load with ``fails_with`` (0 with ``--with-remedy`` when the remedy fixes it)."""
    from importlib.metadata import version

    from . import reproducers

    return reproducers.executorch_operator(kind=kind, executorch=version("executorch"), found_in=found_in, call=call,
                                           arguments=arguments, threshold=threshold, remedy=remedy,
                                           fails_with=fails_with)
