"""A method's first repeated block (a decoder's ``layers.0``) as a program of its own, on the real tensors
that reached it in one eager run of the method.

A culprit search lowers its program again for every try. A 30-layer LLM's int8 decode takes 117–156 s a
lowering on 2 cores; its first layer alone lowers in about 13 s (docs/benchmarks.md). Where the block,
lowered alone, departs from the block run eagerly, the search runs on the block and its reproducer is the
block; the remedies are still judged on the whole method. Torch only (``torch.export``'s graph and
``nn_module_stack``), imported where it is used, so that the phase loads without it (the unit tests); no API
newer than torch 2.2.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from ..common import flat
from ..search import culprit


@dataclass
class Block:
    """A method's first repeated block as a program of its own, where the search runs when it departs as lowered
    (``departing``): its path, how many blocks the method has, its real inputs and eager outputs, and its share
    of the method's threshold (the threshold over the blocks: blocks each within their share keep the method
    within about its threshold, so a method past it has a block past its share)."""

    path: str
    of: int
    module: Any
    inputs: tuple[Any, ...]
    eager: list[Any]
    threshold: float

    def said(self) -> str:
        return f"{self.path} (one of the method's {self.of} blocks) as a program of its own"


# A member of a module list or Sequential: its parent's path and its index (``llama.layers`` and 0).
MEMBER = re.compile(r"^(.+)\.(\d+)$")


def first_block(exported: Any) -> tuple[str, int] | None:
    """The first member of the list of blocks that holds most of the graph's calls (``llama.layers.0``), and how
    many blocks the list has; None where no list has two of one class (a Sequential of a Linear, a GELU and a
    Linear is no list of blocks)."""
    calls: dict[str, int] = {}  # the list's path → its members' calls
    members: dict[str, dict[int, str]] = {}  # the list's path → each member's class
    for node in exported.graph.nodes:
        if node.op != "call_function":
            continue
        for path, kind in (node.meta.get("nn_module_stack") or {}).values():
            found = MEMBER.match(str(path))
            if found:
                calls[found.group(1)] = calls.get(found.group(1), 0) + 1
                members.setdefault(found.group(1), {})[int(found.group(2))] = str(kind)
    lists = [path for path in calls if len(members[path]) >= 2 and len(set(members[path].values())) == 1]
    if not lists:
        return None
    biggest = max(lists, key=lambda path: calls[path])
    return f"{biggest}.{min(members[biggest])}", len(members[biggest])


def block_program(exported: Any, inputs: tuple[Any, ...], block: str) -> tuple[Any, tuple[Any, ...]] | None:
    """The calls of ``block`` (every call from its first to its last, in graph order, and the constant calls
    its weights come from: a quantized weight's dequantize) as a module of their own, and the real tensors
    that reached them; None where a value crossing into the block is no tensor."""
    import torch

    module = exported.module()
    nodes = list(module.graph.nodes)
    at = [index for index, node in enumerate(nodes) if node.op == "call_function" and _in(node, block)]
    if not at:
        return None
    span = {node for node in nodes[min(at):max(at) + 1] if node.op == "call_function"}
    constant: dict[Any, bool] = {}

    def is_constant(node: Any) -> bool:
        if node not in constant:
            constant[node] = node.op == "get_attr" or (
                node.op == "call_function" and all(is_constant(arg) for arg in node.all_input_nodes))
        return constant[node]

    weights: set[Any] = set()
    pending = list(span)
    while pending:  # a weight's own calls come with it, so that a quantized weight stays a constant
        for arg in pending.pop().all_input_nodes:
            if arg.op == "call_function" and arg not in span and arg not in weights and is_constant(arg):
                weights.add(arg)
                pending.append(arg)
    taken = [node for node in nodes if node in span or node in weights]
    graph = torch.fx.Graph()
    copied: dict[Any, Any] = {}
    crossing: list[Any] = []  # the values the block reads from the rest of the method, as its placeholders

    def value(node: Any) -> Any:
        if node not in copied:
            if node.op == "get_attr":
                copied[node] = graph.get_attr(node.target)
            else:
                copied[node] = graph.placeholder(node.name)
                crossing.append(node)
        return copied[node]

    for node in taken:
        copied[node] = graph.node_copy(node, value)
    results = [node for node in taken if node in span and any(user not in span for user in node.users)]
    graph.output(tuple(copied[node] for node in results))
    block_module = torch.fx.GraphModule(module, graph)
    reached = _values_of(module, inputs, set(crossing))
    if not all(isinstance(reached.get(node), torch.Tensor) for node in crossing):
        return None
    return block_module, tuple(reached[node].detach().clone() for node in crossing)


def departing(adapter: Any, whole: Any, inputs: tuple[Any, ...], threshold: float,
              lowers: bool) -> tuple[dict[str, Any], Block | None]:
    """The first repeated block of the method's program ``whole`` lowered alone and run on the real tensors that
    reached it: where it departs from the block run eagerly beyond its share of the method's ``threshold``, the
    search's program (and the record of what was found either way). A method that does not lower (``lowers``
    false) is stood for by its block only where the block fails to lower too."""
    import torch

    first = first_block(whole)
    if first is None:
        return {"searched": "the method", "reason": "no module list of two blocks or more"}, None
    path, members = first
    try:
        made = block_program(whole, inputs, path)
        if made is None:
            return {"searched": "the method", "block": path, "reason": "a value reaching the block is no tensor"}, None
        module, block_inputs = made
        with torch.no_grad():
            eager = flat(module(*block_inputs))
        start = adapter.lowering_start(module, block_inputs)
    except Exception as failure:  # noqa: BLE001 - a block that will not run or export alone: the method
        return {"searched": "the method", "block": path, "reason": f"the block alone: {culprit.said(failure)}"}, None
    try:
        lowered = adapter.lower_keeping_out(start, frozenset())
        error = max(culprit.rel_l2(a, e) for a, e in zip(flat(adapter.run_lowered(lowered, block_inputs)), eager))
    except Exception as failure:  # noqa: BLE001 - it fails as the method does only where the method did not lower
        if lowers:
            return {"searched": "the method", "block": path,
                    "reason": f"the block alone: {culprit.said(failure)}"}, None
        error = math.inf
    if not lowers and math.isfinite(error):
        return {"searched": "the method", "block": path, "rel_l2": error,
                "reason": "the method does not lower, and the block lowered alone does"}, None
    share = threshold / members
    if not error > share:
        return {"searched": "the method", "block": path, "rel_l2": error, "threshold": share,
                "reason": "the block lowered alone is within its share of the method's threshold"}, None
    return ({"searched": "the block", "block": path, "of": members, "rel_l2": error, "threshold": share},
            Block(path, members, module, block_inputs, eager, share))


def _in(node: Any, block: str) -> bool:
    return any(path == block or str(path).startswith(block + ".")
               for path, _ in (node.meta.get("nn_module_stack") or {}).values())


def _values_of(module: Any, inputs: tuple[Any, ...], wanted: set[Any]) -> dict[Any, Any]:
    """The values ``wanted`` nodes took in one eager run of ``module`` on ``inputs``."""
    import torch

    found: dict[Any, Any] = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, node: Any) -> Any:
            result = super().run_node(node)
            if node in wanted:
                found[node] = result
            return result

    with torch.no_grad():
        Recorder(module).run(*inputs)
    return found
