"""Where an export breaks: the smallest submodules that fail to export on their own.

Like ai-edge-torch's culprit finder. The model runs once eagerly with forward
hooks that keep each submodule's real inputs (its first call); then each child
of a failing module is exported alone with those inputs, through the stack's
own ``lower``, and the search descends into the children that fail. A failing
module none of whose children fails alone is a culprit: the failure is in its
own code (or in how its children are put together). A module without inputs of
its own (a ModuleList) is looked through. Siblings of one class failing with
one error are searched once. The search stops at its time budget and says so.
What each error says (and the user's line behind FX-generated code) is read by
``export_errors.py``.

Runs in any stack: torch only, no API newer than torch 2.2.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree as pytree

from .export_errors import StackTraces, describe_error, source_line, with_causes


class _Bound(torch.nn.Module):
    """A submodule called with the tensors of one real call; everything else
    (ints, flags, None) is fixed as it was, so any exporter can take it."""

    def __init__(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        super().__init__()
        self.inner = module
        # The tensors' places are kept, not marked with None: `mask=None` is an argument too.
        leaves, self._spec = pytree.tree_flatten((args, kwargs))
        self._tensor_slots = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
        self._leaves = [None if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
        self.inputs = tuple(leaves[i].detach().clone() for i in self._tensor_slots)

    def forward(self, *tensors: torch.Tensor) -> Any:
        return self.call_with(tensors)

    def call_with(self, tensors: tuple[torch.Tensor, ...]) -> Any:
        args, kwargs = self.arguments(tensors)
        return self.inner(*args, **kwargs)

    def arguments(self, tensors: tuple[torch.Tensor, ...]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The call's positional and keyword arguments, ``tensors`` in the tensors' places."""
        leaves = list(self._leaves)
        for slot, tensor in zip(self._tensor_slots, tensors):
            leaves[slot] = tensor
        return pytree.tree_unflatten(leaves, self._spec)


def bound(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Bound:
    """A submodule bound to one real call, its forward taking its tensors by name (``input_0`` …): FX's symbolic
    tracing (the legacy stack's quantization) cannot iterate a ``*tensors`` argument; torch.export takes either."""
    count = sum(isinstance(leaf, torch.Tensor) for leaf in pytree.tree_flatten((args, kwargs))[0])
    names = ", ".join(f"input_{i}" for i in range(count))
    scope: dict[str, Any] = {}
    exec(f"def forward(self, {names}):\n    return self.call_with(({names}{',' if count == 1 else ''}))", scope)  # noqa: S102
    return type(f"_Bound{count}", (_Bound,), {"forward": scope["forward"]})(module, args, kwargs)


def capture_calls(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> dict[str, _Bound]:
    """Each submodule's first call in one eager run of ``module``, by path."""
    calls: dict[str, _Bound] = {}
    paths = {id(m): path for path, m in module.named_modules() if path}
    handles = []

    def keep(submodule: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        path = paths.get(id(submodule))
        if path is not None and path not in calls:
            calls[path] = bound(submodule, args, kwargs)

    for submodule in module.modules():
        if submodule is not module:
            handles.append(submodule.register_forward_pre_hook(keep, with_kwargs=True))
    try:
        with torch.no_grad():
            module(*inputs)
    finally:
        for handle in handles:
            handle.remove()
    return calls


def fx_stack_traces(module: torch.nn.Module) -> StackTraces:
    """Each FX GraphModule's generated forward in ``module``: its file name → line → the stack
    trace its node recorded (the user's code that made it), mapped as torch.fx maps them."""
    found: StackTraces = {}
    for graph_module in module.modules():
        if not isinstance(graph_module, torch.fx.GraphModule):
            continue
        code = type(graph_module).forward.__code__
        nodes = list(graph_module.graph.nodes)
        lines = getattr(graph_module, "_lineno_map", None) or {}  # line - first line → node index
        found[code.co_filename] = {code.co_firstlineno + offset: nodes[index].meta.get("stack_trace") or ""
                                   for offset, index in lines.items() if index is not None}
    return found


def children_that_ran(parent: torch.nn.Module, prefix: str, calls: dict[str, Any]) -> list[tuple[str, torch.nn.Module]]:
    """``parent``'s children that ran (their paths in ``calls``); a container that did not run itself
    (ModuleList) is looked through."""
    found = []
    for name, child in parent.named_children():
        path = f"{prefix}.{name}" if prefix else name
        if path in calls:
            found.append((path, child))
        else:
            found += children_that_ran(child, path, calls)
    return found


def localize(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...],
             lower: Callable[[torch.nn.Module, tuple[torch.Tensor, ...]], Any], *, error: dict[str, Any],
             budget_s: float, no_grad: bool = True) -> dict[str, Any]:
    """The culprits of ``module``'s failing export (``error``: its type and message), found within ``budget_s``.
    Each submodule is tried in the grad mode the failing stage ran in (``no_grad``: the export stage's; a recipe
    captures with grad on): tried under no_grad, Llama's rotary embedding quantized alone, its own
    ``@torch.no_grad()`` then no region of the capture, and the search named no submodule."""
    start = time.monotonic()
    calls = capture_calls(module, inputs)
    attempts: list[dict[str, Any]] = []
    culprits: list[dict[str, Any]] = []
    out_of_time = False

    def attempt(path: str) -> dict[str, Any] | None:
        bound = calls[path]
        began = time.monotonic()
        try:
            with torch.set_grad_enabled(not no_grad):
                lower(bound, bound.inputs)
            error = None
        except Exception as raised:  # noqa: BLE001 - every failure is evidence
            # FX's file names are read now: a graph recompiled since would have another.
            error = describe_error(f"{type(raised).__module__}.{type(raised).__qualname__}", with_causes(raised),
                                   fx_stack_traces(module))
        attempts.append({"module": path, "ok": error is None, "seconds": round(time.monotonic() - began, 3)})
        return error

    def search(parent: torch.nn.Module, prefix: str, error: dict[str, Any]) -> None:
        nonlocal out_of_time
        failing: list[tuple[str, torch.nn.Module, dict[str, Any]]] = []
        searched: dict[tuple[str, str], dict[str, Any]] = {}  # (class, error type) → first such failure
        for path, child in children_that_ran(parent, prefix, calls):
            if time.monotonic() - start > budget_s:
                out_of_time = True
                break
            child_error = attempt(path)
            if child_error is None:
                continue
            kind = (type(child).__name__, child_error["type"])
            if kind in searched:
                searched[kind].setdefault("same_failure_in", []).append(path)
                continue
            searched[kind] = child_error
            failing.append((path, child, child_error))
        if not failing:
            culprits.append({"module": prefix or "(root)", "class": type(parent).__name__, **error})
            return
        for path, child, child_error in failing:
            search(child, path, child_error)

    search(module, "", describe_error(error["type"], error["message"], fx_stack_traces(module)))
    return {
        "culprits": culprits,
        "attempts": len(attempts),
        "tried": attempts,
        "seconds": round(time.monotonic() - start, 3),
        "complete": not out_of_time,
        "budget_s": budget_s,
    }


def weights_not_taken(module: torch.nn.Module, listed: int = 5) -> dict[str, Any]:
    """Where a recipe quantized nothing: the classes of the modules that hold ``module``'s weights, the most first,
    each with its first module (the recipe took none of them; GPT-2's Conv1D is not an nn.Linear)."""
    start = time.monotonic()
    held: dict[type, list[tuple[str, int]]] = {}
    for path, submodule in module.named_modules():
        own = sum(p.numel() for p in submodule.parameters(recurse=False))
        if own:
            held.setdefault(type(submodule), []).append((path or "(root)", own))
    total = sum(n for modules in held.values() for _, n in modules) or 1
    culprits = []
    for kind, modules in sorted(held.items(), key=lambda item: -sum(n for _, n in item[1])):
        share = sum(n for _, n in modules) / total
        if share < 0.01:
            break
        paths = [path for path, _ in modules]
        culprits.append({"module": paths[0], "class": kind.__name__, "type": "not quantized",
                         "message": f"{len(paths)} {kind.__module__}.{kind.__qualname__} module(s) hold {share:.0%} "
                                    "of the weights; the recipe quantized none of them",
                         "same_failure_in": paths[1:listed]})
    return {"culprits": culprits, "attempts": 0, "tried": [], "seconds": round(time.monotonic() - start, 3),
            "complete": True, "budget_s": 0.0}


def name_nested_regions(culprits: list[dict[str, Any]], module: torch.nn.Module,
                        inputs: tuple[torch.Tensor, ...]) -> None:
    """A culprit whose own code sets torch's grad or autocast mode for a region inside another (Llama's rotary
    embedding: autocast off under no_grad) gets the regions as its operator, outermost first, and the first user line
    inside the innermost as its source, where its error named neither. The capture PT2E quantizes (torch ≥ 2.5's
    export_for_training, grad on, as the recipe captures) makes each region a higher-order submodule, and PT2E's
    convert loses the inner one of two nested: the message says only that a node names a missing submod_N."""
    # torch.export.export captures the same graph from 2.10, which removed export_for_training; before 2.5 (the
    # legacy stack's 2.2) no region is captured as a submodule.
    capture = getattr(torch.export, "export_for_training", None) or (
        torch.export.export if hasattr(torch.ops.higher_order, "wrap_with_autocast") else None)
    if capture is None:
        return
    calls = capture_calls(module, inputs)
    for found in culprits:
        bound = calls.get(found["module"])  # none for "(root)": the method itself
        target, arguments = (bound, bound.inputs) if bound is not None else (module, inputs)
        try:
            nested = _nested(capture(target, arguments).graph_module, [])
        except Exception:  # noqa: BLE001 - a module the capture takes no further names nothing more
            continue
        if nested:
            regions, graph_module = nested
            found.setdefault("operator", " › ".join(f"higher_order.{region}" for region in regions))
            traces = (node.meta.get("stack_trace") or "" for node in graph_module.graph.nodes)
            source = next((line for trace in traces if (line := source_line(trace, {}))), None)
            if source and "source" not in found:
                found["source"] = source


def _nested(graph_module: torch.fx.GraphModule, outer: list[str]) -> tuple[list[str], Any] | None:
    """The first region (a higher-order operator calling a submodule) inside another: the regions' names, outermost
    first, and the innermost's graph."""
    for node in graph_module.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.HigherOrderOperator):
            continue
        for argument in node.args:
            if isinstance(argument, torch.fx.Node) and argument.op == "get_attr":
                inner = getattr(graph_module, str(argument.target))
                regions = [*outer, node.target.__name__]
                if len(regions) > 1:
                    return regions, inner
                if isinstance(inner, torch.fx.GraphModule) and (found := _nested(inner, regions)):
                    return found
    return None
