"""compat/scan.py's finder: our rules as a TorchFix-style visitor over libcst's tree (what a rule's names match,
each use found once), and TorchFix's own visitors made to judge a call under each of its qualified names. In the
scan venv only (libcst, TorchFix); scan.py loads it from beside itself."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import libcst as cst
from libcst.metadata import ParentNodeProvider, QualifiedNameProvider, WhitespaceInclusivePositionProvider
from torchfix.common import TorchError, TorchVisitor

CALL_TEXT_LIMIT = 120


@dataclass(frozen=True, kw_only=True, slots=True)
class Rule:
    """One table of migration_rules.toml."""

    code: str
    names: tuple[str, ...]
    kind: str
    imports: bool
    summary: str
    why: str
    replacement: str

    def specificity(self, name: str) -> tuple[int, int] | None:
        """How closely one of the rule's names matches `name` (higher is closer), or None."""
        best: tuple[int, int] | None = None
        for pattern in self.names:
            if pattern.endswith("*"):
                prefix = pattern[:-1]  # "pkg.mod." also matches pkg.mod itself; "pkg._" does not match pkg
                matches = name.startswith(prefix) or (prefix.endswith(".") and name == prefix[:-1])
                score = (0, len(prefix)) if matches else None
            else:
                score = (1, len(pattern)) if name == pattern else None
            if score is not None and (best is None or score > best):
                best = score
        return best


def one_line(node: cst.CSTNode) -> str:
    """The node's source on one line, cut to CALL_TEXT_LIMIT characters."""
    text = " ".join(line.strip() for line in cst.Module([]).code_for_node(node).splitlines()).strip()
    return text if len(text) <= CALL_TEXT_LIMIT else text[: CALL_TEXT_LIMIT - 1] + "…"


def _calls_through_a_call(func: cst.BaseExpression) -> bool:
    """True for `f(a).g`-style callees, whose qualified name libcst would report as `f.g`."""
    while isinstance(func, cst.Attribute):
        func = func.value
    return isinstance(func, cst.Call)


def _chain(node: cst.BaseExpression) -> list[cst.BaseExpression]:
    """`a.b.c`, `a.b`, `a`: the node and the references inside it, outermost first."""
    chain = [node]
    while isinstance(node, cst.Attribute):
        node = node.value
        chain.append(node)
    return chain


@dataclass(frozen=True, kw_only=True, slots=True)
class _Hit:
    line: int
    column: int
    shown: cst.CSTNode  # whose source text the finding shows
    rule: Rule
    name: str


class MigrationVisitor(TorchVisitor):
    """Our rules, as a TorchFix-style visitor (batched with TorchFix's own)."""

    METADATA_DEPENDENCIES = (*TorchVisitor.METADATA_DEPENDENCIES, ParentNodeProvider)
    ERRORS: list[TorchError] = []  # our codes come from the toml, not from TorchError entries

    def __init__(self, rules: Sequence[Rule]) -> None:
        super().__init__()
        self.name_rules = [rule for rule in rules if rule.kind == "name"]
        self.attribute_rules = [rule for rule in rules if rule.kind == "attribute-call"]
        self.import_rules = [rule for rule in self.name_rules if rule.imports]
        self.hits: list[_Hit] = []
        # Every call's qualified names by id(node), to name TorchFix's findings after the visit.
        self.call_names: dict[int, set[str]] = {}
        # References already reported, or part of one that was (by id): the visit goes from a
        # call to its callee and from `a.b.c` to `a.b`, and one use is one finding.
        self.seen_references: set[int] = set()

    @staticmethod
    def _best(rules: Sequence[Rule], names: set[str]) -> tuple[Rule, str] | None:
        # The most specific rule wins, so a node that two rules match is reported once.
        best: tuple[tuple[int, int], int, Rule, str] | None = None
        for order, rule in enumerate(rules):
            for name in sorted(names):
                score = rule.specificity(name)
                if score is not None and (best is None or (score, -order) > (best[0], best[1])):
                    best = (score, -order, rule, name)
        return None if best is None else (best[2], best[3])

    def _qualified_names(self, node: cst.CSTNode) -> set[str]:
        return {qualified.name for qualified in self.get_metadata(QualifiedNameProvider, node, set())}

    def _mark_seen(self, reference: cst.BaseExpression) -> None:
        self.seen_references.update(id(part) for part in _chain(reference))

    def visit_Call(self, node: cst.Call) -> None:
        if not isinstance(node.func, cst.Call):
            self.call_names[id(node)] = self._qualified_names(node)
        if isinstance(node.func, cst.Attribute) and self.attribute_rules:
            match = self._best(self.attribute_rules, {node.func.attr.value})
            if match is not None:
                self._hit(node, node, *match)
                self._mark_seen(node.func)
                return
        if isinstance(node.func, cst.Call) or _calls_through_a_call(node.func):
            return
        match = self._best(self.name_rules, self.call_names[id(node)])
        if match is not None:
            self._hit(node, node, *match)
            self._mark_seen(node.func)

    def visit_Decorator(self, node: cst.Decorator) -> None:
        # `@torch.jit.script` with no parentheses calls it all the same.
        if isinstance(node.decorator, cst.Call) or _calls_through_a_call(node.decorator):
            return
        match = self._best(self.name_rules, self._qualified_names(node.decorator))
        if match is not None:
            self._hit(node.decorator, node, *match)
            self._mark_seen(node.decorator)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._reference(node)

    def visit_Name(self, node: cst.Name) -> None:
        self._reference(node)

    def _reference(self, node: cst.Attribute | cst.Name) -> None:
        """A use that is not a call: `ctx = torch.cuda.amp.autocast`, `partial(autocast, ...)`."""
        if id(node) in self.seen_references:
            return
        chain = _chain(node)
        self._mark_seen(node)
        if not isinstance(chain[-1], cst.Name):
            return  # `f(x).g`, `x[0].g`: libcst's name for them is not what they refer to
        # The outermost part a rule names: `torch.cuda.amp.autocast.__enter__` is autocast's use.
        for part in chain:
            match = self._best(self.name_rules, self._qualified_names(part))
            if match is not None:
                self._hit(node, self._statement(node), *match)
                return

    def _statement(self, node: cst.CSTNode) -> cst.CSTNode:
        """The small statement holding node (`ctx = autocast`), or node itself in a compound one's header."""
        parent: cst.CSTNode | None = node
        while parent is not None and not isinstance(parent, cst.BaseSmallStatement):
            if isinstance(parent, cst.BaseCompoundStatement | cst.Decorator):
                return node
            parent = self.get_metadata(ParentNodeProvider, parent, None)
        return parent or node

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            self._import_hit(node, alias, cst.helpers.get_full_name_for_node(alias.name))

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if node.relative or node.module is None:
            return  # the project's own modules
        module = cst.helpers.get_full_name_for_node(node.module)
        if isinstance(node.names, cst.ImportStar):
            self._import_hit(node, node, module)
            return
        for alias in node.names:
            self._import_hit(node, alias, f"{module}.{cst.helpers.get_full_name_for_node(alias.name)}")

    def _import_hit(self, statement: cst.CSTNode, where: cst.CSTNode, name: str | None) -> None:
        if name is None or not self.import_rules:
            return
        match = self._best(self.import_rules, {name})
        if match is not None:
            self._hit(where, statement, *match)

    def _hit(self, where: cst.CSTNode, shown: cst.CSTNode, rule: Rule, name: str) -> None:
        # Positions as TorchFix's add_violation takes them (metadata is gone after the visit).
        start = self.get_metadata(WhitespaceInclusivePositionProvider, where).start
        self.hits.append(_Hit(line=start.line, column=start.column + 1, shown=shown, rule=rule, name=name))


class EveryQualifiedName:
    """Has a TorchFix visitor judge a call under each of its qualified names, sorted. libcst names `vmap(f)` both
    torch.vmap and functorch.vmap after `try: from torch import vmap / except ImportError: from functorch …`,
    as a set; TorchFix 0.7 judged only the first in set order, so its TOR101 came and went with
    PYTHONHASHSEED (issue 26). Elsewhere (misc's BinaryOperation check) the first name sorted is used."""

    def __init__(self, visitor: TorchVisitor) -> None:
        self.visitor = visitor
        self.forced: dict[int, str] = {}  # id(call) → the name it is judged under
        self.names_of: dict[int, str] = {}  # id(violation) → the name it was found under (the finding's name)
        # libcst's batched visit collects bound methods with inspect.getmembers: instance attributes count.
        visitor.get_qualified_name_for_call = self.get_qualified_name_for_call
        self.original_visit_call: Any = getattr(type(visitor), "visit_Call", None)
        if self.original_visit_call is not None:
            visitor.visit_Call = self.visit_Call

    def names(self, node: cst.Call) -> list[str]:
        if isinstance(node.func, cst.Call):
            return []  # `vmap(a)(b)`: the outer call's names are the inner's (TorchFix's own guard)
        return sorted({q.name for q in self.visitor.get_metadata(QualifiedNameProvider, node, set())})

    def get_qualified_name_for_call(self, node: cst.Call) -> str | None:
        return self.forced.get(id(node)) or next(iter(self.names(node)), None)

    def visit_Call(self, node: cst.Call) -> None:
        for name in self.names(node) or [""]:
            before, self.forced[id(node)] = len(self.visitor.violations), name
            try:
                self.original_visit_call(self.visitor, node)
            finally:
                del self.forced[id(node)]
            self.names_of.update((id(v), name) for v in self.visitor.violations[before:] if name)


def torchfix_name(node: cst.CSTNode, call_names: dict[int, set[str]]) -> str:
    if isinstance(node, cst.Call):
        names = sorted(call_names.get(id(node), ()))
        return names[0] if names else cst.helpers.get_full_name_for_node(node.func) or ""
    if isinstance(node, cst.ImportFrom) and node.module is not None:
        return cst.helpers.get_full_name_for_node(node.module) or ""
    return cst.helpers.get_full_name_for_node(node) or ""
