"""compat/ as the parent sees it, without importing it (it runs inside the stacks):
which modules are adapters, which code keys every result, and the adapter contract."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
from pathlib import Path

import pytest

from upgrade_gate.layout import REPO_ROOT
from upgrade_gate.specs import NOT_ADAPTERS, WORKER_MODULES

COMPAT = REPO_ROOT / "compat"


def top_level_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.ImportFrom):
            names |= {alias.asname or alias.name for alias in node.names}
    return names


@pytest.fixture(scope="module")
def contract():
    """compat/contract.py: standard library only, so the parent's Python can read it too."""
    spec = importlib.util.spec_from_file_location("contract_under_test", COMPAT / "contract.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_every_compat_module_is_an_adapter_or_named_as_not_one(contract):
    for path in COMPAT.glob("*.py"):
        if path.stem in NOT_ADAPTERS:
            continue
        lacking = set(contract.members(contract.Adapter)) - top_level_names(path)
        assert not lacking, f"{path.name} is neither a whole adapter (lacks {sorted(lacking)}) nor in NOT_ADAPTERS"
    assert set(NOT_ADAPTERS) <= {p.stem for p in COMPAT.glob("*.py")}


def imported_compat_modules(path: Path) -> set[str]:
    """compat/ modules a module imports: relative imports, ``ours("x")`` and ``upgrade_gate_compat.x``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:
                found |= {node.module} if node.module else {alias.name for alias in node.names}
            elif (node.module or "").startswith("upgrade_gate_compat."):
                found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "ours":
            found.add(node.args[0].value)  # type: ignore[attr-defined]
    return found


def test_the_code_that_keys_every_result_is_all_the_code_the_worker_runs():
    """A change to any module the worker imports (transitively, adapters included) must change the key."""
    reached, pending = set(), ["worker", "torchscript_mobile", "executorch_xnnpack"]
    while pending:
        module = pending.pop()
        if module in reached:
            continue
        reached.add(module)
        pending += sorted(imported_compat_modules(COMPAT / f"{module}.py"))
    assert reached - {"torchscript_mobile", "executorch_xnnpack"} <= set(WORKER_MODULES)
    assert "scan" not in WORKER_MODULES  # the scan runs in its own venv, not in a stack


def test_each_adapter_offers_what_the_stacks_do(contract):
    def offered(name: str) -> set[str]:
        names = top_level_names(COMPAT / f"{name}.py")
        return {capability for capability, protocol in contract.CAPABILITIES.items()
                if set(contract.members(protocol)) <= names}

    assert offered("torchscript_mobile") == {"quantize", "profile"}
    assert offered("executorch_xnnpack") == {"quantize", "program", "profile", "backends"}


def test_a_module_missing_part_of_the_contract_is_named(contract):
    import types

    partial = types.ModuleType("partial")
    partial.SUFFIX, partial.load, partial.run = ".x", print, print
    assert contract.missing(partial) == ["lower", "save", "set_threads"]
    assert not isinstance(partial, contract.Adapter) and contract.capabilities(partial) == []


def test_no_worker_file_is_long():
    long = {p.name: n for p in COMPAT.glob("*.py") if (n := len(p.read_text().splitlines())) > 500}
    assert not long, long
