"""The operators behind a numerics failure, a reproducer for them, and the lowering that avoids them.

An artifact's outputs departed from the same stack's eager outputs. The model is lowered again with
parts of it kept out of the lowering — ExecuTorch: source calls kept out of the XNNPACK delegate (the
portable kernels run them); the adapter says what a part is (``lowering_parts``) and how to keep
parts out (``lower_keeping_out``) — and each lowering's artifact is run on the same real inputs and
compared with eager, the LiteRT culprit finder's approach:

1. Each kind of operator (``aten.gelu.default(approximate='tanh')``) is first checked alone: the op
   on the real tensors that reached its first call, lowered and run as a one-operator program. Kinds
   are then tried in the order of that error, largest first (in a quantized program, the kinds the
   quantizer annotated before the others): every call of the kind kept out of the
   lowering. The first kind whose exclusion brings the artifact within the threshold is the culprit.
2. Its calls are narrowed: a single call that alone brings the artifact within the threshold is the
   culprit by itself; otherwise all calls of the kind are (each call's share of the error is said). A kind
   of more than ``MAX_NARROWED`` calls, one of quantized calls, or one the budget stops narrowing, is the
   culprit as a whole.
3. No single kind is enough: kinds are added in the order of what each took off the error until the
   artifact passes — the smallest set found, said as such; if every part kept out still fails, no
   bisection can pin it, and the report says so.

Every lowering counts against the budget; a search the budget stops says where it stopped and
claims nothing. Runs in the stack's venv (torch only here; the adapter brings the rest).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# A kind with more calls than this is not narrowed a call at a time (a 30-layer LLM has 210 linears).
MAX_NARROWED = 16


class OutOfBudget(Exception):
    """The search's time budget ran out before its answer."""


@dataclass
class Search:
    """One culprit search: the error of a lowering with some parts kept out, and what it cost."""

    error_of: Callable[[frozenset[str]], float]  # keys kept out → worst relative L2 error against eager
    threshold: float
    budget_s: float
    started: float = field(default_factory=time.monotonic)
    tried: list[dict[str, Any]] = field(default_factory=list)

    def error(self, keep_out: Iterable[str], why: str) -> float:
        if time.monotonic() - self.started > self.budget_s:
            raise OutOfBudget(f"stopped at budget ({self.budget_s:g} s) before trying {why}")
        keys = frozenset(keep_out)
        start = time.monotonic()
        tried: dict[str, Any] = {"kept_out": why, "parts": len(keys)}
        try:
            value = self.error_of(keys)
        except Exception as failure:  # noqa: BLE001 - a lowering that does not lower or run passes nothing
            value = math.inf
            tried["error"] = said(failure)
        self.tried.append({**tried, "rel_l2": value, "seconds": round(time.monotonic() - start, 2)})
        return value


def said(failure: Exception) -> str:
    """An exception as a record says it: its type and its message on one line, cut at 300 characters."""
    return f"{type(failure).__name__}: {' '.join(str(failure).split())[:300]}"


def kinds_of(parts: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The lowered parts by kind (an operator with the arguments that matter), in graph order."""
    found: dict[str, list[dict[str, Any]]] = {}
    for part in parts:
        found.setdefault(part["kind"], []).append(part)
    return found


def find(parts: list[dict[str, Any]], search: Search, alone: dict[str, float]) -> dict[str, Any]:
    """The smallest set of parts whose exclusion brings the artifact within the threshold.

    ``alone``: each kind's error as a one-operator program (ranks the kinds; a kind absent was not
    checked alone). Returns the record the report reads: ``status`` one of ``found``, ``combination``,
    ``not pinned``, ``stopped at budget``, ``does not reproduce``."""
    kinds = kinds_of(parts)
    record: dict[str, Any] = {"tried": search.tried, "threshold": search.threshold}
    try:
        whole = search.error((), "nothing (the artifact as lowered)")
        record["rel_l2"] = whole
        if whole <= search.threshold:
            return {**record, "status": "does not reproduce",
                    "reason": f"lowered again, the artifact is within the threshold (rel. L2 {whole:.3g})"}
        # The quantizer's calls first (in a quantized program, the patterns the delegate fuses with their
        # quantization), then by the error alone; stable: graph order among equals.
        order = sorted(kinds, key=lambda kind: (not any(p.get("quantized") for p in kinds[kind]),
                                                -alone.get(kind, 0.0)))
        relief: dict[str, float] = {}
        for kind in order:
            error = search.error({p["key"] for p in kinds[kind]}, f"every {kind}")
            relief[kind] = error
            if error <= search.threshold:
                calls = narrow(kinds[kind], search, whole)
                return {**record, "status": "found", "culprits": [culprit(kind, calls, whole, error, alone)]}
        chosen: list[str] = []
        for kind in sorted(relief, key=lambda k: relief[k]):
            chosen.append(kind)
            keys = {p["key"] for k in chosen for p in kinds[k]}
            error = search.error(keys, " and ".join(f"every {k}" for k in chosen))
            if error <= search.threshold:
                return {**record, "status": "combination",
                        "culprits": [culprit(k, kinds[k], whole, relief[k], alone) for k in chosen],
                        "rel_l2_without": error}
        return {**record, "status": "not pinned",
                "reason": "every lowered operator kept out of the lowering, the artifact still fails: the "
                          "difference is not in what the lowering does to single operators"}
    except OutOfBudget as stop:
        return {**record, "status": "stopped at budget", "reason": str(stop)}


# A method whose search ended without a culprit, yet may be below its gate for the reason another method's search
# found (one lowering of a 30-layer LLM's prefill outlasts its share of the budget; SmolLM2's decode found it).
CARRIED_TO = ("stopped at budget", "not pinned")


def carried_over(found: dict[str, dict[str, Any]], remedied: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Which methods try another method's remedy, and whose: each method whose search ended in ``CARRIED_TO``,
    the first method (in the methods' order) whose chosen remedy passes — its lines act on the whole program
    (every call of a kind kept out, or rewritten), so they apply as written."""
    source = next((method for method in found if (remedied.get(method) or {}).get("passes")), None)
    if source is None:
        return {}
    return {method: source for method, finding in found.items()
            if finding.get("status") in CARRIED_TO and method not in remedied}


def narrow(calls: list[dict[str, Any]], search: Search, whole: float) -> list[dict[str, Any]]:
    """The one call of a kind that is enough kept out on its own, if there is one; else all of them,
    each with the share of the error that keeping it out alone takes off."""
    if len(calls) == 1:
        return calls
    if len(calls) > MAX_NARROWED:  # one call at a time would spend the budget; the kind is the culprit found
        return calls
    # A quantized call kept out alone leaves the dynamic quantization it shares with the others half in the delegate:
    # ExecuTorch 0.7's runtime aborts running that (one linear of a one-layer llama's prefill), taking the search down.
    if any(call.get("quantized") for call in calls):
        return calls
    shares = []
    for call in calls:
        try:
            error = search.error({call["key"]}, f"{call['key']} alone")
        except OutOfBudget:  # the kind is proven; its calls unranked
            return calls
        if error <= search.threshold:
            return [{**call, "share": 1.0}]
        shares.append({**call, "share": taken_off(whole, error)})
    return shares


def taken_off(whole: float, without: float) -> float:
    """The share of the error that a lowering with a part kept out takes off; a lowering that failed (infinite
    error) is all of it taken off by one that runs, none by one that fails too."""
    if math.isinf(whole):
        return 0.0 if math.isinf(without) else 1.0
    return max(0.0, (whole - without) / whole)


def culprit(kind: str, calls: list[dict[str, Any]], whole: float, without: float,
            alone: dict[str, float]) -> dict[str, Any]:
    first = calls[0]
    return {
        "operator": kind,
        "backend": first["backend"],
        "calls": [{key: call[key] for key in ("key", "module", "source", "share") if key in call} for call in calls],
        # How much of the output's error keeping the kind out takes off.
        "share": taken_off(whole, without),
        "rel_l2_without": without,
        "rel_l2_alone": alone.get(kind),
    }


def named(found: dict[str, Any]) -> str:
    """A culprit as the report and the reproducer name it: its operator, and the one the backend fuses it with
    (``aten.mul.Tensor fused with the following aten.relu.default``)."""
    fused = found.get("fused_with")
    return f"{found['operator']} fused with the {fused['position']} {fused['operator']}" if fused else found["operator"]


def capture_node_inputs(exported: Any, inputs: tuple[Any, ...], keys: set[str]) -> dict[str, tuple[Any, ...]]:
    """The real arguments of the first call of each source call in ``keys``: the exported program's
    graph run node by node on the model's own inputs (torch.fx.Interpreter)."""
    import torch

    module = exported.module()
    found: dict[str, tuple[Any, ...]] = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, node: Any) -> Any:
            key = source_key(node)
            if node.op == "call_function" and key in keys and key not in found:
                args, kwargs = self.fetch_args_kwargs_from_env(node)
                found[key] = (node.target, _detached(args), _detached(kwargs))
            return super().run_node(node)

    with torch.no_grad():
        Recorder(module).run(*inputs)
    return found


def fused_neighbours(exported: Any, key: str, delegated: set[str]) -> list[tuple[str, str, str]]:
    """The calls next to ``key``'s in the graph that the lowering delegates with it — where a backend fuses two
    operators, the pair it fuses: ``(position, producer's key, consumer's key)``, the calls that consume its
    result first (an activation fused into the operator before it), then those it consumes. Calls of one graph
    node each (a call decomposed into several is no pair to run alone)."""
    nodes: dict[str, list[Any]] = {}
    for node in exported.graph.nodes:
        if node.op == "call_function":
            nodes.setdefault(source_key(node), []).append(node)
    if len(nodes.get(key, ())) != 1:
        return []
    (node,) = nodes[key]

    def single(other: Any) -> bool:
        name = source_key(other)
        return other.op == "call_function" and name != key and name in delegated and len(nodes[name]) == 1

    return ([("following", key, source_key(user)) for user in node.users if single(user)]
            + [("preceding", source_key(arg), key) for arg in node.all_input_nodes if single(arg)])


def chained_call_code(exported: Any, inputs: tuple[Any, ...], producer: str, consumer: str) -> tuple[str, list[Any]]:
    """Two calls (of one graph node each) as one expression, the producer's in the consumer's argument
    (``torch.ops.aten.relu.default(torch.ops.aten.mul.Tensor(x0, x1))``), and the real tensors that reached
    them, in order."""
    calls = capture_node_inputs(exported, inputs, {producer, consumer})
    nodes = {source_key(n): n for n in exported.graph.nodes if n.op == "call_function"}
    at = next(i for i, arg in enumerate(nodes[consumer].args) if arg is nodes[producer])
    inner, tensors = op_call_code(*calls[producer])
    outer, more = op_call_code(*calls[consumer], given={at: inner}, first=len(tensors))
    return outer, tensors + more


def source_key(node: Any) -> str:
    """The source call a graph node came from (``gelu_1``): the same in the exported and the edge graph,
    and shared by the nodes a decomposition makes of one call."""
    torch_fn = node.meta.get("torch_fn")
    return str(torch_fn[0]) if torch_fn else str(node.name)


def _detached(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        # Contiguous: a program's inputs must be (a transposed weight reaches its matmul as a view).
        return value.detach().contiguous().clone()
    if isinstance(value, (list, tuple)):
        return type(value)(_detached(v) for v in value)
    if isinstance(value, dict):
        return {k: _detached(v) for k, v in value.items()}
    return value


def rel_l2(actual: Any, expected: Any) -> float:
    import torch

    actual, expected = actual.double(), expected.double()
    scale = float(torch.linalg.vector_norm(expected))
    diff = float(torch.linalg.vector_norm(actual - expected))
    return diff / scale if scale else (0.0 if diff == 0 else float("inf"))


def op_call_code(target: Any, args: tuple[Any, ...], kwargs: dict[str, Any], *, given: dict[int, str] | None = None,
                 first: int = 0) -> tuple[str, list[Any]]:
    """``torch.ops.aten.gelu.default(x0, approximate='tanh')`` and the tensors it takes, in order; ``given``: the
    arguments, by position, that are another call's code (a fused pair), ``first``: the first tensor's number."""
    import torch

    tensors: list[Any] = []

    def literal(value: Any) -> str:
        if isinstance(value, torch.Tensor):
            tensors.append(value)
            return f"x{first + len(tensors) - 1}"
        if isinstance(value, (list, tuple)):
            inner = ", ".join(literal(v) for v in value)
            return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
        if isinstance(value, torch.dtype):
            return str(value)
        return repr(value)

    name = str(target)  # "aten.gelu.default"
    pieces = [(given or {}).get(i) or literal(a) for i, a in enumerate(args)]
    pieces += [f"{k}={literal(v)}" for k, v in kwargs.items()]
    return f"torch.ops.{name}({', '.join(pieces)})", tensors


def one_op_module(call: str, arguments: int) -> Any:
    """A module whose forward is ``call`` on its ``arguments`` tensors (``x0``, ``x1``, …): the code a
    reproducer shows is the code that ran."""
    import torch

    names = ", ".join(f"x{i}" for i in range(arguments))
    scope: dict[str, Any] = {"torch": torch}
    exec(f"def forward(self, {names}):\n    return {call}\n", scope)  # noqa: S102 - code op_call_code wrote
    return type("OneOperator", (torch.nn.Module,), {"forward": scope["forward"]})()


def write_reproducer(folder: Path, inputs: tuple[Any, ...], source: str) -> None:
    """A reproducer's ``inputs.pt`` and ``repro.py`` (``source``: compat/reproducers.py wrote it; the adapter saves
    the method beside them)."""
    import torch

    torch.save(tuple(inputs), folder / "inputs.pt")
    (folder / "repro.py").write_text(source, encoding="utf-8")
