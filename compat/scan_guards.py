"""compat/scan.py's set-asides: findings the candidate never meets, each with why (issue 63; the guards read and
why ``hasattr`` is not: docs/compat.md, "What the scan reads"). In the scan venv only (libcst); scan.py loads it
from beside itself."""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Sequence
from typing import Any

import libcst as cst
from libcst.metadata import PositionProvider

# A flag named for the release it requires: TORCH_2_4, TORCH_1_13, TORCH_2_0_1 (true from that release on).
VERSION_FLAG = re.compile(r"TORCH_(\d+)_(\d+)(?:_(\d+))?")
# What names torch's version in a comparison: torch.__version__ itself, or a module's copy of it (TORCH_VERSION).
VERSION_NAME = re.compile(r"\btorch\.__version__\b|\bTORCH_VERSION\b")
COMPARE: dict[type[cst.BaseCompOp], Callable[[Any, Any], bool]] = {
    cst.GreaterThanEqual: operator.ge, cst.GreaterThan: operator.gt, cst.LessThanEqual: operator.le,
    cst.LessThan: operator.lt, cst.Equal: operator.eq, cst.NotEqual: operator.ne}
TOR102 = "TOR102"  # TorchFix: torch.load without weights_only


def release(text: str) -> tuple[int, ...] | None:
    """``"2.8.0+cu128"`` → (2, 8, 0), padded to three parts so that "2.4" equals "2.4.0"; None if not a release."""
    found = re.match(r"\s*(\d+(?:\.\d+)*)", text)
    if found is None:
        return None
    parts = tuple(int(p) for p in found.group(1).split("."))
    return (parts + (0, 0, 0))[:max(3, len(parts))]


def _code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def _literal_release(node: cst.BaseExpression) -> tuple[int, ...] | None:
    """"2.4", ``version.parse("2.4.0")``, ``(2, 4)``: the release a comparison's other side names."""
    if isinstance(node, cst.Call) and node.args:
        node = node.args[0].value
    if isinstance(node, cst.SimpleString):
        return release(str(node.evaluated_value))
    if isinstance(node, cst.Tuple) and all(isinstance(e.value, cst.Integer) for e in node.elements):
        return release(".".join(_code(e.value) for e in node.elements))
    return None


def guard_holds(test: cst.BaseExpression, torch: tuple[int, ...]) -> bool | None:
    """Whether ``test`` is true on ``torch``, where it is a version guard read without running it; else None."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        inner = guard_holds(test.expression, torch)
        return None if inner is None else not inner
    if isinstance(test, cst.BooleanOperation):
        left, right = guard_holds(test.left, torch), guard_holds(test.right, torch)
        if isinstance(test.operator, cst.And):
            return False if False in (left, right) else None if None in (left, right) else True
        return True if True in (left, right) else None if None in (left, right) else False
    if isinstance(test, cst.Name | cst.Attribute):
        name = test.value if isinstance(test, cst.Name) else test.attr.value
        flag = VERSION_FLAG.fullmatch(name)
        return torch >= release(".".join(p for p in flag.groups() if p)) if flag else None  # type: ignore[operator]
    compared = isinstance(test, cst.Comparison) and len(test.comparisons) == 1 and COMPARE.get(
        type(test.comparisons[0].operator))
    if not isinstance(test, cst.Comparison) or not compared:
        return None
    subject, other_side = test.left, test.comparisons[0].comparator
    if VERSION_NAME.search(_code(subject)) and (other := _literal_release(other_side)) is not None:
        return compared(torch, other)
    if VERSION_NAME.search(_code(other_side)) and (other := _literal_release(subject)) is not None:
        return compared(other, torch)
    return None


class SetAsides(cst.BatchableCSTVisitor):
    """The lines each version guard keeps from every one of the candidates' torch releases, and the functions that
    set ``weights_only`` in a ``**kwargs`` mapping they pass on."""

    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, torch_versions: Sequence[str]) -> None:
        super().__init__()
        self.torch = [v for text in torch_versions if (v := release(text)) is not None]
        self.unreached: list[tuple[int, int, str]] = []  # (first line, last line, why)
        self.functions: list[int] = [0]  # the enclosing functions, by id; 0: the module
        self.weights_only_set: dict[tuple[int, str], int] = {}  # (function, mapping's name) → first line it is set
        self.kwargs_of: dict[int, tuple[str, ...]] = {}  # id(call) → the mappings it passes with ** (if any)
        self.call_function: dict[int, int] = {}  # id(call) → its function, for those calls

    def _line(self, node: cst.CSTNode) -> int:
        return self.get_metadata(PositionProvider, node).start.line

    def visit_If(self, node: cst.If) -> None:
        outcomes = {guard_holds(node.test, torch) for torch in self.torch}
        if len(outcomes) != 1 or None in outcomes:
            return  # not a guard, or one the candidates' releases do not agree on
        holds = outcomes.pop()
        skipped = node.orelse if holds else node.body
        if skipped is not None:
            where = self.get_metadata(PositionProvider, skipped)
            releases = ", ".join(".".join(map(str, t)) for t in self.torch)
            self.unreached.append((where.start.line, where.end.line,
                                   f"`{_code(node.test)}` is {holds} on the candidate's torch {releases}: "
                                   "this branch never runs there"))

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.functions.append(id(node))

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.functions.pop()

    def _sets(self, name: cst.BaseExpression, node: cst.CSTNode) -> None:
        if isinstance(name, cst.Name):
            self.weights_only_set.setdefault((self.functions[-1], name.value), self._line(node))

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            aim = target.target
            if isinstance(aim, cst.Subscript) and "weights_only" in _code(aim.slice[0]):  # kw["weights_only"] = …
                self._sets(aim.value, node)
            elif "weights_only" in _code(node.value):  # kw = {"weights_only": …} / dict(weights_only=…)
                self._sets(aim, node)

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func  # kw.setdefault("weights_only", …), kw.update(weights_only=…)
        if (isinstance(func, cst.Attribute) and func.attr.value in ("setdefault", "update")
                and "weights_only" in " ".join(_code(arg) for arg in node.args)):
            self._sets(func.value, node)
        mappings = tuple("weights_only" if isinstance(arg.value, cst.Dict | cst.Call) and "weights_only" in
                         _code(arg.value) else _code(arg.value) for arg in node.args if arg.star == "**")
        if mappings:  # only a call that passes a mapping with ** can be given weights_only through it
            self.call_function[id(node)], self.kwargs_of[id(node)] = self.functions[-1], mappings

    def why_set_aside(self, code: str, line: int, node: cst.CSTNode | None) -> str | None:
        """Why a finding of ``code`` at ``line`` (``node``: the call TorchFix flagged) is set aside, or None."""
        for first, last, why in self.unreached:
            if first <= line <= last:
                return why
        if code != TOR102 or node is None or id(node) not in self.kwargs_of:
            return None
        for mapping in self.kwargs_of[id(node)]:
            if mapping == "weights_only":
                return "weights_only is passed in the ** mapping"
            set_at = self.weights_only_set.get((self.call_function[id(node)], mapping))
            if set_at is not None and set_at <= line:
                return f"weights_only is set in {mapping} at line {set_at}, before the call"
        return None
