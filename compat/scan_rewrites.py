"""The scan's rewrites (compat/scan.py): a file's source with the calls it found written for the candidate stack —
TorchFix's own fixes where it renders one, and ours for the Lite Interpreter deploy path, whose four calls become
the ExecuTorch export and runtime (``torch.jit.trace`` → ``torch.export.export``, ``optimize_for_mobile`` →
``to_edge_transform_and_lower`` with XNNPACK, ``_save_for_lite_interpreter`` → the program's bytes written,
``_load_for_lite_interpreter`` → a program loaded by ExecuTorch's runtime, called as the Lite Interpreter's
module was).

A rewrite is only written where the call's arguments say all it needs: a trace with options the export has no
counterpart for, or example inputs that are neither a tuple nor a name, is left as found (its finding keeps its
hint). ``upgrade_gate.migrate`` turns the rewritten sources into ``migrate/project.diff``; nothing here writes
a file of the team's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor, RemoveImportsVisitor

# (module, name or None for `import module`)
Import = tuple[str, str | None]

# The loader keeps the Lite Interpreter's calling convention (module(*inputs) → the output, or a tuple of them),
# which ExecuTorch's Method.execute (a list in, a list out) does not: the app's callers stay as they are.
LOADER_CLASS = "_ExecuTorchModule"
LOADER_SOURCE = f'''

class {LOADER_CLASS}:
    """A .pte's methods, called as the Lite Interpreter's module's were (written by upgrade-gate migrate)."""

    def __init__(self, path):
        self._program = Runtime.get().load_program(str(path))
        self._methods = {{}}

    def run_method(self, name, *inputs):
        if name not in self._methods:
            self._methods[name] = self._program.load_method(name)
        outputs = self._methods[name].execute(list(inputs))
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def forward(self, *inputs):
        return self.run_method("forward", *inputs)

    __call__ = forward
'''
LOADER_IMPORTS: tuple[Import, ...] = (("executorch.runtime", "Runtime"),)


@dataclass(frozen=True, kw_only=True, slots=True)
class Rewritten:
    """One call written for the candidate: its new source and the imports it needs."""

    code: str
    imports: tuple[Import, ...] = ()
    loader: bool = False  # needs LOADER_CLASS in the file


def _code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def _bound(call: cst.Call, names: Sequence[str]) -> list[str] | None:
    """The call's arguments as source, in the order of ``names`` (positional, then by keyword); None where it has
    another argument, a ``*``/``**`` one, or lacks one."""
    bound: dict[str, str] = {}
    for position, arg in enumerate(call.args):
        if arg.star:
            return None
        name = arg.keyword.value if arg.keyword is not None else (names[position] if position < len(names) else "")
        if name not in names or name in bound:
            return None
        bound[name] = _code(arg.value)
    return [bound[name] for name in names] if len(bound) == len(names) else None


def _trace(call: cst.Call) -> Rewritten | None:
    args = _bound(call, ("func", "example_inputs"))
    if args is None:
        return None
    model, example = args
    inputs = call.args[1].value
    if isinstance(inputs, cst.Tuple):
        given = example
    elif isinstance(inputs, cst.Name):  # trace takes a tensor or a tuple; export, a tuple
        given = f"({example},) if isinstance({example}, torch.Tensor) else tuple({example})"
    else:
        return None
    return Rewritten(code=f"torch.export.export({model}, {given})", imports=(("torch", None),))


def _lower(call: cst.Call) -> Rewritten | None:
    args = _bound(call, ("script_module",))
    if args is None:
        return None
    return Rewritten(code=f"to_edge_transform_and_lower({args[0]}, partitioner=[XnnpackPartitioner()]).to_executorch()",
                     imports=(("executorch.exir", "to_edge_transform_and_lower"),
                              ("executorch.backends.xnnpack.partition.xnnpack_partitioner", "XnnpackPartitioner")))


def _save(call: cst.Call) -> Rewritten | None:
    args = _bound(call, ("f",))
    if args is None or not isinstance(call.func, cst.Attribute):
        return None
    return Rewritten(code=f"pathlib.Path({args[0]}).write_bytes({_code(call.func.value)}.buffer)",
                     imports=(("pathlib", None),))


def _load(call: cst.Call) -> Rewritten | None:
    args = _bound(call, ("f",))
    if args is None:
        return None
    return Rewritten(code=f"{LOADER_CLASS}({args[0]})", imports=LOADER_IMPORTS, loader=True)


# By the name the finding matched (compat/migration_rules.toml's): the rules with a rewrite.
REWRITES: dict[str, Callable[[cst.Call], Rewritten | None]] = {
    "torch.jit.trace": _trace,
    "torch.utils.mobile_optimizer.optimize_for_mobile": _lower,
    "_save_for_lite_interpreter": _save,
    "torch.jit.mobile._load_for_lite_interpreter": _load,
}
# The imports a rewrite leaves unused, removed where nothing else uses them.
REPLACED_IMPORTS: tuple[Import, ...] = (("torch.utils.mobile_optimizer", "optimize_for_mobile"),
                                        ("torch.jit.mobile", "_load_for_lite_interpreter"))


def has_rewrite(name: str) -> bool:
    return name in REWRITES


class _Rewriter(cst.CSTTransformer):
    """Replaces the found calls, innermost first, so that a call inside another's arguments is written as its
    rewrite (`optimize_for_mobile(torch.jit.trace(m, x))`)."""

    def __init__(self, ours: dict[int, str], theirs: dict[int, cst.CSTNode]) -> None:
        super().__init__()
        self.ours, self.theirs = ours, theirs
        self.done: set[int] = set()
        self.imports: list[Import] = []
        self.loader = False

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode) -> cst.CSTNode:  # type: ignore[override]
        key = id(original_node)
        if key in self.theirs:
            self.done.add(key)
            return self.theirs[key]
        if key in self.ours and isinstance(updated_node, cst.Call):
            written = REWRITES[self.ours[key]](updated_node)
            if written is not None:
                self.done.add(key)
                self.imports += written.imports
                self.loader |= written.loader
                return cst.parse_expression(written.code)
        return updated_node


def rewrite(module: cst.Module, ours: dict[int, str], theirs: dict[int, cst.CSTNode],
            theirs_imports: Sequence[Import] = ()) -> tuple[str, set[int]]:
    """``module``'s source with the calls written for the candidate: ``ours`` (id of a found call → the name its
    rule matched) and ``theirs`` (id of a TorchFix finding's node → TorchFix's replacement); and the ids of those
    it rewrote (the same source and none where it rewrote nothing)."""
    rewriter = _Rewriter(ours, theirs)
    changed = module.visit(rewriter)
    if not rewriter.done:
        return module.code, set()
    if rewriter.loader:
        changed = _with_loader(changed)
    context = CodemodContext()
    for module_name, name in [*rewriter.imports, *theirs_imports]:
        AddImportsVisitor.add_needed_import(context, module_name, name)
    for module_name, name in REPLACED_IMPORTS:
        RemoveImportsVisitor.remove_unused_import(context, module_name, name)
    changed = AddImportsVisitor(context).transform_module(changed)
    changed = RemoveImportsVisitor(context).transform_module(changed)
    return changed.code, rewriter.done


def _with_loader(module: cst.Module) -> cst.Module:
    """The loader class after the module's leading imports (before its first other statement)."""
    body = list(module.body)
    at = 0
    for index, statement in enumerate(body):
        if isinstance(statement, cst.SimpleStatementLine) and any(
                isinstance(small, cst.Import | cst.ImportFrom) for small in statement.body):
            at = index + 1
        elif index > at:
            break
    first, *rest = cst.parse_module(LOADER_SOURCE).body
    first = first.with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
    return module.with_changes(body=[*body[:at], first, *rest, *body[at:]])
